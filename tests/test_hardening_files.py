"""Issue 17 case 8, in process: every file nvdp reads goes through one bounded reader (regular files
only, at most 1 MiB + 1 byte read), a mapping with no known top-level key is no config, and values
quoted in messages are cut short. The process-level half is `test_hardening_files_process.py`."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from nvdp.base.errors import CandidateError, ConfigError, UnreadableFile
from nvdp.base.files import read_bounded
from nvdp.cli import main
from nvdp.config import load_file, parse_text
from nvdp.config.values import show
from nvdp.node.cdi.writer import write_spec
from nvdp.node.nvml.sim import load_node_file
from nvdp.node.nvml.sim.follower import FileFollower
from nvdp.side.configmanager import files as cm_files
from nvdp.side.gfd.discover import read_machine_type
from tests.odd_files import ODD_KINDS, SHADOW_LINES, leaked, make_fifo, make_sparse, odd_path, write_shadow
from tests.readings import log_lines

NOT_A_CONFIG = "not an nvdp/NVIDIA device plugin config: no known top-level key"
KNOWN = "known: version, flags, resources, sharing, imex, health, dra"


def returns_within(call: Callable[[], object], seconds: float = 10.0) -> object:
    """`call()` run in a thread: a read that blocks (a FIFO) fails the test instead of hanging it."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(call())
        except Exception as error:
            result.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still reading after {seconds}s"
    return result[0]


# ---- the reader --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ODD_KINDS)
def test_reader_refuses_what_is_not_a_small_regular_file(tmp_path: Path, kind: str) -> None:
    path, said = odd_path(kind, tmp_path)
    error = returns_within(lambda: read_bounded(path))
    assert isinstance(error, UnreadableFile)
    assert str(error) == f"{path}: {said}"


def test_reader_refuses_a_socket_and_says_a_missing_file_is_missing(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(tmp_path / "s"))
        with pytest.raises(UnreadableFile, match="is a socket$"):
            read_bounded(tmp_path / "s")
    with pytest.raises(UnreadableFile) as caught:
        read_bounded(tmp_path / "missing")
    assert caught.value.reason == "No such file or directory"


def test_reader_reads_up_to_the_limit_and_dev_null_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_bounded(path, 100) == b"x" * 100
    with pytest.raises(UnreadableFile, match="larger than 99 bytes$"):
        read_bounded(path, 99)
    assert read_bounded("/dev/null") == b""
    link = tmp_path / "empty-config"
    link.symlink_to("/dev/null")  # config-manager's empty config
    assert read_bounded(link) == b""


def test_reader_does_not_trust_the_size_a_file_reports() -> None:
    """/proc files say they are 0 bytes long: the limit holds on what is read, not on stat()."""
    assert os.stat("/proc/self/status").st_size == 0
    assert b"VmRSS" in read_bounded("/proc/self/status")
    with pytest.raises(UnreadableFile, match="larger than 16 bytes$"):
        read_bounded("/proc/self/status", 16)


# ---- the plugin's config file and `nvdp config check` --------------------------------------------


@pytest.mark.parametrize("kind", ODD_KINDS)
def test_config_file_that_is_no_regular_file_is_one_line(tmp_path: Path, kind: str) -> None:
    path, said = odd_path(kind, tmp_path)
    error = returns_within(lambda: load_file(path))
    assert isinstance(error, ConfigError)
    assert str(error) == f"{path}: cannot read config file: {said}"


def test_a_file_with_no_known_top_level_key_is_refused_without_quoting_it(tmp_path: Path) -> None:
    shadow = write_shadow(tmp_path / "shadow")
    for strict in (False, True):
        with pytest.raises(ConfigError) as caught:
            load_file(shadow, strict=strict)
        assert caught.value.problems == [f"{NOT_A_CONFIG} (found 4 keys, none of them a field name; {KNOWN})"]
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {}\nx: 1\ny: 2\n"
    with pytest.raises(ConfigError) as caught:
        parse_text(manifest)
    assert caught.value.problems == [
        f"{NOT_A_CONFIG} (found: apiVersion, kind, metadata, data, x and 1 more; {KNOWN})"
    ]


def test_empty_file_stays_the_defaults_and_one_known_key_makes_a_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for text in ("", "# nothing\n", "{}\n"):
        assert parse_text(text) == parse_text("version: v1\n")
    with caplog.at_level(logging.WARNING, logger="nvdp.config"):
        parse_text("version: v1\nfoo: 1\n")
    assert [r.getMessage() for r in caplog.records] == [
        "foo: unknown field (accepted: version, flags, resources, sharing, imex, health, dra);"
        " ignored (--strict-config refuses it)"
    ]


