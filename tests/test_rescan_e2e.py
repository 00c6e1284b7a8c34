"""Live MIG re-partitioning: the simulated node changes its layout (an NVDP_SIM_EVENTS line), the
plugin's device rescan serves it without any signal; `nvdp plugin` as a subprocess, the kubelet
stand-in over real unix sockets."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from nvdp.sim.kubelet import Kubelet
from testkit import Process, start_plugin, wait_until
from tests.builders import append_sim_event, sim_gpus

MIG = "nvidia.com/mig-"
MIXED = ["gpu", "mig-1g.5gb", "mig-2g.10gb", "mig-3g.20gb", "mig-7g.40gb"]
INTERVAL = 1.0


def inject(events: Path, **line: object) -> float:
    append_sim_event(events, **line)
    return time.monotonic()


def start_rescanning(
    sock_dir: Path, processes: list[Process], *args: str, interval: float = INTERVAL
) -> tuple[Process, Path]:
    events = sock_dir / "events.jsonl"
    events.touch()
    plugin = start_plugin(
        sock_dir,
        "sim:dgx-a100-mig",
        extra=[*args, "--device-rescan-interval", f"{interval}"],
        env={"NVDP_SIM_EVENTS": str(events)},
    )
    processes.append(plugin)
    return plugin, events


def test_mixed_layout_change_served_without_a_signal(
    sock_dir: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    plugin, events = start_rescanning(sock_dir, processes, "--mig-strategy", "mixed")
    for name in MIXED:
        kubelet.wait_for_registration(f"nvidia.com/{name}", timeout=20)
    gpus = sim_gpus("dgx-a100-mig")
    three = gpus[2].mig_devices[0]  # GPU 2's 3g.20gb
    assert three.profile == "3g.20gb"
    inject(events, uuid=three.uuid, xid=94)
    kubelet.wait_for_devices(MIG + "3g.20gb", lambda d: d[three.uuid].health == "Unhealthy")

    # GPU 3: 7g.40gb -> 4g.20gb + 3g.20gb. 7g.40gb vanishes, 4g.20gb is new, 3g.20gb changes.
    sent = inject(events, uuid=gpus[3].uuid, mig=["4g.20gb", "3g.20gb"])
    devices = kubelet.wait_for_devices(MIG + "3g.20gb", lambda d: len(d) == 2, timeout=4 * INTERVAL)
    served = next(u.time for u in kubelet.updates(MIG + "3g.20gb") if len(u.devices) == 2)
    assert served - sent < 2 * INTERVAL, "served within 2 rescan intervals"
    assert devices[three.uuid].health == "Unhealthy", "a surviving device keeps its health"
    kubelet.wait_for_registration(MIG + "4g.20gb", timeout=2 * INTERVAL)
    kubelet.wait_for_stream_closed(MIG + "7g.40gb", timeout=2 * INTERVAL)
    wait_until(
        lambda: not (sock_dir / "nvidia-mig-7g.40gb.sock").exists(), timeout=2 * INTERVAL, what="socket gone"
    )
    for name in ["gpu", "mig-1g.5gb", "mig-2g.10gb", "mig-3g.20gb"]:
        resource = f"nvidia.com/{name}"
        assert [r.resource for r in kubelet.registrations].count(resource) == 1, f"{resource} re-registered"
        assert kubelet.stream_ends(resource) == [], f"{resource} stream ended"
    new = kubelet.wait_for_devices(MIG + "4g.20gb", lambda d: len(d) == 1)
    assert kubelet.allocate(MIG + "4g.20gb", [list(new)]).container_responses
    log = plugin.log()
    assert f"MIG layout changed gpu=3 uuid={gpus[3].uuid} old=1x7g.40gb new=1x4g.20gb+1x3g.20gb" in log
    assert "Traceback" not in log


def test_single_strategy_node_becomes_servable_after_repartitioning(
    sock_dir: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    plugin, events = start_rescanning(sock_dir, processes, "--mig-strategy", "single", interval=0.5)
    kubelet.wait_for_devices("nvidia.com/gpu", lambda d: len(d) == 8, timeout=20)  # GPU 0's and 2's 1g.5gb
    for gpu in sim_gpus("dgx-a100-mig"):
        if [m.profile for m in gpu.mig_devices] != ["1g.5gb"] * 7:
            inject(events, uuid=gpu.uuid, mig=["1g.5gb"] * 7)
    devices = kubelet.wait_for_devices("nvidia.com/gpu", lambda d: len(d) == 56, timeout=10)
    assert all(i.startswith("MIG-") for i in devices)
    assert "Traceback" not in plugin.log()


def test_interval_zero_turns_rescans_off(sock_dir: Path, kubelet: Kubelet, processes: list[Process]) -> None:
    plugin, events = start_rescanning(sock_dir, processes, "--mig-strategy", "mixed", interval=0)
    kubelet.wait_for_registration(MIG + "7g.40gb", timeout=20)
    assert "device rescan disabled" in plugin.log()
    inject(events, uuid=sim_gpus("dgx-a100-mig")[3].uuid, mig=["4g.20gb", "3g.20gb"])
    wait_until(lambda: "simulated MIG layout changed" in plugin.log(), timeout=5, what="sim layout line")
    with pytest.raises(TimeoutError):
        kubelet.wait_for_registration(MIG + "4g.20gb", timeout=1.0)
    plugin.send(signal.SIGHUP)  # the change was there all along: a reload serves it
    kubelet.wait_for_registration(MIG + "4g.20gb", timeout=10)
