"""`nvdp dra-kubelet-plugin`'s HTTP endpoint (`--metrics-address`): /readyz names each reason until the
plugin is registered, serves its sockets and has published its slices; /healthz follows the main loop
(stuck: 503, then 200 again); /metrics counts claims prepared and unprepared, their errors, slice
writes, failed publishes, XIDs, misfits and NVML failures; "" serves nothing, and a taken port is one
ERROR line while the plugin serves on. Processes over real sockets with the kubelet and API stand-ins,
and the driver in this process where its main loop must be held."""

from __future__ import annotations

import re
import socket
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from nvdp.config import Config, RuntimeOptions
from nvdp.plugins.dra.driver import DraDriver
from nvdp.plugins.dra.options import DraSettings
from nvdp.plugins.kubeletplugin import loop_watch
from nvdp.plugins.kubeletplugin.loop_watch import LoopWatch
from nvdp.sim.dra.api import MemoryResourceApi
from nvdp.sim.kubelet.dra import Claim
from testkit import free_port, wait_until
from tests.builders import append_sim_event, sim_gpus
from tests.dra_support import DraCluster, dra_cluster, make_claim, published, schedule, serve_dra, slices_of
from tests.readings import http_get
from tests.test_cdi import Clock
from tests.test_metrics import parse_families, value

DRIVER = "gpu.nvidia.com"
PREPARE, UNPREPARE = "NodePrepareResources", "NodeUnprepareResources"


def readyz(port: int) -> tuple[int, list[str]]:
    code, body = http_get(port, "/readyz")
    return code, body.splitlines()


def metrics(port: int) -> str:
    code, text = http_get(port, "/metrics")
    assert code == 200
    parse_families(text)  # well-formed
    return text


def with_endpoint(cluster: DraCluster) -> int:
    port = free_port()
    cluster.metrics_address = f"127.0.0.1:{port}"
    return port


