"""`nvdp gfd` settings (NVIDIA's flags, env vars and precedence) and the loop, in-process."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from nvdp.base.errors import ConfigError, NvdpError
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.types import Nvml
from nvdp.side.gfd.options import DEFAULT_OUTPUT_FILE, GfdSettings
from nvdp.side.gfd.output import NodeFeatureOutput
from nvdp.side.gfd.run import Gfd
from testkit import wait_until
from tests.fakes import FakeNodeEventClient
from tests.kube_api_nodefeature import KubeApi
from tests.test_gfd_flags import parse


def test_defaults_are_nvidias() -> None:
    settings = parse()
    assert (settings.oneshot, settings.no_timestamp, settings.sleep_interval) == (False, False, 60.0)
    assert (
        settings.output_file == DEFAULT_OUTPUT_FILE == "/etc/kubernetes/node-feature-discovery/features.d/gfd"
    )
    assert settings.machine_type_file == "/sys/class/dmi/id/product_name"
    assert settings.use_node_feature_api is None  # NVIDIA's true where the API serves NodeFeatures
    assert settings.config.flags.mig_strategy == "none" and settings.config.flags.fail_on_init_error is True


def test_flag_beats_env_beats_config_file(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nflags:\n  migStrategy: single\n  gfd:\n    sleepInterval: 10s\n    oneshot: true\n"
        "    outputFile: /from/file\n"
    )
    from_file = parse("--config-file", str(config))
    assert (from_file.sleep_interval, from_file.oneshot, from_file.output_file) == (10.0, True, "/from/file")
    assert from_file.config.flags.mig_strategy == "single"
    env = {"GFD_SLEEP_INTERVAL": "20s", "GFD_OUTPUT_FILE": "/from/env", "GFD_MIG_STRATEGY": "mixed"}
    from_env = parse("--config-file", str(config), environ=env)
    assert (from_env.sleep_interval, from_env.output_file) == (20.0, "/from/env")
    assert from_env.config.flags.mig_strategy == "mixed"
    from_flag = parse(
        "--config-file", str(config), "--sleep-interval", "1m30s", "-o", "/from/flag", "--oneshot=false",
        environ=env,
    )  # fmt: skip
    assert (from_flag.sleep_interval, from_flag.output_file, from_flag.oneshot) == (90.0, "/from/flag", False)


def test_gfd_config_file_env_alias(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("version: v1\nflags:\n  useNodeFeatureAPI: true\n")
    settings = parse(environ={"GFD_CONFIG_FILE": str(config), "NODE_NAME": "n1", "POD_NAMESPACE": "ns"})
    assert settings.use_node_feature_api and (settings.node_name, settings.namespace) == ("n1", "ns")


def test_namespace_from_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "namespace").write_text("gpu-operator\n")
    settings = parse("--use-node-feature-api", "--node-name", "n1", token_dir=str(tmp_path / "namespace"))
    assert settings.namespace == "gpu-operator"


def test_every_bad_value_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as raised:
        parse("--sleep-interval", "60", "--mig-strategy", "all", environ={"GFD_ONESHOT": "maybe"})
    assert raised.value.problems == [
        '--mig-strategy / MIG_STRATEGY: invalid value "all" (accepted: none, single, mixed)',
        '--oneshot / GFD_ONESHOT: invalid value "maybe" (accepted: true, false, 1, 0)',
        '--sleep-interval / GFD_SLEEP_INTERVAL: invalid duration "60" (use a unit, e.g. 60s)',
    ]


# ---- the loop ----------------------------------------------------------------------------------


class RecordingOutput:
    def __init__(self) -> None:
        self.writes: list[dict[str, str]] = []
        self.removed = 0

    def write(self, labels: Mapping[str, str]) -> bool:
        self.writes.append(dict(labels))
        return True

    def remove(self) -> None:
        self.removed += 1


class FailingInit:
    def __init__(self) -> None:
        self.inner = open_nvml("sim:pcie-4")

    def init(self) -> None:
        raise NvdpError("nvmlInit failed: NVML_ERROR_LIBRARY_NOT_FOUND")

    def shutdown(self) -> None:
        pass


def _settings(**overrides: object) -> GfdSettings:
    base = parse("--nvml", "sim:pcie-4", "--machine-type-file", "")
    from dataclasses import replace

    return replace(base, **overrides)  # type: ignore[arg-type]


def test_loop_sleeps_until_the_interval_or_a_signal_and_reloads() -> None:
    recorder = RecordingOutput()
    reloaded = _settings(sleep_interval=3600.0, no_timestamp=True)
    gfd = Gfd(
        _settings(sleep_interval=3600.0),
        reload_settings=lambda: reloaded,
        output_factory=lambda settings, stop: recorder,
        clock=lambda: 1700000000.0,
    )
    thread = threading.Thread(target=gfd.run)
    thread.start()
    try:
        wait_until(lambda: gfd.passes == 1, 20, "first pass")
        time.sleep(0.2)  # no busy loop: nothing more happens until the interval or a signal
        assert gfd.passes == 1
        assert recorder.writes[0]["nvidia.com/gfd.timestamp"] == "1700000000"
        gfd.request_reload()
        wait_until(lambda: gfd.passes == 2, 20, "pass after reload")
        assert "nvidia.com/gfd.timestamp" not in recorder.writes[1]
        assert gfd.settings is reloaded
    finally:
        gfd.request_stop()
        thread.join(10)
    assert not thread.is_alive() and recorder.removed == 1


def test_failed_reload_keeps_the_current_config() -> None:
    recorder = RecordingOutput()

    def bad() -> GfdSettings:
        raise ConfigError("config.yaml: flags.migStrategy: invalid value")

    first = _settings(sleep_interval=3600.0)
    gfd = Gfd(first, reload_settings=bad, output_factory=lambda settings, stop: recorder)
    thread = threading.Thread(target=gfd.run)
    thread.start()
    try:
        wait_until(lambda: gfd.passes == 1, 20, "first pass")
        gfd.request_reload()
        wait_until(lambda: gfd.passes == 2, 20, "second pass")
        assert gfd.settings is first
    finally:
        gfd.request_stop()
        thread.join(10)


def _failing(settings: GfdSettings) -> Nvml:
    return FailingInit()  # type: ignore[return-value]


def test_nvml_init_failure_is_fatal_with_fail_on_init_error() -> None:
    gfd = Gfd(
        _settings(oneshot=True),
        reload_settings=_settings,
        output_factory=lambda settings, stop: RecordingOutput(),
        nvml_factory=_failing,
    )
    with pytest.raises(NvdpError, match="NVML init failed: nvmlInit failed: NVML_ERROR_LIBRARY_NOT_FOUND"):
        gfd.run()


def test_nvml_init_failure_without_fail_on_init_error_writes_only_the_timestamp() -> None:
    settings = parse("--nvml", "sim:pcie-4", "--oneshot", "--fail-on-init-error=false")
    recorder = RecordingOutput()
    gfd = Gfd(
        settings,
        reload_settings=lambda: settings,
        output_factory=lambda s, stop: recorder,
        nvml_factory=_failing,
        clock=lambda: 5.0,
    )
    gfd.run()
    assert recorder.writes == [{"nvidia.com/gfd.timestamp": "5"}]


def test_machine_type_file_missing_is_unknown(tmp_path: Path) -> None:
    recorder = RecordingOutput()
    settings = _settings(oneshot=True, machine_type_file=str(tmp_path / "missing"))
    Gfd(settings, reload_settings=lambda: settings, output_factory=lambda s, stop: recorder).run()
    assert recorder.writes[0]["nvidia.com/gpu.machine"] == "unknown"


# ---- the NodeFeature output, through the real client against the stand-in ----------------------


def test_node_feature_retries_with_backoff_then_gives_up_with_one_line() -> None:
    from nvdp.kube import new_api_client

    with KubeApi() as api:
        output = NodeFeatureOutput(
            "node-b",
            "ns",
            api_factory=lambda: new_api_client(host=api.url, retries=0),
            attempts=3,
            backoff=0.01,
        )
        api.fail_next(2, 503)
        assert output.write({"nvidia.com/gpu.count": "1"}) is True
        assert [r.status for r in api.requests] == [503, 503, 404, 201]
        assert output.write({"nvidia.com/gpu.count": "1", "nvidia.com/gfd.timestamp": "9"}) is False
        api.fail_next(3, 500)
        with pytest.raises(NvdpError) as raised:
            output.write({"nvidia.com/gpu.count": "2"})
        assert (
            str(raised.value)
            == "NodeFeature ns/nvidia-features-for-node-b: API error 500 Internal Server Error"
        )


def test_feature_file_rewritten_only_when_labels_change(tmp_path: Path) -> None:
    from nvdp.side.gfd.output import FileOutput

    path = tmp_path / "gfd"
    output = FileOutput(str(path))
    assert output.write({"nvidia.com/gpu.count": "4", "nvidia.com/gfd.timestamp": "1"}) is True
    inode = path.stat().st_ino
    assert output.write({"nvidia.com/gpu.count": "4", "nvidia.com/gfd.timestamp": "2"}) is False
    assert path.stat().st_ino == inode and "timestamp=1\n" in path.read_text()
    assert output.write({"nvidia.com/gpu.count": "2", "nvidia.com/gfd.timestamp": "3"}) is True
    assert path.read_text() == "nvidia.com/gfd.timestamp=3\nnvidia.com/gpu.count=2\n"
    path.unlink()  # removed behind our back: written again even though the labels are the same
    assert output.write({"nvidia.com/gpu.count": "2", "nvidia.com/gfd.timestamp": "4"}) is True
    output.remove()
    output.remove()
    assert not path.exists()


def test_node_feature_already_up_to_date_is_left_alone() -> None:
    from nvdp.kube import new_api_client, node_feature_body

    path = "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/ns/nodefeatures/nvidia-features-for-node-c"
    with KubeApi() as api:
        api.objects[path] = node_feature_body("nvidia-features-for-node-c", "ns", "node-c", {"a": "1"})
        api.objects[path]["metadata"]["resourceVersion"] = "7"
        output = NodeFeatureOutput(
            "node-c", "ns", api_factory=lambda: new_api_client(host=api.url, retries=0)
        )
        assert output.write({"a": "1", "nvidia.com/gfd.timestamp": "5"}) is False
        assert [(r.method, r.status) for r in api.requests] == [("GET", 200)]
        assert output.write({"a": "2"}) is True
        assert [r.method for r in api.requests] == ["GET", "GET", "PUT"]
        stored = api.get(path)
        assert stored is not None and stored["spec"] == {"features": {}, "labels": {"a": "2"}}
        assert stored["metadata"]["resourceVersion"] == "1"


# ---- node facts never end the loop ---------------------------------------------------------------

CASE1_CONFIG = Path(__file__).parent / "data" / "gfd" / "configs" / "ts-unmatched.yaml"


def test_misfits_are_reported_once_across_passes_with_a_node_event(caplog: pytest.LogCaptureFixture) -> None:
    from nvdp.node.health.node_events import NodeEventRecorder

    caplog.set_level(logging.INFO)
    client = FakeNodeEventClient()
    recorder = RecordingOutput()
    case1 = parse("--nvml", "sim:dgx-a100", "--config-file", str(CASE1_CONFIG))
    settings = _settings(sleep_interval=3600.0, config=case1.config, runtime=case1.runtime)
    gfd = Gfd(
        settings,
        reload_settings=lambda: settings,
        output_factory=lambda s, stop: recorder,
        events_factory=lambda s: NodeEventRecorder(lambda: client, node="n"),
    )
    thread = threading.Thread(target=gfd.run)
    thread.start()
    try:
        for n in range(1, 4):  # three passes, one misfit
            wait_until(lambda n=n: gfd.passes == n, 20, f"pass {n}")
            gfd.request_reload()
    finally:
        gfd.request_stop()
        thread.join(10)
    assert not thread.is_alive()
    entry = "sharing.timeSlicing.resources[1]"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and entry in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].getMessage() == (
        f"{entry}: nvidia.com/mig-1g.5gb matches no resource on this node; entry not applied "
        "(it could match: nvidia.com/gpu)"
    )
    assert [(t, r) for t, r, _ in client.posted] == [("Warning", "SharingEntryUnmatched")]
    assert dict(gfd.misfits.seen()) == {"SharingEntryUnmatched": 1}
    # the other entry applies: the node is labelled as NVIDIA's gfd labels it
    labels = recorder.writes[-1]
    assert labels["nvidia.com/gpu.replicas"] == "2"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-SHARED"


class FailingOutput(RecordingOutput):
    """An output whose writes fail (a full or read-only disk) while `failing` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = True
        self.attempts = 0

    def write(self, labels: Mapping[str, str]) -> bool:
        self.attempts += 1
        if self.failing:
            raise NvdpError("cannot write labels to /x/gfd: No space left on device")
        return super().write(labels)


