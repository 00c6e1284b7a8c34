"""`nvdp config-manager` when things go wrong, against the Kubernetes API stand-in (real `kubernetes`
client): a restarted pod whose label names no entry keeps the entry last applied on the node (the
Node annotation), a config that cannot be put in place is retried with backoff while /readyz fails,
and the record on the Node is retried when the API fails and never fought over between managers."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from nvdp import kube
from nvdp.base.logs import FIELDS_ATTR
from nvdp.side.configmanager.command import NodeAnnotationRecord
from nvdp.side.configmanager.manager import ConfigManager
from nvdp.side.configmanager.settings import APPLIED_ANNOTATION, Settings
from testkit import Process, clean_env, free_port, wait_until
from tests import test_config_manager
from tests.kube_api_standin import KubeApiStandin
from tests.readings import http_get
from tests.test_config_manager import LABEL, NODE, NODE_PATH, ConfigMapDir, manager_argv, ts

REFUSED = "DevicePluginConfigRefused"
FAILED = "DevicePluginConfigFailed"


# test_config_manager's fixture (the Kubernetes API stand-in serving the Node), used here by name
api = test_config_manager.api


class ManagedNode:
    """The stand-in's Node, a ConfigMap directory and config-manager processes for it."""

    def __init__(self, base: Path, api: KubeApiStandin, processes: list[Process]) -> None:
        self.base, self.api, self.processes = base, api, processes
        self.kubeconfig = api.write_kubeconfig(base / "kubeconfig")
        self.src = ConfigMapDir(base / "src", {"a": ts(2), "ts4": ts(4), "default": "version: v1\n"})

    def manager(self, dst: Path, *extra: str, log: str) -> Process:
        argv = manager_argv(self.kubeconfig, self.src.root, dst, self.base / "no-such-plugin", *extra)
        argv += ["--fallback-strategies", "named"]
        process = Process(argv, self.base / log, clean_env({"SEND_SIGNAL": "false"}))
        self.processes.append(process)
        return process

    def init(self, dst: Path, log: str) -> Process:
        """The init container of a pod (re)started with an empty emptyDir at dst's directory."""
        init = self.manager(dst, "--oneshot", log=log)
        assert init.wait(30) == 0, init.log()
        return init

    def label(self, value: str | None) -> None:
        self.api.patch_labels(NODE_PATH, {LABEL: value})

    def recorded(self) -> str | None:
        annotations: dict[str, str] = self.api.objects[NODE_PATH]["metadata"].get("annotations") or {}
        return annotations.get(APPLIED_ANNOTATION)

    def events(self, reason: str) -> list[str]:
        return [str(e["message"]) for e in self.api.created if e["reason"] == reason]

    def target(self, dst: Path) -> str:
        return os.path.basename(os.readlink(dst))


@pytest.fixture
def node(tmp_path: Path, api: KubeApiStandin, processes: list[Process]) -> ManagedNode:
    return ManagedNode(tmp_path, api, processes)


# ---- case: a bad label must not shrink the node at its next restart ------------------------------


@pytest.mark.soak
def test_a_restarted_pod_keeps_the_entry_last_applied_when_its_label_names_none(node: ManagedNode) -> None:
    """On entry ts4 (32 replicas), a label naming no entry kept ts4 while the pod ran, but the init
    container of a restarted pod fell back to the default entry (8 devices)."""
    plugin, gfd = node.base / "plugin" / "config.yaml", node.base / "gfd" / "config.yaml"
    node.label("ts4")
    node.init(plugin, "init-1.log")
    assert node.target(plugin) == "ts4" and node.recorded() == "ts4"

    # A label naming no entry, then both pods restart (new emptyDirs): each keeps ts4 and says why.
    node.label("ts-4")
    plugin.unlink()
    for dst, log in ((plugin, "init-2.log"), (gfd, "gfd-init.log")):
        init = node.init(dst, log)
        assert node.target(dst) == "ts4", init.log()
        (line,) = [line for line in init.log().splitlines() if "ERROR" in line]
        assert "label=ts-4" in line and "no config entry named 'ts-4'" in line
        assert "using ts4 (the entry last applied on this node)" in line
    assert len(node.events(REFUSED)) == 2 and node.recorded() == "ts4"

    # The entry recorded is gone from the ConfigMap: the default, and the line says so.
    node.src.update({"a": ts(2), "default": "version: v1\n"})
    plugin.unlink()
    init = node.init(plugin, "init-3.log")
    assert node.target(plugin) == "default"
    assert "the entry last applied on this node, 'ts4', is not an entry any more; using default" in init.log()
    assert node.recorded() == "default"

    # The label fixed while the sidecar runs: applied and recorded.
    sidecar = node.manager(plugin, log="sidecar.log")
    wait_until(lambda: "watching node label" in sidecar.log(), 20, "sidecar start")
    node.label("a")
    wait_until(lambda: node.target(plugin) == "a" and node.recorded() == "a", 10, "a applied and recorded")
    assert sidecar.stop() == 0
    assert "Traceback" not in sidecar.log()


