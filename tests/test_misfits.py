"""Node facts that do not fit the config (misfits): reported once each as a WARNING line, a Node event
and a metric; the rest of the node is served; a resource left without devices makes /readyz fail."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nvdp.node.gpus.misfit_report import MisfitReport
from nvdp.node.gpus.misfits import Misfit
from nvdp.plugins.metrics import Probes
from nvdp.sim.kubelet import Kubelet
from testkit import free_port, start_plugin, wait_until
from tests.builders import sim_gpus
from tests.fakes import FakeEventSink
from tests.readings import http_get

GPU = "nvidia.com/gpu"
UNMATCHED = Misfit("SharingEntryUnmatched", "sharing.timeSlicing.resources[0]", "entry 0 matches nothing")
NO_NODES = Misfit("DeviceNodesMissing", "/dev/nvidia0", "no device nodes", withholds=(GPU,))


def test_a_new_misfit_is_one_warning_and_one_event_until_it_goes(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nvdp.node.gpus.misfit_report")
    events = FakeEventSink()
    report = MisfitReport(events)
    report.update("resources", [UNMATCHED])
    report.update("resources", [UNMATCHED])  # a reload that sees it again: said once
    report.update("cdi", [NO_NODES])
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "entry 0 matches nothing"),
        ("WARNING", "no device nodes"),
    ]
    assert events.recorded == [
        ("Warning", "SharingEntryUnmatched", "entry 0 matches nothing"),
        ("Warning", "DeviceNodesMissing", "no device nodes"),
    ]
    assert report.current() == [UNMATCHED, NO_NODES]
    assert report.withheld() == {GPU: "no device nodes"}
    caplog.clear()
    report.update("cdi", [])
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("INFO", "resolved")]
    assert report.withheld() == {}
    report.update("cdi", [NO_NODES])  # back again: a new fact, said again
    assert report.seen() == {"SharingEntryUnmatched": 1, "DeviceNodesMissing": 2}
    assert len(events.recorded) == 3


class _Registrations:
    servers: dict[str, object] = {}
    started = True

    def registrations(self) -> dict[str, bool]:
        return {}


def test_readiness_names_a_resource_a_misfit_withholds() -> None:
    report = MisfitReport()
    probes = Probes(_Registrations(), misfits=report)  # type: ignore[arg-type]
    report.update("resources", [UNMATCHED])  # a ConfigMap entry that does not apply: normal, still ready
    assert probes.readiness_problem() is None
    report.update("cdi", [NO_NODES])
    assert probes.readiness_problem() == "withheld by a node fact: nvidia.com/gpu (no device nodes)"


def test_a_sharing_entry_for_a_resource_the_node_lacks_leaves_the_others_applied(
    sock_dir: Path, tmp_path: Path
) -> None:
    """Issue case 1: one ConfigMap for MIG and whole-GPU nodes, on a node without MIG."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/mig-1g.5gb\n      replicas: 4\n"
        "    - name: nvidia.com/gpu\n      replicas: 2\n"
    )
    port = free_port()
    with Kubelet(sock_dir) as kubelet:
        with start_plugin(sock_dir, config_file=config, metrics_address=f"127.0.0.1:{port}") as plugin:
            kubelet.wait_for_registration(GPU, timeout=20)
            devices = kubelet.wait_for_devices(GPU, lambda d: len(d) == 16)
            assert f"{sim_gpus('dgx-a100')[7].uuid}::1" in devices
            wait_until(lambda: http_get(port, "/readyz")[0] == 200, 10, "ready")
            _, metrics = http_get(port, "/metrics")
            assert 'nvdp_node_misfits{reason="SharingEntryUnmatched"} 1' in metrics
            assert 'nvdp_node_misfits_total{reason="SharingEntryUnmatched"} 1' in metrics
            warnings = [line for line in plugin.log().splitlines() if " WARNING " in line]
            assert [line.split(" WARNING ", 1)[1] for line in warnings] == [
                "sharing.timeSlicing.resources[0]: nvidia.com/mig-1g.5gb matches no resource on this node; "
                "entry not applied (it could match: nvidia.com/gpu) reason=SharingEntryUnmatched"
            ]
            assert plugin.alive()
