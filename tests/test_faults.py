"""Fault tests: `nvdp plugin` as a real process, hurt the way nodes hurt it.

SIGKILL then restart (the stale socket is replaced), a config file replaced by garbage then SIGHUP
(the old config keeps serving, one error line), SIGTERM (exit 0 within 2 s, sockets removed), huge
malformed Allocate requests, and config files that are garbage (fuzzed in process through
`load_file` / `resolve`, and a handful through the real command line: exit 1, one line, no traceback).
The tests that run the plugin process are marked `soak` (select with `-m soak`); the in-process fuzz
tests are not.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvdp.base.errors import ConfigError
from nvdp.config import PLUGIN_OPTIONS, Config, PluginOptions, add_plugin_flags, load_file, resolve
from nvdp.sim.kubelet import Kubelet
from testkit import Process, clean_env, plugin_argv, start_plugin, wait_until, write_time_slicing_config

GPU = "nvidia.com/gpu"


def _start(kubelet: Kubelet, processes: list[Process], count: int = 1, **kw: object) -> Process:
    log = kubelet.plugin_dir / f"plugin-{len(processes)}.log"
    process = start_plugin(kubelet.plugin_dir, log_path=log, **kw)  # type: ignore[arg-type]
    processes.append(process)
    kubelet.wait_for_registration(GPU, count, timeout=30)
    kubelet.wait_for_devices(GPU, timeout=30)
    # The kubelet opens the stream before it answers Register: wait for the answer to reach the plugin.
    wait_until(lambda: "registered with kubelet" in process.log(), 15, "registration logged")
    return process


def _refuses_connections(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except ConnectionRefusedError:
            return True
    return False


def _visible(kubelet: Kubelet, ids: list[str]) -> str:
    return str(kubelet.allocate(GPU, [ids]).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"])


# ---- signals ------------------------------------------------------------------------------------


@pytest.mark.soak
def test_sigkill_then_restart_replaces_the_stale_socket(kubelet: Kubelet, processes: list[Process]) -> None:
    first = _start(kubelet, processes)
    plugin_socket = kubelet.plugin_dir / "nvidia-gpu.sock"
    first.kill()
    kubelet.wait_for_stream_closed(GPU)
    assert plugin_socket.exists() and _refuses_connections(plugin_socket)  # stale: nobody listens

    second = _start(kubelet, processes, count=2)
    assert not _refuses_connections(plugin_socket)  # (inode numbers are reused at once: no use here)
    assert "removed stale socket" in second.log()
    ids = sorted(kubelet.devices(GPU))
    assert len(ids) == 8
    assert _visible(kubelet, ids[:2]) == ",".join(ids[:2])
    assert second.stop() == 0


@pytest.mark.soak
def test_garbage_config_then_sighup_keeps_the_old_config(
    kubelet: Kubelet, processes: list[Process], sock_dir: Path
) -> None:
    config = write_time_slicing_config(sock_dir / "config.yaml", replicas=2)
    process = _start(kubelet, processes, config_file=config)
    assert len(kubelet.wait_for_devices(GPU, lambda d: len(d) == 16)) == 16
    registrations = len(kubelet.registrations)

    garbage = sock_dir / "config.yaml.new"
    garbage.write_text("version: v1\nsharing: {timeSlicing: [replicas: ][\n\x00")
    os.replace(garbage, config)  # as a ConfigMap update does: the file is swapped, not edited
    before = len(process.log().splitlines())
    process.send(signal.SIGHUP)
    wait_until(lambda: "reload failed" in process.log(), timeout=10, what="reload failure logged")

    new_lines = process.log().splitlines()[before:]
    errors = [line for line in new_lines if " ERROR " in line]
    assert len(errors) == 1, new_lines
    assert "reload failed" in errors[0] and str(config) in errors[0]
    assert "Traceback" not in process.log()
    # Still serving the old config: the 16 replicas, same registration, Allocate answered.
    assert process.alive()
    assert len(kubelet.registrations) == registrations
    devices = kubelet.devices(GPU)
    assert len(devices) == 16
    replicas = sorted(devices)[:2]
    assert _visible(kubelet, replicas) == ",".join(dict.fromkeys(r.split("::")[0] for r in replicas))

    # A good config afterwards is taken up.
    write_time_slicing_config(config, replicas=4)
    process.send(signal.SIGHUP)
    kubelet.wait_for_devices(GPU, lambda d: len(d) == 32, timeout=15)
    assert process.stop() == 0


@pytest.mark.soak
@pytest.mark.parametrize(
    ("nvml", "extra", "sockets"),
    [("sim:dgx-a100", [], 1), ("sim:dgx-a100-mig", ["--mig-strategy", "mixed"], None)],
    ids=["one-resource", "mig-mixed"],
)
def test_sigterm_exits_zero_within_two_seconds_and_removes_its_sockets(
    kubelet: Kubelet, processes: list[Process], nvml: str, extra: list[str], sockets: int | None
) -> None:
    process = start_plugin(kubelet.plugin_dir, nvml, extra=extra, log_path=kubelet.plugin_dir / "plugin.log")
    processes.append(process)
    kubelet.wait_for_registration(GPU if sockets else "nvidia.com/mig-1g.5gb", timeout=30)

    def every_socket_registered() -> list[Path] | None:
        found = sorted(kubelet.plugin_dir.glob("nvidia-*.sock"))
        return found if found and len(found) == len(kubelet.resources()) else None

    ours = wait_until(every_socket_registered, timeout=15, what="every resource registered")
    if sockets is not None:
        assert len(ours) == sockets
    else:
        assert len(ours) > 1
    for resource in kubelet.resources():
        kubelet.wait_for_devices(resource)

    started = time.monotonic()
    process.send(signal.SIGTERM)
    code = process.wait(timeout=10)
    elapsed = time.monotonic() - started
    assert code == 0, process.log()[-2000:]
    assert elapsed < 2.0, f"took {elapsed:.2f}s to exit"
    assert not list(kubelet.plugin_dir.glob("nvidia-*.sock"))
    assert (kubelet.plugin_dir / "kubelet.sock").exists()  # the kubelet's own is left alone
    assert "Traceback" not in process.log()


@pytest.mark.soak
def test_kubelet_that_refuses_connections_at_first_gets_one_registration_per_restart(
    kubelet: Kubelet, processes: list[Process]
) -> None:
    """kubelet.sock appears before the kubelet accepts connections: the plugin waits for it and registers
    once; it does not register a second time because the socket file changed while it waited."""
    process = _start(kubelet, processes)
    for n in range(2, 6):
        kubelet.restart(accept_delay=0.1)
        kubelet.wait_for_registration(GPU, n, timeout=15)
        kubelet.wait_for_devices(GPU)
        with pytest.raises(TimeoutError):  # a second registration would follow within milliseconds
            kubelet.wait_for_registration(GPU, n + 1, timeout=0.3)
    assert not kubelet.rejections
    assert len(kubelet.registrations) == 5
    assert process.stop() == 0 and "Traceback" not in process.log()


# ---- malformed requests -------------------------------------------------------------------------


@pytest.mark.soak
@pytest.mark.parametrize("count", [1000, 10_000])
def test_allocate_with_thousands_of_unknown_ids_is_invalid_argument(
    kubelet: Kubelet, processes: list[Process], count: int
) -> None:
    process = _start(kubelet, processes)
    ids = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(count)]
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate(GPU, [ids])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert len(refused.value.details() or "") < 4096
    longest = max(len(line) for line in process.log().splitlines())
    assert longest < 4096, f"a {longest}-character log line"
    assert process.alive()


# ---- config files -------------------------------------------------------------------------------

_PARSER = argparse.ArgumentParser()
add_plugin_flags(_PARSER)
_LIST_DESTS = {o.dest for o in PLUGIN_OPTIONS if o.kind == "list"}
_ENVS = sorted({env for option in PLUGIN_OPTIONS for env in option.envs} - {"CONFIG_FILE", "NVDP_NVML"})

_yaml_words = st.sampled_from(
    [
        "version",
        "v1",
        "flags",
        "sharing",
        "timeSlicing",
        "mps",
        "resources",
        "replicas",
        "name",
        "nvidia.com/gpu",
        "migStrategy",
        "mixed",
        "health",
        "ignoredXids",
        "recoveryQuietPeriod",
        "5m",
        "plugin",
        "deviceListStrategy",
        "envvar",
        "renameByDefault",
        "devices",
        "all",
        "0",
        "-1",
        "1e9",
        "~",
        "null",
        "true",
        "&a",
        "*a",
        "!!binary",
        "!!python/object",
        "<<",
        "---",
        "...",
        "%YAML 1.1",
    ]
)
_yaml_text = st.lists(
    st.tuples(
        st.integers(0, 6),
        _yaml_words,
        st.sampled_from([": ", ":", " - ", " ", "\n", ", ", "{", "}", "[", "]"]),
    ),
    max_size=40,
).map(lambda parts: "".join(" " * indent + word + sep for indent, word, sep in parts))
_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | _yaml_words
_structures = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=8) | _yaml_words, children, max_size=5)
    ),
    max_leaves=30,
)


def _yaml_bytes(data: object) -> bytes:
    try:
        text: str = yaml.safe_dump(data, allow_unicode=True)
        return text.encode("utf-8", "surrogatepass")
    except yaml.YAMLError:
        return b"{"


_file_bytes = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")),
    _yaml_text.map(str.encode),
    _structures.map(lambda s: _yaml_bytes({"version": "v1", "sharing": s})),
    _structures.map(_yaml_bytes),
    _structures.map(lambda s: repr(s).encode("utf-8", "surrogatepass")),  # JSON-ish
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_file_bytes)
def test_fuzzed_config_file_loads_or_is_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "config.yaml"
    path.write_bytes(data)
    try:
        config = load_file(path)
    except ConfigError as error:
        assert error.problems and all("\n" not in p for p in error.problems)
    else:
        assert isinstance(config, Config)


_env_values = st.text(max_size=12) | st.sampled_from(
    ["", "true", "false", "none", "mixed", "envvar,cdi-cri", ":2112", "0", "-1", "1,2", "all", "/x", "index"]
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(_ENVS), _env_values, max_size=5),
    st.dictionaries(
        st.sampled_from(sorted(o.dest for o in PLUGIN_OPTIONS if o.dest not in ("config_file", "nvml"))),
        _env_values,
        max_size=4,
    ),
    _file_bytes,
)
def test_fuzzed_flags_env_and_file_resolve_or_are_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, environ: dict[str, str], flags: dict[str, str], data: bytes
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "config.yaml"
    path.write_bytes(data)
    args = _PARSER.parse_args([])
    for dest, value in flags.items():
        setattr(args, dest, [value] if dest in _LIST_DESTS else value)
    environ = {**environ, "CONFIG_FILE": str(path)}
    try:
        config = resolve(args, environ)
    except ConfigError as error:
        assert error.problems and all("\n" not in p for p in error.problems)
    else:
        assert isinstance(config, PluginOptions)


_BAD_FILES = {
    "invalid-yaml": b"version: v1\nflags: [unclosed\n",
    "not-a-mapping": b"- a\n- b\n",
    "unknown-version": b"version: v2\n",
    "binary": bytes(range(256)) * 4,
    "wrong-types": b"version: v1\nsharing:\n  timeSlicing:\n    resources: 5\nflags: {migStrategy: 7}\n",
    "missing": None,
    "directory": b"",
}


@pytest.mark.soak
def test_bad_config_files_exit_1_with_one_line_and_no_traceback(sock_dir: Path) -> None:
    def run(name: str) -> tuple[str, subprocess.CompletedProcess[str]]:
        content = _BAD_FILES[name]
        path = sock_dir / f"{name}.yaml"
        if name == "directory":
            path.mkdir()
        elif content is not None:
            path.write_bytes(content)
        argv = plugin_argv(sock_dir / "kubelet.sock", "sim:dgx-a100", config_file=path)
        result = subprocess.run(
            argv, env=clean_env(), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )
        return name, result

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, _BAD_FILES))
    for name, result in results:
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1, (name, result.returncode, result.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith("error: "), (name, result.stderr[-2000:])
        assert str(sock_dir / name) in lines[0], (name, lines[0])
        assert "Traceback" not in result.stderr and not result.stdout
    assert not list(sock_dir.glob("*.sock"))


@pytest.mark.soak
def test_bad_config_file_at_start_is_one_line_with_every_problem(sock_dir: Path) -> None:
    path = sock_dir / "config.yaml"
    path.write_text(
        "version: v1\nflags: {migStrategy: bogus}\nsharing: {timeSlicing: {resources: [{name: x}]}}\n"
    )
    argv = plugin_argv(sock_dir / "kubelet.sock", "sim:dgx-a100", config_file=path)
    result = subprocess.run(
        argv, env=clean_env(), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert "flags.migStrategy" in line and "sharing.timeSlicing.resources[0].replicas" in line, line
    assert "Traceback" not in result.stderr