def test_a_failed_write_keeps_the_loop_and_is_one_line_until_it_works(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    output = FailingOutput()
    settings = _settings(sleep_interval=3600.0)
    gfd = Gfd(settings, reload_settings=lambda: settings, output_factory=lambda s, stop: output)
    thread = threading.Thread(target=gfd.run)
    thread.start()
    try:
        for n in range(1, 4):  # three failed passes
            wait_until(lambda n=n: output.attempts == n and gfd.passes == n, 20, f"pass {n}")
            if n < 3:
                gfd.request_reload()
        assert thread.is_alive() and output.removed == 0, "the labels on disk stay while it fails"
        output.failing = False  # before the next pass is asked for: a fourth may not fail first
        gfd.request_reload()
        wait_until(lambda: output.writes, 20, "labels written once the disk has room")
    finally:
        gfd.request_stop()
        thread.join(10)
    assert not thread.is_alive() and output.removed == 1
    failed = [r for r in caplog.records if r.getMessage().startswith("labels not published")]
    assert len(failed) == 1 and failed[0].levelno == logging.ERROR
    assert (
        failed[0].__dict__["nvdp_fields"]["error"] == "cannot write labels to /x/gfd: No space left on device"
    )
    assert [r.getMessage() for r in caplog.records].count("labels published again") == 1
    assert gfd.publish_error is None


def test_a_failed_write_in_oneshot_is_an_error() -> None:
    output = FailingOutput()
    settings = _settings(oneshot=True)
    gfd = Gfd(settings, reload_settings=lambda: settings, output_factory=lambda s, stop: output)
    with pytest.raises(NvdpError, match="No space left on device"):
        gfd.run()
