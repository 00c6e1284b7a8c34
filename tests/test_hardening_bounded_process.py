"""Issue 26 item 2, as processes: a 200 KB deeply nested JSON (under every size limit) in a hand-over
record or in the DRA checkpoint used to raise RecursionError in the reading daemon (the device plugin
died; the DRA plugin crash-looped). Now each says it in one line and keeps serving."""

from __future__ import annotations

import shutil
import signal
import tempfile
from pathlib import Path

from nvdp.base.files import write_atomic
from nvdp.sim.kubelet import Kubelet
from testkit import start_plugin, wait_until
from tests.dra_support import DRIVER, dra_cluster, make_claim, schedule, slices_of
from tests.test_hardening_bounded import DEEP_ARRAY, DEEP_OBJECT, TOO_DEEP_JSON

GPU = "nvidia.com/gpu"


def the_line(log: str, start: str) -> str:
    (line,) = [li for li in log.splitlines() if start in li]
    return line


def test_the_device_plugin_keeps_serving_past_a_deeply_nested_dra_record(tmp_path: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="nvdp-deep-", dir="/tmp"))  # sockets: short paths
    kubelet = Kubelet(root / "device-plugins")
    try:
        records = root / "plugins" / DRIVER  # beside the kubelet directory: where the records are
        records.mkdir(parents=True)
        (root / "config.yaml").write_text("version: v1\n")
        kubelet.start()
        with start_plugin(
            root / "device-plugins",
            "sim:pcie-4",
            config_file=root / "config.yaml",
            log_path=tmp_path / "plugin.log",
        ) as plugin:
            kubelet.wait_for_registration(GPU, timeout=20)
            devices = kubelet.wait_for_devices(GPU, lambda d: len(d) == 4, timeout=20)
            write_atomic(records / "served-by-dra.json", DEEP_ARRAY.encode(), 0o644)  # whole
            wait_until(lambda: "GPU hand-over record unreadable" in plugin.log(), 10, "the record said")
            line = the_line(plugin.log(), "GPU hand-over record unreadable")
            assert line.endswith(f'path={records / "served-by-dra.json"} error="{TOO_DEEP_JSON}"')
            plugin.send(signal.SIGHUP)  # settled again: the record read again
            wait_until(lambda: "reloaded resources=" in plugin.log(), 20, "the reload")
            assert kubelet.devices(GPU).keys() == devices.keys()  # what it served, it serves on
            assert kubelet.allocate(GPU, [[sorted(devices)[0]]]).container_responses
            assert plugin.alive()
            assert "Traceback" not in plugin.log() and "RecursionError" not in plugin.log()
    finally:
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_the_dra_plugin_serves_past_a_deeply_nested_checkpoint_and_record(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:
        directory = cluster.node.checkpoint.parent
        directory.mkdir(parents=True)
        cluster.node.checkpoint.write_text(DEEP_OBJECT)
        process = cluster.start()
        cluster.registered()
        published = wait_until(lambda: slices_of(cluster.api), 20, "the slices")
        line = the_line(process.log(), "checkpoint unreadable")
        assert f'error="{TOO_DEEP_JSON}" kept_as={cluster.node.checkpoint}.bad-' in line
        write_atomic(directory / "served-by-device-plugin.json", DEEP_ARRAY.encode(), 0o644)  # read whole
        wait_until(lambda: "GPU hand-over record unreadable" in process.log(), 10, "the record said")
        line = the_line(process.log(), "GPU hand-over record unreadable")
        assert line.endswith(f'error="{TOO_DEEP_JSON}"')
        claim = make_claim(cluster.api, "one-gpu")
        assert schedule(cluster.api, claim) == ["gpu-0"]
        cluster.kubelet.start_pod("pod-1", DRIVER, [claim])  # prepared, and checkpointed anew
        assert claim.uid in cluster.node.checkpoint.read_text()
        assert slices_of(cluster.api) == published
        assert process.alive()
        assert "Traceback" not in process.log() and "RecursionError" not in process.log()