def test_config_check_of_odd_paths_and_entries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = [odd_path(kind, tmp_path) for kind in ODD_KINDS if kind != "directory"]  # a dir: its entries
    shadow = write_shadow(tmp_path / "shadow")
    entries = tmp_path / "configmap"
    entries.mkdir()
    make_sparse(entries / "big")
    write_shadow(entries / "passwd")
    (entries / "ok").write_text("version: v1\n")
    assert main(["config", "check", *(str(p) for p, _ in paths), str(shadow), str(entries)]) == 1
    out = capsys.readouterr()
    refused = f"{NOT_A_CONFIG} (found 4 keys, none of them a field name; {KNOWN})"
    assert out.err.splitlines() == [
        *(f"error: {path}: cannot read config file: {said}" for path, said in paths),
        f"error: {shadow}: {refused}",
        f"error: {entries}/big: cannot read config file: larger than 1 MiB",
        f"error: {entries}/passwd: {refused}",
    ]
    assert out.out == f"{entries}/ok: ok\n"
    assert leaked(out.out + out.err) == []


# ---- what messages quote -------------------------------------------------------------------------


def test_quoted_values_are_cut_short_and_escaped() -> None:
    assert show("a" * 64) == '"' + "a" * 64 + '"'
    assert show("a" * 65) == '"' + "a" * 64 + '..."'
    assert show("x\u202ey\x00z") == '"x\\u202ey\\u0000z"'
    with pytest.raises(ConfigError) as caught:
        parse_text(f"flags: {{migStrategy: {SHADOW_LINES[0]!r}}}\n")
    (problem,) = caught.value.problems
    assert SHADOW_LINES[0] not in problem and len(problem) < 160


def test_yaml_errors_quote_no_long_content() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_text("version: v1\nflags: *" + "secret" * 100 + "\n")
    (problem,) = caught.value.problems
    assert (
        problem.startswith("invalid YAML at line 2, column 8: found undefined alias") and len(problem) < 160
    )


def test_problem_lines_are_capped_and_overlap_checks_are_linear() -> None:
    items = ", ".join(["true"] * 300)
    with pytest.raises(ConfigError) as caught:
        parse_text(f"sharing: {{timeSlicing: {{resources: [{{name: nvidia.com/gpu, devices: [{items}]}}]}}}}")
    assert len(caught.value.problems) == 101
    assert caught.value.problems[-1] == "and 201 more problems"  # 300 items, and `replicas` is missing
    entry = "{name: nvidia.com/gpu, replicas: 2, devices: [0]}"  # 20,000 entries all overlapping: the old
    aliased = f"x: &e {entry}\nsharing: {{timeSlicing: {{resources: [" + "*e, " * 20_000 + "]}}\n"
    with pytest.raises(ConfigError) as caught:  # pairwise check made 200 million lines of it
        parse_text(aliased)
    assert len(caught.value.problems) == 101
    assert caught.value.problems[0].startswith(
        "sharing.timeSlicing.resources[1].devices: overlaps resources[0]"
    )


# ---- config-manager's entries ----------------------------------------------------------------------


def test_config_manager_entries_are_read_bounded(tmp_path: Path) -> None:
    make_sparse(tmp_path / "big")
    make_fifo(tmp_path / "pipe")
    with pytest.raises(CandidateError, match="^cannot read entry 'big': larger than 1 MiB$"):
        cm_files.read_candidate(str(tmp_path), "big")
    error = returns_within(lambda: cm_files.read_candidate(str(tmp_path), "pipe"))
    assert isinstance(error, CandidateError) and str(error) == "cannot read entry 'pipe': is a FIFO"
    write_shadow(tmp_path / "passwd")
    _, content = cm_files.read_candidate(str(tmp_path), "passwd")
    with pytest.raises(CandidateError) as caught:
        cm_files.validate("passwd", content)
    assert str(caught.value).startswith(f"passwd: {NOT_A_CONFIG}") and leaked(str(caught.value)) == []
    dst = tmp_path / "dst"
    dst.symlink_to("/dev/null")
    assert cm_files.current(str(dst)) == cm_files.Effective(
        "/dev/null", cm_files.read_candidate("", "")[0].digest
    )
    os.replace(tmp_path / "pipe", tmp_path / "dst")  # whatever is there now is no config: applied again
    assert returns_within(lambda: cm_files.current(str(dst))) is None