# ---- case: a config that cannot be put in place is retried, /readyz false meanwhile --------------


@pytest.mark.soak
def test_a_config_that_cannot_be_put_in_place_is_retried_and_readyz_fails_meanwhile(
    node: ManagedNode,
) -> None:
    """A failed apply was reported once and never retried: the node kept the old entry while its
    label named another, /readyz 200, until the next label change."""
    dst = node.base / "dst" / "config.yaml"
    port = free_port()
    node.label("a")
    sidecar = node.manager(dst, "--metrics-address", f"127.0.0.1:{port}", log="sidecar.log")
    wait_until(lambda: dst.is_symlink() and node.target(dst) == "a", 20, "entry a applied")
    wait_until(lambda: http_get(port, "/readyz")[0] == 200, 10, "ready")

    # The destination's directory cannot be written (here: a file stands where it was).
    (node.base / "dst").rename(node.base / "dst-away")
    (node.base / "dst").write_text("")
    node.label("ts4")
    wait_until(lambda: "retrying" in sidecar.log(), 10, "the failure reported")
    code, body = http_get(port, "/readyz")
    assert code == 503 and body.startswith(f"config not in place, retrying: cannot link {dst}: ")
    assert "nvdp_config_manager_apply_failing 1" in http_get(port, "/metrics")[1]

    # Fixed: no label or ConfigMap change follows, so only a retry can apply it.
    (node.base / "dst").unlink()
    (node.base / "dst-away").rename(node.base / "dst")
    wait_until(lambda: node.target(dst) == "ts4", 20, "applied by a retry")
    wait_until(lambda: http_get(port, "/readyz")[0] == 200, 10, "ready again")
    assert "nvdp_config_manager_apply_failing 0" in http_get(port, "/metrics")[1]
    errors = [line for line in sidecar.log().splitlines() if "config not applied" in line]
    assert len(errors) == 1 and "label=ts4" in errors[0] and "current=a" in errors[0], errors
    assert len(node.events(FAILED)) == 1 and node.events(REFUSED) == []
    assert sidecar.stop() == 0


# ---- the record on the Node ----------------------------------------------------------------------