def test_readyz_names_each_reason_until_registered_and_published(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:
        cluster.watcher.stop()  # no kubelet yet
        cluster.api.put("/apis/resource.k8s.io", {"kind": "APIGroup", "versions": []})  # no DRA yet
        port = with_endpoint(cluster)
        cluster.start()
        expected = [
            "not registered with the kubelet",
            "ResourceSlices not published yet: the API server serves no version of resource.k8s.io nvdp"
            " speaks (v1, v1beta2, v1beta1): is DRA enabled in this cluster?",
        ]
        wait_until(lambda: readyz(port) == (503, expected), 20, "/readyz naming both reasons")
        assert http_get(port, "/healthz") == (200, "ok\n")
        failures = value(metrics(port), "nvdp_dra_slice_publish_failures_total")
        assert failures is not None and failures >= 1

        serve_dra(cluster.api)  # the cluster gets DRA: the publisher's retry publishes
        wait_until(lambda: readyz(port) == (503, expected[:1]), 20, "only the registration missing")
        assert slices_of(cluster.api)
        cluster.watcher.start()
        cluster.registered()
        wait_until(lambda: readyz(port) == (200, ["ok"]), 10, "/readyz 200")
        text = metrics(port)
        assert value(text, "nvdp_kubelet_registrations_total", resource=DRIVER, kind="first") == 1
        assert value(text, "nvdp_dra_slice_writes_total") == 1
        assert value(text, "nvdp_dra_devices", type="gpu") == 4
        assert value(text, "nvdp_dra_devices", type="mig") == 0

        cluster.watcher.restart()  # a kubelet restart registers the plugin again
        cluster.registered(after=1)
        wait_until(
            lambda: value(metrics(port), "nvdp_kubelet_registrations_total", kind="re-registration") == 1,
            10,
            "the re-registration counted",
        )
        assert readyz(port) == (200, ["ok"])


def test_prepare_unprepare_errors_and_an_xid_move_the_metrics(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.touch()
    with dra_cluster(tmp_path, env={"NVDP_SIM_EVENTS": str(events)}) as cluster:
        port = with_endpoint(cluster)
        cluster.start()
        cluster.registered()
        wait_until(lambda: readyz(port)[0] == 200, 10, "ready")
        text = metrics(port)
        for method in (PREPARE, UNPREPARE):
            for result in ("ok", "error"):
                assert value(text, "nvdp_dra_claims_total", method=method, result=result) == 0
        assert value(text, "nvdp_dra_prepared_claims") == 0

        good = make_claim(cluster.api, "good")
        schedule(cluster.api, good)
        missing = Claim("ns", "missing", "uid-missing")
        answer = cluster.kubelet.node_prepare(DRIVER, [good, missing]).claims
        assert not answer[good.uid].error and answer[missing.uid].error
        text = metrics(port)
        assert value(text, "nvdp_dra_claims_total", method=PREPARE, result="ok") == 1
        assert value(text, "nvdp_dra_claims_total", method=PREPARE, result="error") == 1
        rpc = {"resource": DRIVER, "method": PREPARE}
        assert value(text, "nvdp_grpc_requests_total", **rpc, code="OK") == 1
        assert value(text, "nvdp_grpc_request_duration_seconds_count", **rpc, result="ok") == 1
        assert value(text, "nvdp_dra_prepared_claims") == 1

        cluster.kubelet.node_unprepare(DRIVER, [good])
        text = metrics(port)
        assert value(text, "nvdp_dra_claims_total", method=UNPREPARE, result="ok") == 1
        assert value(text, "nvdp_grpc_requests_total", resource=DRIVER, method=UNPREPARE, code="OK") == 1
        assert value(text, "nvdp_dra_prepared_claims") == 0

        gpu2 = sim_gpus("pcie-4")[2].uuid
        assert value(text, "nvdp_dra_device_healthy", device="gpu-2", type="gpu", reason="") == 1
        append_sim_event(events, uuid=gpu2, xid=79)
        wait_until(lambda: published(cluster.api)["gpu-2"].get("taints"), 5, "gpu-2 tainted")
        # the publisher counts its write once the API server has answered it: after the taint is there
        wait_until(
            lambda: (value(metrics(port), "nvdp_dra_slice_writes_total") or 0) >= 2, 5, "the write counted"
        )
        text = metrics(port)
        (sample,) = [s for s in parse_families(text)["nvdp_dra_device_healthy"].samples if s[2] == 0]
        assert sample[1]["device"] == "gpu-2" and sample[1]["reason"].startswith("XID 79: ")
        assert value(text, "nvdp_health_events_total", xid="79") == 1
        assert value(text, "nvdp_dra_slice_writes_total") == 2  # published, then tainted
        assert readyz(port) == (200, ["ok"])  # an Unhealthy device is the slice's news, not the pod's


def test_a_misfit_and_mig_devices_are_counted_and_the_plugin_is_ready(tmp_path: Path) -> None:
    config = "version: v1\ndra:\n  devices: [0, 9]\n"  # GPU 0 (MIG-enabled) and one the node lacks
    with dra_cluster(tmp_path, "sim:dgx-a100-mig", config=config) as cluster:
        port = with_endpoint(cluster)
        cluster.start()
        cluster.registered()
        wait_until(lambda: readyz(port) == (200, ["ok"]), 10, "ready")
        said = [d["attributes"]["type"]["string"] for d in published(cluster.api).values()]
        assert said and set(said) == {"mig"}
        text = metrics(port)
        assert value(text, "nvdp_dra_devices", type="mig") == len(said)
        assert value(text, "nvdp_dra_devices", type="gpu") == 0
        assert value(text, "nvdp_node_misfits", reason="DraDevicesMissing") == 1
        assert value(text, "nvdp_node_misfits_total", reason="DraDevicesMissing") == 1


def test_a_node_whose_entry_gives_dra_no_gpu_is_ready(tmp_path: Path) -> None:
    """An empty pool is published: a fleet's rollout does not stall on nodes still with the device plugin."""
    with dra_cluster(tmp_path, config="version: v1\n") as cluster:
        port = with_endpoint(cluster)
        cluster.start()
        cluster.registered()
        wait_until(lambda: readyz(port) == (200, ["ok"]), 10, "ready")
        (empty,) = slices_of(cluster.api)
        assert empty["spec"]["pool"]["resourceSliceCount"] == 1 and empty["spec"].get("devices", []) == []
        text = metrics(port)
        assert (value(text, "nvdp_dra_devices", type="gpu"), value(text, "nvdp_dra_devices", type="mig")) == (
            0,
            0,
        )


def test_nvml_failing_at_start_is_not_ready_but_live(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:
        cluster.nvml = "real"  # no libnvidia-ml here: NVML init fails, and is retried
        port = with_endpoint(cluster)
        cluster.start()
        wait_until(lambda: "cannot initialise NVML; retrying" in cluster.log(), 20, "the NVML failure")
        code, lines = readyz(port)
        assert code == 503
        assert lines[0].startswith("NVML not initialised, retrying: load libnvidia-ml.so.1 failed: ")
        assert "not registered with the kubelet" in lines
        assert http_get(port, "/healthz") == (200, "ok\n")  # a restart would not bring the driver
        failed = value(metrics(port), "nvdp_nvml_errors_total", call="load libnvidia-ml.so.1")
        assert failed is not None and failed >= 1


def test_an_empty_address_serves_nothing(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:
        port = free_port()
        cluster.env["METRICS_ADDRESS"] = f"127.0.0.1:{port}"  # the flag's "" wins over the env var
        cluster.metrics_address = ""
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")
        assert '"metricsAddress":""' in cluster.log()
        assert "serving metrics" not in cluster.log() and http_get(port, "/healthz") == (0, "")


def test_a_taken_port_is_one_error_line_and_claims_are_still_served(tmp_path: Path) -> None:
    with socket.socket() as squatter, dra_cluster(tmp_path) as cluster:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        cluster.metrics_address = f"127.0.0.1:{squatter.getsockname()[1]}"
        process = cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")
        claim = make_claim(cluster.api, "one")
        schedule(cluster.api, claim)
        assert not cluster.kubelet.node_prepare(DRIVER, [claim]).claims[claim.uid].error
        errors = [line for line in cluster.log().splitlines() if " ERROR " in line]
        assert len(errors) == 1 and "metrics endpoint disabled; serving devices without it" in errors[0]
        assert "Traceback" not in cluster.log() and process.alive()


# ---- the main loop's liveness ---------------------------------------------------------------------


def test_a_stuck_main_loop_fails_healthz_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop_watch, "STUCK_AFTER_S", 0.5)
    (tmp_path / "driver").mkdir()
    config = Config()
    config = replace(config, flags=replace(config.flags, nvidia_driver_root=str(tmp_path / "driver")))
    settings = DraSettings(
        config=config,
        runtime=RuntimeOptions(nvml="sim:pcie-4", metrics_address="127.0.0.1:0", device_rescan_interval=0),
        node_name="node-a",
        cdi_root=str(tmp_path / "cdi"),
        kubelet_registrar_directory_path=str(tmp_path / "registry"),
        kubelet_plugins_directory_path=str(tmp_path / "plugins"),
    )
    entered, release = threading.Event(), threading.Event()

    def hung_reload() -> DraSettings:  # a reload that does not come back (a hung file system, say)
        entered.set()
        release.wait(30)
        return settings

    driver = DraDriver(settings, {}, api=MemoryResourceApi(), reload=hung_reload)
    thread = threading.Thread(target=driver.run, name="dra-under-test", daemon=True)
    thread.start()
    try:
        port = wait_until(lambda: driver.status is not None and driver.status.port, 10, "the endpoint")
        wait_until(lambda: driver.preparer is not None, 10, "started")
        wait_until(lambda: http_get(port, "/healthz") == (200, "ok\n"), 10, "/healthz 200")
        driver.request_reload()
        assert entered.wait(10)
        code, body = wait_until(lambda: (r := http_get(port, "/healthz"))[0] == 503 and r, 10, "503")
        assert re.fullmatch(r"main loop stuck: busy with [a-z,]*reload[a-z,]* for \d+s\n", body), body
        release.set()
        wait_until(lambda: http_get(port, "/healthz") == (200, "ok\n"), 10, "/healthz 200 again")
        assert value(metrics(port), "nvdp_config_reloads_total", result="success") == 1
    finally:
        release.set()
        driver.request_stop()
        thread.join(10)
    assert not thread.is_alive() and http_get(port, "/healthz") == (0, "")  # stopped with the driver


@pytest.mark.parametrize(
    ("steps", "problem"),
    [
        pytest.param([("idle", 0), ("wait", 3600)], None, id="asleep-with-nothing-to-do"),
        pytest.param([("busy", 0), ("wait", 59)], None, id="busy-for-a-while"),
        pytest.param(
            [("busy", 0), ("wait", 61)], "main loop stuck: busy with rescan for 61s", id="busy-too-long"
        ),
        pytest.param(
            [("idle", 0), ("woken", 0), ("wait", 61)],
            "main loop stuck: woken 61s ago and not yet taken up",
            id="wake-not-taken-up",
        ),
        pytest.param([("woken", 0), ("wait", 61), ("busy", 0), ("idle", 0)], None, id="taken-up-late"),
        pytest.param(
            [("woken", 0), ("wait", 30), ("woken", 0), ("wait", 31)],
            "main loop stuck: woken 61s ago and not yet taken up",
            id="first-wake-counts",
        ),
    ],
)
def test_loop_watch(steps: list[tuple[str, float]], problem: str | None) -> None:
    clock = Clock()
    watch = LoopWatch(clock)
    for step, seconds in steps:
        if step == "wait":
            clock.now += seconds
        elif step == "busy":
            watch.busy("rescan")
        else:
            getattr(watch, step)()
    assert watch.problem() == problem