# ---- gfd's machine type ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param("shadow", 'reason="more than one line"', id="multi-line"),
        pytest.param(
            b"\x7fELF\x02\x01\x01\x00\x00\x00", 'reason="holds characters that are not text"', id="binary"
        ),
        pytest.param(b"\xff\xfe\x00A", 'reason="not UTF-8 text"', id="not-utf8"),
        pytest.param(b"x" * 64, 'reason="longer than a label value (63 characters)"', id="too-long"),
        pytest.param(b"(!)\n", 'reason="holds no character a label value can carry"', id="no-label-char"),
        pytest.param("sparse", 'error="larger than 4 KiB"', id="sparse-2g"),
        pytest.param("fifo", 'error="is a FIFO"', id="fifo"),
        pytest.param("/dev/zero", 'error="is a character device"', id="dev-zero"),
    ],
)
def test_machine_type_file_that_is_no_product_name_is_unknown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes | str, reason: str
) -> None:
    path = tmp_path / "product_name"
    if content == "shadow":
        write_shadow(path)
    elif content == "sparse":
        make_sparse(path)
    elif content == "fifo":
        make_fifo(path)
    elif content == "/dev/zero":
        path = Path("/dev/zero")
    else:
        assert isinstance(content, bytes)
        path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="nvdp.side.gfd"):
        assert returns_within(lambda: read_machine_type(str(path))) == "unknown"
    (line,) = log_lines(caplog)
    assert f"file={path}" in line and line.endswith(reason) and leaked(line) == []


@pytest.mark.parametrize(
    ("content", "machine"),
    [
        pytest.param("NVIDIA DGX A100 920-23687-2530-000\n", "NVIDIA DGX A100 920-23687-2530-000", id="dgx"),
        pytest.param("Standard PC (Q35 + ICH9, 2009)\n", "Standard PC (Q35 + ICH9, 2009)", id="qemu"),
        pytest.param("\n", "unknown", id="empty"),
    ],
)
def test_machine_type_file_with_a_product_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, machine: str
) -> None:
    path = tmp_path / "product_name"
    path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="nvdp.side.gfd"):
        assert read_machine_type(str(path)) == machine
    assert caplog.records == []


# ---- the simulated node's files ----------------------------------------------------------------------


def test_sim_node_file_is_read_bounded_and_never_quoted_whole(tmp_path: Path) -> None:
    for kind in ODD_KINDS:
        path, said = odd_path(kind, tmp_path)
        error = returns_within(partial(load_node_file, path))
        assert (
            isinstance(error, ConfigError)
            and str(error) == f"{path}: cannot read simulated node file: {said}"
        )
    shadow = write_shadow(tmp_path / "shadow.yaml")
    with pytest.raises(ConfigError) as caught:
        load_node_file(shadow)
    assert caught.value.problems == [
        "node: not a simulated node file: no known top-level key (found 4 keys, none of them a field name)"
    ]
    node = tmp_path / "node.yaml"
    node.write_text(f"gpus: [{{name: Tesla T4, ecc: {SHADOW_LINES[0]!r}}}]\n")
    with pytest.raises(ConfigError) as caught:
        load_node_file(node)
    (problem,) = caught.value.problems
    assert problem.startswith("gpus[0].ecc: must be true or false, got 'root:$6$") and len(problem) < 120


def test_events_file_replaced_by_a_fifo_is_one_warning_and_never_blocks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "events"
    path.write_text("")
    lines: list[str] = []
    follower = FileFollower(str(path), lines.append)
    follower.start()
    follower.stop()  # drive poll() by hand
    pipe = make_fifo(tmp_path / "pipe")
    os.replace(pipe, path)
    with caplog.at_level(logging.WARNING, logger="nvdp.node.nvml.sim"):
        for _ in range(3):
            returns_within(follower.poll)
    assert [r.getMessage() for r in caplog.records] == [
        f"simulated events file is a FIFO; nothing is read while it is file={path}"
    ]
    path.unlink()
    path.write_text('{"uuid": "GPU-x", "xid": 1}\n')  # a regular file again: read from its start
    follower.poll()
    assert lines == ['{"uuid": "GPU-x", "xid": 1}']


def test_cdi_spec_write_over_a_fifo_replaces_it_without_blocking(tmp_path: Path) -> None:
    make_fifo(tmp_path / "nvdp.json")
    assert returns_within(lambda: write_spec(tmp_path, "nvdp.json", b"{}")) is True
    assert (tmp_path / "nvdp.json").read_bytes() == b"{}"
    assert write_spec(tmp_path, "nvdp.json", b"{}") is False  # the same content: not written again
