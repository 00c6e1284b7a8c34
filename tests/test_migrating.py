"""docs/migrating.md names every flag, env var and chart key of NVIDIA's components, and says true
things about each.

NVIDIA's names come from NVIDIA's sources: tests/data/nvidia/*.txt (nvidia-device-plugin,
config-manager, mps-control-daemon, the DRA driver's gpu-kubelet-plugin; each file names its source),
the GFD table of tests/test_gfd_nvidia_flags.py and the chart keys of tests/test_chart_nvidia_keys.py.
Each of NVIDIA's names has a row in its command's table, and no row names anything else. A row's
last cell starts with what nvdp does: `same` or `accepted` (the command's real parser takes each flag
and its option table reads each env var, a flag and its env vars being one option), `not accepted`
(neither), for chart keys `refused` (the render fails naming the key; else it succeeds). A row whose
cell carries a `TODO lead` marker waits on work in flight: named, not yet checked.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from nvdp.config.options import Option, read_options
from nvdp.node.health.xid import DISABLE_ENV, ENABLE_ENV, XidPolicy
from testkit import REPO
from tests import test_deploy as deploy
from tests.test_chart_nvidia_keys import CHANGES, merged, nested, outcome
from tests.test_command_options import COMMANDS, parsers
from tests.test_deploy import Renderer
from tests.test_gfd_nvidia_flags import NVIDIA_GFD_FLAGS
from tests.test_readme import heading_anchor

renderer = deploy.renderer  # the chart fixture, shared with tests/test_deploy.py

DOC = REPO / "docs" / "migrating.md"
README = REPO / "README.md"
DATA = REPO / "tests" / "data" / "nvidia"

# NVIDIA's command -> nvdp's command (a key of tests/test_command_options.COMMANDS)
NVDP_COMMAND = {
    "nvidia-device-plugin": "plugin",
    "gpu-feature-discovery": "gfd",
    "config-manager": "config-manager",
    "mps-control-daemon": "mps-control-daemon",
    "gpu-kubelet-plugin": "dra-kubelet-plugin",
}
# tests/test_gfd_nvidia_flags.py tests it beside NVIDIA's, but NVIDIA's v0.20.0 GFD has no such flag
# (cmd/gpu-feature-discovery/main.go and internal/flags declare none): nvdp's own.
NOT_NVIDIAS_GFD = {"--resource-name-prefix"}


def _read_by_health_policy(env: str) -> bool:
    """Whether the XID policy (the plugin's health monitor) changes with `env` set."""
    return XidPolicy.from_env({env: "all"}) != XidPolicy.from_env({})


# env vars a command reads outside its option table, with the check that it reads them
READ_ELSEWHERE: dict[str, dict[str, Callable[[str], bool]]] = {
    "nvidia-device-plugin": {DISABLE_ENV: _read_by_health_policy, ENABLE_ENV: _read_by_health_policy},
}


@dataclass(frozen=True)
class NvidiaNames:
    """One of NVIDIA's flags (its name, then aliases), its env vars; or a subcommand, or an env var alone."""

    names: tuple[str, ...]
    envs: tuple[str, ...]


def nvidia_flags(command: str) -> list[NvidiaNames]:
    if command == "gpu-feature-discovery":
        return [NvidiaNames(f.names, f.envs) for f in NVIDIA_GFD_FLAGS if f.names[0] not in NOT_NVIDIAS_GFD]
    flags = []
    for line in (DATA / f"{command}.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            words = line.split()
            envs = tuple(w[1:] for w in words if w.startswith("$"))
            flags.append(NvidiaNames(tuple(w for w in words if not w.startswith("$")), envs))
    return flags


@dataclass(frozen=True)
class Row:
    names: tuple[str, ...]  # flags (or a subcommand) and env vars, or one chart key
    status: str  # same | accepted | not accepted | refused | pending
    text: str

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if not _is_env(n))

    @property
    def envs(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if _is_env(n))


def _is_env(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_]*", name))


STATUSES = ("not accepted", "accepted", "same", "refused")


def _row_status(cell: str) -> str:
    if "TODO lead" in cell:
        return "pending"
    for status in STATUSES:
        if cell.startswith(status):
            return status
    raise AssertionError(f"{DOC.name}: a row's last cell starts with one of {STATUSES}: {cell!r}")


def tables(text: str) -> dict[str, list[Row]]:
    """The rows of each `<!-- names: X -->` table."""
    found: dict[str, list[Row]] = {}
    for match in re.finditer(r"^<!-- names: (\S+) -->\n((?:\|.*\n)+)", text, re.MULTILINE):
        rows = []
        for line in match.group(2).splitlines()[2:]:  # past the header and its rule
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            names = tuple(n for cell in cells[:-1] for n in re.findall(r"`([^`]+)`", cell))
            rows.append(Row(names, _row_status(cells[-1]), line))
        found[match.group(1)] = rows
    return found


ROWS = tables(DOC.read_text())


def test_each_command_and_the_chart_has_a_table() -> None:
    assert set(ROWS) == {*NVDP_COMMAND, "chart"}


@pytest.mark.parametrize("command", [c for c in NVDP_COMMAND if c != "gpu-feature-discovery"])
def test_data_names_its_source(command: str) -> None:
    header = "\n".join(line for line in (DATA / f"{command}.txt").read_text().splitlines() if line[:1] == "#")
    assert re.search(r"^# Source: repository NVIDIA/\S+, (tag v0\.20\.0|HEAD)", header, re.MULTILINE)
    assert re.search(r"\(commit [0-9a-f]{40}", header)


@pytest.mark.parametrize("command", list(NVDP_COMMAND))
def test_every_nvidia_name_has_a_row_and_no_row_names_another(command: str) -> None:
    flags = nvidia_flags(command)
    rows = ROWS[command]
    listed = [name for row in rows for name in row.names]
    assert len(listed) == len(set(listed)), f"a name in two rows: {listed}"
    nvidias = [name for flag in flags for name in (*flag.names, *flag.envs)]
    assert sorted(listed) == sorted(nvidias)
    for row in rows:  # a row does not pair names of two of NVIDIA's flags
        assert any(set(row.names) <= {*f.names, *f.envs} for f in flags), row.text


def test_every_nvidia_chart_key_has_a_row() -> None:
    keys = [name for row in ROWS["chart"] for name in row.names]
    assert sorted(keys) == sorted(CHANGES)


def _command_rows() -> list[tuple[str, Row]]:
    return [(c, row) for c in NVDP_COMMAND for row in ROWS.get(c, [])]


def _row_id(value: object) -> str:
    return value.names[0] if isinstance(value, Row) else str(value)


def _options(command: str) -> tuple[Option, ...]:
    options: tuple[Option, ...] = COMMANDS[NVDP_COMMAND[command]][0]
    return options


def _taken_flag(parser: argparse.ArgumentParser, flag: str) -> str | None:
    """The dest the real parser stores `flag`'s value in; None when it does not take the flag."""
    action = parser._option_string_actions.get(flag)
    if action is None or isinstance(action, argparse._VersionAction | argparse._HelpAction):
        return None
    args, extra = parser.parse_known_args([flag, "1"])
    assert not extra and getattr(args, action.dest) is not None, f"{flag}: parsed, not stored"
    return action.dest


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    return {name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices}


def _env_option(options: tuple[Option, ...], env: str) -> Option | None:
    """The option that reads `env`, proved by reading it: its value set, or a problem naming the env."""
    owners = [o for o in options if env in o.envs]
    assert len(owners) <= 1, f"{env} read by {len(owners)} options"
    if not owners:
        return None
    option = owners[0]
    found, problems = read_options([option], argparse.Namespace(), {env: "1"})
    assert option.field in found or any(env in p for p in problems), f"{env}: not read"
    return option


@pytest.mark.parametrize(("command", "row"), _command_rows(), ids=_row_id)
def test_row_says_what_the_command_takes(command: str, row: Row) -> None:
    if row.status == "pending":
        pytest.skip(f"waits on work in flight: {row.text}")
    parser = parsers()[NVDP_COMMAND[command]]
    options = _options(command)
    elsewhere = READ_ELSEWHERE.get(command, {})
    taken: dict[str, bool] = {}
    owners: set[str] = set()
    for flag in row.flags:
        if not flag.startswith("-"):
            taken[flag] = flag in _subcommands(parser)
            continue
        dest = _taken_flag(parser, flag)
        taken[flag] = dest is not None
        owners |= {dest} if dest else set()
    for env in row.envs:
        if env in elsewhere:
            taken[env] = elsewhere[env](env)
            continue
        option = _env_option(options, env)
        taken[env] = option is not None
        owners |= {option.dest} if option else set()
    if row.status == "not accepted":
        assert not any(taken.values()), f"said not accepted, but taken: {[n for n, t in taken.items() if t]}"
    else:
        assert all(taken.values()), (
            f"said {row.status}, but not taken: {[n for n, t in taken.items() if not t]}"
        )
        assert len(owners) <= 1, f"NVIDIA's flag and its env vars are several options here: {owners}"


def _chart_rows() -> list[Row]:
    return ROWS.get("chart", [])


@pytest.mark.parametrize("row", _chart_rows(), ids=_row_id)
def test_chart_row_says_whether_the_key_is_refused(renderer: Renderer, row: Row) -> None:
    if row.status == "pending":
        pytest.skip(f"waits on work in flight: {row.text}")
    assert row.status in ("same", "accepted", "refused"), row.text
    (key,) = row.names
    change = CHANGES[key]
    after = outcome(renderer, merged(change.context, nested(key, change.value)), change.namespace)
    if row.status == "refused":
        assert isinstance(after, str) and key in after, f"{key}: said refused, but renders"
    else:
        assert not isinstance(after, str), f"{key}: said {row.status}, but the render fails: {after}"


def readme_section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_readme_migrating_section_links_the_full_list() -> None:
    section = readme_section("Migrating from NVIDIA")
    assert "(docs/migrating.md)" in section
    assert not re.search(r"^## Drop-in", README.read_text(), re.MULTILINE), "one place for it, not two"


def test_doc_links_resolve() -> None:
    text = DOC.read_text()
    for target in re.findall(r"\]\(([^)#]+\.md)", text):
        assert (DOC.parent / target).is_file(), target
    anchors = {heading_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
    for anchor in re.findall(r"\]\(#([^)]+)\)", text):
        assert anchor in anchors, anchor


def test_data_files_are_the_commands() -> None:
    assert {p.stem for p in DATA.glob("*.txt")} == set(NVDP_COMMAND) - {"gpu-feature-discovery"}
