"""Health through the whole daemon: fault injection (NVDP_SIM_EVENTS) -> NVML event -> health
monitor -> ListAndWatch as the kubelet stand-in receives it."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nvdp.sim.kubelet import Kubelet
from testkit import Process, start_plugin, wait_until
from tests.builders import append_sim_event, sim_gpus

GPU = "nvidia.com/gpu"


class PluginNode:
    def __init__(self, sock_dir: Path, kubelet: Kubelet, events: Path, plugin: Process) -> None:
        self.kubelet, self.events, self.plugin = kubelet, events, plugin

    def inject(self, **line: object) -> None:
        append_sim_event(self.events, **line)

    def unhealthy(self, resource: str = GPU) -> set[str]:
        return {i for i, s in self.kubelet.devices(resource).items() if s.health != "Healthy"}

    def wait_unhealthy(self, expected: set[str], resource: str = GPU, timeout: float = 10.0) -> None:
        self.kubelet.wait_for_devices(
            resource,
            lambda d: {i for i, s in d.items() if s.health != "Healthy"} == expected,
            timeout=timeout,
        )


def start_node(
    sock_dir: Path, tmp_path: Path, profile: str, config: str = "version: v1\n", args: tuple[str, ...] = ()
) -> tuple[Kubelet, Process, Path]:
    events = tmp_path / "events.jsonl"
    events.touch()
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config)
    kubelet = Kubelet(sock_dir)
    kubelet.start()
    plugin = start_plugin(
        sock_dir, f"sim:{profile}", config_file=config_file, extra=args, env={"NVDP_SIM_EVENTS": str(events)}
    )
    return kubelet, plugin, events


NodeFactory = Callable[..., PluginNode]


@pytest.fixture
def node_factory(sock_dir: Path, tmp_path: Path) -> Iterator[NodeFactory]:
    started: list[tuple[Kubelet, Process]] = []

    def make(
        profile: str = "dgx-a100",
        config: str = "version: v1\n",
        resources: tuple[str, ...] = (GPU,),
        args: tuple[str, ...] = (),
    ) -> PluginNode:
        kubelet, plugin, events = start_node(sock_dir, tmp_path, profile, config, args)
        started.append((kubelet, plugin))
        for resource in resources:
            kubelet.wait_for_registration(resource, timeout=20)
            kubelet.wait_for_devices(resource, timeout=10)
        wait_until(lambda: "health monitor" in plugin.log(), timeout=10, what="health monitor start")
        return PluginNode(sock_dir, kubelet, events, plugin)

    yield make
    for kubelet, plugin in started:
        plugin.stop()
        kubelet.stop()


def test_critical_xid_marks_exactly_that_gpu_and_app_xid_nothing(node_factory: NodeFactory) -> None:
    node = node_factory()
    gpus = sim_gpus("dgx-a100")
    node.inject(uuid=gpus[2].uuid, xid=13)  # application error: ignored
    node.inject(uuid=gpus[3].uuid, xid=79)  # fallen off the bus: processed after the XID 13
    node.wait_unhealthy({gpus[3].uuid})
    wait_until(lambda: "device unhealthy" in node.plugin.log(), timeout=10, what="transition line")
    lines = [li for li in node.plugin.log().splitlines() if "device unhealthy" in li]
    assert len(lines) == 1
    assert lines[0].endswith(
        f"WARNING device unhealthy resource=nvidia.com/gpu device={gpus[3].uuid} index=3 xid=79 "
        'reason="GPU has fallen off the bus" fatal=true'
    )


def test_time_slicing_replicas_all_follow_their_gpu(node_factory: NodeFactory) -> None:
    config = (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 3\n"
    )
    node = node_factory(config=config)
    gpus = sim_gpus("dgx-a100")
    node.inject(uuid=gpus[5].uuid, event="double-bit-ecc")
    node.wait_unhealthy({f"{gpus[5].uuid}::{n}" for n in range(3)})


def test_mig_event_marks_exactly_the_matching_instance(node_factory: NodeFactory) -> None:
    gpus = sim_gpus("dgx-a100-mig")
    two_g = [m for m in gpus[1].mig_devices]  # GPU 1: 3 x 2g.10gb
    node = node_factory(
        profile="dgx-a100-mig",
        args=("--mig-strategy", "mixed"),
        resources=(GPU, "nvidia.com/mig-2g.10gb", "nvidia.com/mig-1g.5gb"),
    )
    node.inject(uuid=two_g[1].uuid, xid=94)  # a MIG uuid: the event arrives on GPU 1 with its GI/CI ids
    node.wait_unhealthy({two_g[1].uuid}, resource="nvidia.com/mig-2g.10gb")
    node.inject(uuid=gpus[0].uuid, xid=48)  # no instance ids: every MIG device of GPU 0
    node.wait_unhealthy({m.uuid for m in gpus[0].mig_devices}, resource="nvidia.com/mig-1g.5gb")
    assert node.unhealthy("nvidia.com/mig-2g.10gb") == {two_g[1].uuid}
    assert node.unhealthy(GPU) == set()


def test_recovery_after_quiet_period_but_not_after_fatal_xid(node_factory: NodeFactory) -> None:
    config = "version: v1\nhealth:\n  recoveryQuietPeriod: 1s\n  probeInterval: 200ms\n"
    node = node_factory(config=config)
    gpus = sim_gpus("dgx-a100")
    node.inject(uuid=gpus[0].uuid, xid=79)  # fatal
    node.inject(uuid=gpus[1].uuid, xid=94)  # contained ECC error: recovers
    node.wait_unhealthy({gpus[0].uuid, gpus[1].uuid})
    node.wait_unhealthy({gpus[0].uuid}, timeout=15)
    wait_until(lambda: "device healthy" in node.plugin.log(), timeout=10, what="recovery line")
    assert f"device healthy resource=nvidia.com/gpu device={gpus[1].uuid} index=1 after=" in node.plugin.log()


def test_event_wait_error_keeps_states_and_rearms(node_factory: NodeFactory) -> None:
    node = node_factory()
    gpus = sim_gpus("dgx-a100")
    node.inject(uuid=gpus[4].uuid, xid=79)
    node.wait_unhealthy({gpus[4].uuid})
    node.inject(event="wait-error", code="NVML_ERROR_UNKNOWN")
    wait_until(lambda: "re-armed" in node.plugin.log(), timeout=15, what="monitor re-armed")
    assert node.unhealthy() == {gpus[4].uuid}, "an NVML failure is not a device failure"
    node.inject(uuid=gpus[6].uuid, xid=79)
    node.wait_unhealthy({gpus[4].uuid, gpus[6].uuid})


def test_lost_gpu_found_by_the_probe_without_any_event(node_factory: NodeFactory) -> None:
    node = node_factory(config="version: v1\nhealth:\n  probeInterval: 200ms\n")
    gpus = sim_gpus("dgx-a100")
    node.inject(uuid=gpus[7].uuid, event="gpu-lost")
    node.wait_unhealthy({gpus[7].uuid})
    assert "NVML_ERROR_GPU_IS_LOST" in node.plugin.log()


def test_sighup_applies_a_new_health_section(node_factory: NodeFactory, tmp_path: Path) -> None:
    node = node_factory()  # default: recovery after 5 minutes
    gpus = sim_gpus("dgx-a100")
    node.inject(uuid=gpus[2].uuid, xid=94)
    node.wait_unhealthy({gpus[2].uuid})
    (tmp_path / "config.yaml").write_text(
        "version: v1\nhealth:\n  recoveryQuietPeriod: 1s\n  probeInterval: 200ms\n"
    )
    node.plugin.send(signal.SIGHUP)
    wait_until(lambda: "health settings reloaded" in node.plugin.log(), timeout=10, what="settings reload")
    node.wait_unhealthy(set(), timeout=15)
    assert f"device healthy resource=nvidia.com/gpu device={gpus[2].uuid}" in node.plugin.log()