def test_the_record_is_retried_when_the_api_fails_and_never_fought_over(
    node: ManagedNode, caplog: pytest.LogCaptureFixture
) -> None:
    dst = node.base / "dst" / "config.yaml"
    dst.parent.mkdir()
    dst.symlink_to(node.src.root / "a")  # as the init container of a version without the record left it
    client = kube.new_api_client(kubeconfig=str(node.kubeconfig), retries=0)
    settings = Settings(NODE, str(node.src.root), str(dst), send_signal=False)
    manager = ConfigManager(settings, record=NodeAnnotationRecord(client, NODE), retry_initial=0.05)
    node.api.fail(500, 3, method="PATCH")
    manager.set_labels({LABEL: "a"}, {})
    stop = threading.Event()
    thread = threading.Thread(target=manager.run, args=(stop,), daemon=True)
    with caplog.at_level(logging.INFO, logger="nvdp.side.configmanager.manager"):
        thread.start()
        wait_until(lambda: node.recorded() == "a", 10, "the entry in place recorded")
        stop.set()
        manager.wake()
        thread.join(5)
    assert node.api.count("PATCH", NODE_PATH) == 4  # 3 failures, then the record
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage().startswith("cannot record the applied config on the node; retrying")
    assert getattr(warning, FIELDS_ATTR) == {
        "entry": "a",
        "error": f"cannot annotate node {NODE}: HTTP 500 injected failure 500",
    }

    # Another manager of the node (its ConfigMap mount ahead of ours) records ts4: ours, still on a,
    # does not write a back; once it applies an entry itself, it records that.
    node.api.merge_patch(NODE_PATH, {"metadata": {"annotations": {APPLIED_ANNOTATION: "ts4"}}})
    manager.set_labels({LABEL: "a"}, {APPLIED_ANNOTATION: "ts4"})
    assert not manager.reconcile().changed
    assert node.api.count("PATCH", NODE_PATH) == 4 and node.recorded() == "ts4"
    manager.set_labels({LABEL: "default"}, {APPLIED_ANNOTATION: "ts4"})
    assert manager.reconcile().changed and node.recorded() == "default"
    assert node.api.count("PATCH", NODE_PATH) == 5


class RaceyRecord:
    """An AppliedRecord whose first write is answered only after the Node's watch saw the record
    and then saw it removed (another pod's config-manager, at an uninstall of its own DaemonSet)."""

    def __init__(self) -> None:
        self.written: list[str] = []
        self.manager: ConfigManager | None = None

    def write(self, entry: str) -> None:
        self.written.append(entry)
        if len(self.written) == 1 and self.manager is not None:
            self.manager.set_labels({LABEL: "a"}, {APPLIED_ANNOTATION: entry})
            self.manager.set_labels({LABEL: "a"}, {})


def test_a_record_removed_while_it_was_written_is_written_again(node: ManagedNode) -> None:
    dst = node.base / "dst" / "config.yaml"
    record = RaceyRecord()
    manager = ConfigManager(Settings(NODE, str(node.src.root), str(dst), send_signal=False), record=record)
    record.manager = manager
    manager.set_labels({LABEL: "a"}, {})
    assert manager.reconcile().changed and record.written == ["a"]
    assert manager.recorded is None  # the watch's last word, not the write's older answer
    manager.reconcile()
    assert record.written == ["a", "a"] and manager.recorded == "a"


def test_io_failures_are_retried_and_refusals_wait_for_a_change(node: ManagedNode) -> None:
    """`retrying` (readiness, the retry loop) is set for what a retry may fix, the source or the
    destination failing, and not for a refusal, which only a label or ConfigMap change fixes."""
    dst = node.base / "dst" / "config.yaml"
    manager = ConfigManager(Settings(NODE, str(node.src.root), str(dst), send_signal=False))
    manager.set_labels({LABEL: "a"})
    assert manager.reconcile().changed and manager.retrying is None

    node.src.root.rename(node.base / "src-away")  # the ConfigMap volume cannot be read
    outcome = manager.reconcile()
    assert outcome.entry == "a" and manager.retrying == outcome.problem
    assert outcome.problem is not None and outcome.problem.startswith(f"cannot list {node.src.root}: ")
    (node.base / "src-away").rename(node.src.root)
    assert not manager.reconcile().changed and manager.retrying is None

    # An entry whose read fails (EIO: this process's memory at address 0, a regular file in /proc).
    (node.src.root / "mem").symlink_to("/proc/self/mem")
    manager.set_labels({LABEL: "mem"})
    outcome = manager.reconcile()
    assert outcome.entry == "a" and outcome.problem == manager.retrying
    assert outcome.problem is not None and outcome.problem.startswith("cannot read entry 'mem': ")

    manager.set_labels({LABEL: "nope"})
    outcome = manager.reconcile()
    assert outcome.problem is not None and outcome.problem.startswith("no config entry named 'nope'")
    assert manager.retrying is None and manager.refused_total == 1
