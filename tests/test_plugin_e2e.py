"""`nvdp plugin` as a subprocess, driven by the kubelet stand-in over real unix sockets."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nvdp.sim.kubelet import Kubelet
from testkit import Process, clean_env, plugin_argv, start_plugin, wait_until
from tests.builders import sim_gpus

GPU = "nvidia.com/gpu"
PROFILES = ("dgx-a100", "pcie-4", "dgx-h100")


@pytest.fixture(params=PROFILES)
def node(request: pytest.FixtureRequest, sock_dir: Path, kubelet: Kubelet) -> Iterator[tuple[str, Process]]:
    plugin = start_plugin(sock_dir, f"sim:{request.param}")
    try:
        kubelet.wait_for_registration(GPU, timeout=20)
        yield request.param, plugin
    finally:
        plugin.stop()


def test_registers_and_lists_every_gpu_healthy_with_numa(node: tuple[str, Process], kubelet: Kubelet) -> None:
    profile, _ = node
    gpus = sim_gpus(profile)
    registration = kubelet.registrations[0]
    assert registration.endpoint == "nvidia-gpu.sock"
    assert registration.options.get_preferred_allocation_available
    devices = kubelet.wait_for_devices(GPU, lambda d: len(d) == len(gpus), timeout=10)
    assert {uuid: (s.health, s.numa_nodes) for uuid, s in devices.items()} == {
        g.uuid: ("Healthy", (g.numa_node,)) for g in gpus
    }


def test_allocate_by_uuid_and_refusal_keeps_serving(node: tuple[str, Process], kubelet: Kubelet) -> None:
    profile, plugin = node
    gpus = sim_gpus(profile)
    response = kubelet.allocate(GPU, [[gpus[1].uuid, gpus[0].uuid], [gpus[2].uuid]])
    envs = [dict(c.envs) for c in response.container_responses]
    assert envs == [
        {"NVIDIA_VISIBLE_DEVICES": f"{gpus[1].uuid},{gpus[0].uuid}"},
        {"NVIDIA_VISIBLE_DEVICES": gpus[2].uuid},
    ]
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate(GPU, [[gpus[0].uuid, "GPU-does-not-exist"]])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "nvidia.com/gpu: unknown device IDs: GPU-does-not-exist"
    with pytest.raises(grpc.RpcError) as empty:
        kubelet.allocate(GPU, [[]])
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as no_containers:
        kubelet.allocate(GPU, [])
    assert no_containers.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert no_containers.value.details() == "nvidia.com/gpu: Allocate request has no container requests"
    again = kubelet.allocate(GPU, [[gpus[3].uuid]])
    assert again.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == gpus[3].uuid
    assert plugin.alive()
    assert "Traceback" not in plugin.log()


def test_preferred_allocation_rules(node: tuple[str, Process], kubelet: Kubelet) -> None:
    profile, _ = node
    gpus = sim_gpus(profile)
    uuids = [g.uuid for g in gpus]
    numa = {g.uuid: g.numa_node for g in gpus}
    half = len(gpus) // 2
    chosen = kubelet.preferred_allocation(GPU, uuids, [], half)
    assert len(chosen) == half and set(chosen) <= set(uuids)
    assert len({numa[u] for u in chosen}) == 1, "a half-node request stays on one NUMA node"
    last = uuids[-1]
    chosen = kubelet.preferred_allocation(GPU, uuids, [last], 2)
    assert last in chosen and len(chosen) == 2
    assert numa[chosen[0]] == numa[chosen[1]]
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.preferred_allocation(GPU, uuids[:2], [], 3)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "allocation_size 3 exceeds the 2 available devices"


def test_reregisters_after_kubelet_restart(node: tuple[str, Process], kubelet: Kubelet) -> None:
    profile, _ = node
    gpus = sim_gpus(profile)
    kubelet.restart()
    kubelet.wait_for_registration(GPU, count=2, timeout=10)
    kubelet.wait_for_devices(GPU, lambda d: len(d) == len(gpus), timeout=10)
    kubelet.restart(accept_delay=0.3)  # socket file first, accepting later: the plugin retries fast
    kubelet.wait_for_registration(GPU, count=3, timeout=10)
    response = kubelet.allocate(GPU, [[gpus[0].uuid]])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == gpus[0].uuid


def test_sigterm_stops_within_two_seconds_and_removes_sockets(
    node: tuple[str, Process], kubelet: Kubelet, sock_dir: Path
) -> None:
    _, plugin = node
    assert (sock_dir / "nvidia-gpu.sock").exists()
    plugin.send(signal.SIGTERM)
    assert plugin.wait(10) == 0
    assert not (sock_dir / "nvidia-gpu.sock").exists()
    kubelet.wait_for_stream_closed(GPU, timeout=5)


def test_index_strategy_and_device_specs(sock_dir: Path, kubelet: Kubelet, tmp_path: Path) -> None:
    dev_root = tmp_path / "host"
    (dev_root / "dev").mkdir(parents=True)
    gpus = sim_gpus("dgx-a100")
    # the device specs name these nodes, so a GPU is served only while its node exists
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", *(f"nvidia{g.minor}" for g in gpus)):
        (dev_root / "dev" / name).touch()
    args = ["--device-id-strategy", "index", "--pass-device-specs", "--nvidia-dev-root", str(dev_root)]
    with start_plugin(sock_dir, extra=args):
        kubelet.wait_for_registration(GPU, timeout=20)
        response = kubelet.allocate(GPU, [[gpus[5].uuid, gpus[2].uuid]])
    container = response.container_responses[0]
    assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": "5,2"}
    assert [(d.container_path, d.host_path, d.permissions) for d in container.devices] == [
        ("/dev/nvidiactl", f"{dev_root}/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", f"{dev_root}/dev/nvidia-uvm", "rw"),
        ("/dev/nvidia-uvm-tools", f"{dev_root}/dev/nvidia-uvm-tools", "rw"),
        ("/dev/nvidia5", f"{dev_root}/dev/nvidia5", "rw"),
        ("/dev/nvidia2", f"{dev_root}/dev/nvidia2", "rw"),
    ]


def test_env_vars_work_like_flags(sock_dir: Path, kubelet: Kubelet) -> None:
    gpus = sim_gpus("pcie-4")
    env = {"DEVICE_ID_STRATEGY": "index", "NVDP_NVML": "sim:pcie-4"}
    argv = plugin_argv(sock_dir / "kubelet.sock")
    del argv[argv.index("--nvml") : argv.index("--nvml") + 2]  # NVDP_NVML picks the node
    with Process(argv, sock_dir / "plugin.log", clean_env(env)):
        kubelet.wait_for_registration(GPU, timeout=20)
        assert len(kubelet.wait_for_devices(GPU)) == 4
        response = kubelet.allocate(GPU, [[gpus[3].uuid]])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "3"


def test_stale_socket_from_a_killed_run_is_replaced(sock_dir: Path, kubelet: Kubelet) -> None:
    stale = sock_dir / "nvidia-gpu.sock"
    stale.write_text("left behind by a SIGKILLed plugin")
    with start_plugin(sock_dir) as plugin:
        kubelet.wait_for_registration(GPU, timeout=20)
        kubelet.wait_for_devices(GPU, lambda d: len(d) == 8)
        assert "removed stale socket" in plugin.log()


def test_config_file_time_slicing_and_sighup_reload(sock_dir: Path, kubelet: Kubelet, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    with start_plugin(sock_dir, config_file=config) as plugin:
        kubelet.wait_for_registration(GPU, timeout=20)
        kubelet.wait_for_devices(GPU, lambda d: len(d) == 8)
        config.write_text(
            "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
            "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
        )
        plugin.send(signal.SIGHUP)
        shared = kubelet.wait_for_devices("nvidia.com/gpu.shared", lambda d: len(d) == 32, timeout=20)
        assert all("::" in device_id for device_id in shared)
        kubelet.wait_for_stream_closed(GPU, timeout=10)
        gpus = sim_gpus("dgx-a100")
        ids = sorted(i for i in shared if i.startswith(gpus[0].uuid))
        response = kubelet.allocate("nvidia.com/gpu.shared", [ids[:2]])
        assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == gpus[0].uuid
        # garbage config: the daemon keeps the previous one and says why in one line
        config.write_text("version: v1\nflags: {migStrategy: sometimes}\n")
        plugin.send(signal.SIGHUP)
        wait_until(lambda: "reload failed" in plugin.log(), timeout=10, what="reload failure line")
        assert "flags.migStrategy: invalid value" in plugin.log()
        assert kubelet.allocate("nvidia.com/gpu.shared", [ids[:1]]).container_responses
    assert "Traceback" not in plugin.log()


def test_node_without_gpus_waits_without_crashing(sock_dir: Path, kubelet: Kubelet, tmp_path: Path) -> None:
    node_file = tmp_path / "empty.yaml"
    node_file.write_text("gpus: []\n")
    with start_plugin(sock_dir, f"sim:{node_file}") as plugin:
        wait_until(lambda: "no devices found" in plugin.log(), timeout=20, what="no-devices line")
        assert plugin.alive()
        plugin.send(signal.SIGTERM)
        assert plugin.wait(10) == 0


def test_nvml_init_failure_exits_1_with_one_clear_line(sock_dir: Path) -> None:
    plugin = start_plugin(sock_dir, "real", env={"NVIDIA_DRIVER_ROOT": str(sock_dir)})
    assert plugin.wait(20) == 1
    log = plugin.log()
    assert "failed to initialize NVML" in log and "Traceback" not in log
    plugin.stop()


def test_nvml_init_failure_idles_when_fail_on_init_error_is_false(sock_dir: Path) -> None:
    plugin = start_plugin(
        sock_dir, "real", extra=["--fail-on-init-error=false"], env={"NVIDIA_DRIVER_ROOT": str(sock_dir)}
    )
    wait_until(lambda: "idling" in plugin.log(), timeout=20, what="idle line")
    assert plugin.alive()
    plugin.send(signal.SIGTERM)
    assert plugin.wait(10) == 0
    plugin.stop()


def test_invalid_flag_value_exits_1_without_traceback(sock_dir: Path) -> None:
    plugin = start_plugin(sock_dir, extra=["--mig-strategy", "sometimes"])
    assert plugin.wait(20) == 1
    log = plugin.log()
    assert 'invalid value "sometimes"' in log and "--mig-strategy" in log and "Traceback" not in log
    plugin.stop()


def test_taken_metrics_port_is_one_error_line_and_devices_still_served(
    sock_dir: Path, kubelet: Kubelet
) -> None:
    import socket

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with start_plugin(sock_dir, metrics_address=f"127.0.0.1:{port}") as plugin:
            kubelet.wait_for_registration(GPU, timeout=20)
            kubelet.wait_for_devices(GPU, lambda d: len(d) == 8)
            wait_until(
                lambda: "metrics endpoint disabled" in plugin.log(), timeout=10, what="metrics error line"
            )
    assert "Traceback" not in plugin.log()


@pytest.mark.parametrize("fail_on_init_error", ["true", "false"])
def test_a_mig_layout_the_strategy_cannot_serve_whole_is_served_in_part_with_warnings(
    sock_dir: Path, kubelet: Kubelet, fail_on_init_error: str
) -> None:
    extra = ["--mig-strategy", "single", f"--fail-on-init-error={fail_on_init_error}"]
    with start_plugin(sock_dir, "sim:dgx-a100-mig", extra=extra) as plugin:
        kubelet.wait_for_registration(GPU, timeout=20)
        devices = kubelet.wait_for_devices(GPU, lambda d: len(d) == 8)
        assert all(i.startswith("MIG-") for i in devices)  # the 1g.5gb MIG devices: most of them
        log = plugin.log()
        assert "have MIG enabled; serving the MIG devices, the whole GPUs are not advertised" in log
        assert "serving 1g.5gb, MIG devices of 2g.10gb, 3g.20gb, 7g.40gb are not advertised" in log
        plugin.send(signal.SIGTERM)
        assert plugin.wait(10) == 0
    assert "Traceback" not in plugin.log()


def test_fail_requests_greater_than_one_applies_to_replicas_only(
    sock_dir: Path, kubelet: Kubelet, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 2\n      devices: [0, 1]\n"
    )
    gpus = sim_gpus("dgx-a100")
    with start_plugin(sock_dir, config_file=config):
        kubelet.wait_for_registration(GPU, timeout=20)
        devices = kubelet.wait_for_devices(GPU, lambda d: len(d) == 10)
        assert f"{gpus[0].uuid}::1" in devices and gpus[2].uuid in devices
        whole = kubelet.allocate(GPU, [[gpus[2].uuid, gpus[3].uuid]])
        assert whole.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == f"{gpus[2].uuid},{gpus[3].uuid}"
        with pytest.raises(grpc.RpcError) as refused:
            kubelet.allocate(GPU, [[f"{gpus[0].uuid}::0", f"{gpus[1].uuid}::0"]])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == (
            "request for 'nvidia.com/gpu: 2' too large: maximum request size for shared resources is 1"
        )
        one = kubelet.allocate(GPU, [[f"{gpus[1].uuid}::1"]])
        assert one.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == gpus[1].uuid
