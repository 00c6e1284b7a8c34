"""config-manager's `--process-to-signal` against real processes laid out as in the image.

The image (Dockerfile) has the console scripts in /usr/local/bin and links each from /usr/bin, where
NVIDIA's image has its binaries. NVIDIA's manifests start the commands as `/usr/bin/NAME` (the static
gfd manifest) or by name (its chart), and signal `/usr/bin/mps-control-daemon` or
`nvidia-device-plugin`; nvdp's users may start `nvdp SUBCOMMAND`. Each way of starting finds and
signals the process under NVIDIA's absolute path and under the bare name, and no other command's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nvdp.cli import build_parser
from nvdp.side.configmanager import process
from nvdp.side.configmanager.process import NVDP_SUBCOMMANDS
from testkit import REPO, wait_until
from tests.test_deploy import console_scripts

FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")

# A stand-in console script: records SIGHUP in HUP_DIR/<pid>.hup, and says it is ready to take it.
STAND_IN = """\
import os, pathlib, signal, time
done = pathlib.Path(os.environ["HUP_DIR"], f"{os.getpid()}")
signal.signal(signal.SIGHUP, lambda *_: done.with_suffix(".hup").write_text("hup"))
done.with_suffix(".ready").write_text("ready")
time.sleep(120)
"""


def install_layout(root: Path) -> tuple[Path, Path]:
    """The image's layout under `root`: usr/local/bin/NAME scripts, usr/bin/NAME links to them."""
    scripts, links = root / "usr" / "local" / "bin", root / "usr" / "bin"
    scripts.mkdir(parents=True)
    links.mkdir(parents=True)
    for name in ("nvdp", *NVDP_SUBCOMMANDS.values()):
        script = scripts / name
        script.write_text(f"#!{sys.executable}\n{STAND_IN}")
        script.chmod(0o755)
        (links / name).symlink_to(script)
    return scripts, links


# How a manifest starts the command `name` (nvdp's subcommand `subcommand`); PATH has usr/local/bin
# first, as the python image's does.
Start = Callable[[Path, str, str], list[str]]
STARTS: dict[str, Start] = {
    "nvidia-static-manifest": lambda links, name, sub: [str(links / name)],  # command: ["/usr/bin/X"]
    "nvidia-chart": lambda links, name, sub: [name],  # command: [X], found on PATH
    "nvdp-subcommand": lambda links, name, sub: ["nvdp", sub],
    "nvdp-subcommand-from-usr-bin": lambda links, name, sub: [str(links / "nvdp"), sub],
}


@contextmanager
def children_started(
    argvs: dict[str, list[str]], env: dict[str, str]
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    children: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, argv in argvs.items():
            children[name] = subprocess.Popen(argv, env=env, cwd=REPO)
        yield children
    finally:
        for child in children.values():
            child.kill()
            child.wait()


@pytest.mark.parametrize("start", list(STARTS.values()), ids=list(STARTS))
def test_each_command_is_found_and_signalled_by_nvidia_path_and_name(tmp_path: Path, start: Start) -> None:
    scripts, links = install_layout(tmp_path / "image")
    env = {**os.environ, "PATH": f"{scripts}:{os.environ['PATH']}", "HUP_DIR": str(tmp_path)}
    argvs = {name: start(links, name, sub) for sub, name in NVDP_SUBCOMMANDS.items()}
    with children_started(argvs, env) as children:
        for child in children.values():
            ready = tmp_path / f"{child.pid}.ready"
            wait_until(ready.exists, 30, f"process {child.args} ready")
        ours = {child.pid for child in children.values()}
        for name, child in children.items():
            nvidia_path = str(links / name)  # /usr/bin/NAME in the image
            assert process.find(nvidia_path) == [child.pid], (name, child.args)
            by_name = set(process.find(name)) & ours  # other tests may run processes of that name
            assert by_name == {child.pid}, (name, child.args)
        for name, child in children.items():
            assert process.signal_by_name(str(links / name), signal.SIGHUP) == [child.pid]
            hup = tmp_path / f"{child.pid}.hup"
            wait_until(hup.exists, 30, f"SIGHUP seen by {child.args}")
            assert child.poll() is None


def test_what_nvidias_config_manager_finds_is_found(tmp_path: Path) -> None:
    """NVIDIA's rule: argv[0] equal to the name, whatever the executable (its Go binary in /usr/bin)."""
    argv0 = str(tmp_path / "usr" / "bin" / "mps-control-daemon")  # need not exist
    child = subprocess.Popen([argv0, "120"], executable="/bin/sleep")
    try:
        assert wait_until(lambda: process.find(argv0), 30, "the process in /proc") == [child.pid]
        assert child.pid in process.find("mps-control-daemon")
    finally:
        child.kill()
        child.wait()


def test_a_path_of_another_file_finds_nothing(tmp_path: Path) -> None:
    scripts, links = install_layout(tmp_path / "image")
    other = tmp_path / "other" / "nvidia-device-plugin"
    env = {**os.environ, "HUP_DIR": str(tmp_path)}
    with children_started({"plugin": [str(links / "nvidia-device-plugin")]}, env) as children:
        wait_until((tmp_path / f"{children['plugin'].pid}.ready").exists, 30, "the process ready")
        assert process.find(str(other)) == []
        assert process.find(str(scripts / "nvidia-device-plugin")) == [children["plugin"].pid]


def test_the_subcommands_are_the_console_scripts_of_the_same_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """NVDP_SUBCOMMANDS agrees with nvdp.cli: each console script takes its subcommand's flags."""
    scripts = console_scripts()
    _, commands = build_parser()
    assert set(NVDP_SUBCOMMANDS.values()) == set(scripts) - {"nvdp"}
    for subcommand, script in NVDP_SUBCOMMANDS.items():
        module, _, function = scripts[script].partition(":")
        entry = getattr(__import__(module, fromlist=[function]), function)
        with pytest.raises(SystemExit):
            entry(["--help"])
        script_flags = set(FLAG.findall(capsys.readouterr().out))
        sub_flags = set(FLAG.findall(commands[subcommand].format_help()))
        assert script_flags == sub_flags, script
