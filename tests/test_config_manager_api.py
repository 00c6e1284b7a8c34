"""`nvdp config-manager --configmap-name`: the ConfigMap read through the API (the stand-in, real
`kubernetes` client) beside its mounted copy. An edit in the API is applied in seconds while the
mount still shows the old entries; the mount keeps working while the API does not; the two changing
at different times never take turns; a bad entry from the API is refused as one from the mount is."""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from nvdp.base.errors import ConfigError
from nvdp.base.logs import FIELDS_ATTR
from nvdp.kube.configmaps import ConfigMapData
from nvdp.side.configmanager.manager import ConfigManager
from nvdp.side.configmanager.settings import Settings, add_flags, resolve
from nvdp.side.configmanager.status import Snapshot, not_ready
from testkit import ProcStats, free_port, wait_until
from tests import test_config_manager
from tests.readings import http_get
from tests.test_config_manager import LABEL, NODE, ConfigMapDir, Setup, ts

# test_config_manager's fixtures (the API stand-in serving the Node; mount, plugin and kubelet), by name
api = test_config_manager.api
setup = test_config_manager.setup

NAMESPACE = "gpu-system"
CONFIGMAP = "plugin-configs"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
CONFIGMAP_PATH = f"{CONFIGMAPS}/{CONFIGMAP}"
WATCHED = ("--configmap-name", CONFIGMAP, "--namespace", NAMESPACE, "--configmap-spread", "0")
ENTRIES = {"a": ts(2), "b": ts(4), "default": "version: v1\n"}  # what Setup mounts
BAD = "sharing: {timeSlicing: {resources: [{name: gpu, replicas: x}]}}\n"
COPY = re.compile(r"\.config\.yaml\.entries/b@[0-9a-f]{16}")


def configmap(entries: dict[str, str]) -> dict[str, Any]:
    metadata = {"name": CONFIGMAP, "namespace": NAMESPACE}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": entries}


def reloads(setup: Setup) -> int:
    return (setup.base / "plugin.log").read_text().count("SIGHUP received")


def refusals(setup: Setup) -> list[dict[str, Any]]:
    return [e for e in setup.api.created if e["reason"] == "DevicePluginConfigRefused"]


# ---- an edit in the API: applied in seconds, the mount unchanged ---------------------------------


@pytest.mark.soak
def test_an_edit_in_the_api_is_applied_in_seconds_while_the_mount_lags(setup: Setup) -> None:
    """The kubelet refreshes a mounted ConfigMap 20-80 s after an edit, and the config-manager waited
    for it. Now it watches the ConfigMap too: the plugin serves the edit within 5 s, the mount still
    showing the old entries; the mount catching up later changes nothing; a bad entry is refused."""
    setup.api.put(CONFIGMAP_PATH, configmap(ENTRIES))
    setup.label("b")
    init = setup.manager("--oneshot", *WATCHED, log="init.log", SEND_SIGNAL="false")
    assert init.wait(30) == 0, init.log()
    assert COPY.fullmatch(os.readlink(setup.dst)) and setup.dst.read_text() == ts(4)
    plugin = setup.plugin()
    setup.wait_devices(32, timeout=30)  # 8 GPUs x 4 replicas
    manager = setup.manager(*WATCHED)
    wait_until(lambda: "reading config entries from the API" in manager.log(), 20, "the API's entries read")

    setup.api.put(CONFIGMAP_PATH, configmap({**ENTRIES, "b": ts(3)}))
    edited = time.monotonic()
    wait_until(
        lambda: setup.dst.read_text() == ts(3) and reloads(setup) == 1, 5, "the edit linked, signalled"
    )
    setup.wait_devices(24, timeout=5)
    assert time.monotonic() - edited < 5
    assert (setup.src.root / "b").read_text() == ts(4) and setup.src.generation == 1  # the mount lags
    assert COPY.fullmatch(os.readlink(setup.dst))
    applied = [line for line in manager.log().splitlines() if "config applied" in line]
    assert len(applied) == 1 and "source=api" in applied[0], manager.log()

    # The kubelet catches up: nothing to do. Then an entry the plugin would refuse, in the API.
    setup.src.update({**ENTRIES, "b": ts(3)})
    setup.api.put(CONFIGMAP_PATH, configmap({**ENTRIES, "b": BAD}))
    wait_until(lambda: refusals(setup), 10, "the refusal as a Node event")
    (event,) = refusals(setup)
    assert event["type"] == "Warning" and "replicas: must be an integer" in str(event["message"])
    (line,) = [line for line in manager.log().splitlines() if "config not applied" in line]
    assert "label=b" in line and "current=b" in line and "replicas: must be an integer" in line
    assert setup.dst.read_text() == ts(3) and reloads(setup) == 1

    # Fixed in the API: applied at once; the catch-up of the mount above sent no signal.
    setup.api.put(CONFIGMAP_PATH, configmap({**ENTRIES, "b": ts(2)}))
    setup.wait_devices(16, timeout=5)
    wait_until(lambda: reloads(setup) == 2, 5, "one reload per change")
    assert len(refusals(setup)) == 1 and plugin.alive()
    assert len(os.listdir(setup.dst.parent / ".config.yaml.entries")) <= 2  # old copies removed
    assert ProcStats.read(manager.pid).peak_rss_mib * 1024 * 1024 < 80e6  # the config-manager's budget
    assert manager.stop() == 0 and plugin.stop() == 0
    assert "Traceback" not in manager.log()


# ---- the API unreachable: the mount still works --------------------------------------------------


@pytest.mark.soak
def test_without_the_api_the_mount_still_applies_edits(setup: Setup) -> None:
    """No permission on the ConfigMap (403: a cluster without the Role): the init container and the
    sidecar use the mount, edits of the mount apply, and the failing watch shows in the metrics.
    When the API answers again with what the mount shows, nothing changes; its next edit applies."""
    port = free_port()
    setup.api.put(CONFIGMAP_PATH, configmap(ENTRIES))
    setup.api.fail(403, 100_000, path_prefix=CONFIGMAPS)
    setup.label("b")
    init = setup.manager("--oneshot", *WATCHED, log="init.log", SEND_SIGNAL="false")
    assert init.wait(30) == 0, init.log()
    (warning,) = [line for line in init.log().splitlines() if "WARNING" in line]
    assert "cannot read the ConfigMap from the API; using its mounted copy" in warning
    assert f"cannot read configmap {NAMESPACE}/{CONFIGMAP}: HTTP 403" in warning
    assert setup.dst.read_text() == ts(4)
    plugin = setup.plugin()
    setup.wait_devices(32, timeout=30)
    manager = setup.manager(*WATCHED, "--metrics-address", f"127.0.0.1:{port}")
    wait_until(lambda: "configmap watch failed configmap=gpu-system/plugin-configs" in manager.log(), 20, "")
    wait_until(lambda: _gauge(port, "nvdp_config_manager_configmap_watch_failing_seconds") > 0, 10, "gauge")

    setup.src.update({**ENTRIES, "b": ts(3)})  # the kubelet heard the edit; the watch cannot
    setup.api.put(CONFIGMAP_PATH, configmap({**ENTRIES, "b": ts(3)}))
    setup.wait_devices(24)
    wait_until(lambda: reloads(setup) == 1, 5, "one reload")
    assert "reading config entries from the mounted volume" in manager.log()

    setup.api.clear_failures()  # the Role is granted: the API's entries are the mount's, no reload
    wait_until(lambda: "reading config entries from the API" in manager.log(), 20, "the API read again")
    wait_until(lambda: _gauge(port, "nvdp_config_manager_configmap_watch_failing_seconds") == 0, 10, "ok")
    setup.api.put(CONFIGMAP_PATH, configmap({**ENTRIES, "b": ts(2)}))
    setup.wait_devices(16, timeout=5)
    wait_until(lambda: reloads(setup) == 2, 5, "one reload per change")
    assert manager.stop() == 0 and plugin.stop() == 0


def _gauge(port: int, name: str) -> float:
    (value,) = [
        line.split()[1] for line in http_get(port, "/metrics")[1].splitlines() if line.startswith(name)
    ]
    return float(value)


def test_readiness_names_the_failing_configmap_watch() -> None:
    assert not_ready(Snapshot(True, 1, 0, 0, 0.0, configmap_watch_failing_for=59.0), 60.0) is None
    assert not_ready(Snapshot(True, 1, 0, 0, 0.0, configmap_watch_failing_for=61.0), 60.0) == (
        "configmap watch failing for 61s"
    )


# ---- both changing: the two copies never take turns ----------------------------------------------


def test_the_mount_and_the_api_changing_apart_never_take_turns(tmp_path: Path) -> None:
    """Each pass below is one the loop could run. The plugin gets each config once, in order: a
    mount that lags never replaces newer entries from the API (nor does one showing a version the
    first list skipped), a mount ahead of a failing watch is used, and a resumed watch replaying
    older events does not take the node back."""
    src = ConfigMapDir(tmp_path / "src", {"a": ts(1)})
    dst = tmp_path / "dst" / "config.yaml"
    settings = Settings(NODE, str(src.root), str(dst), send_signal=False, configmap_name=CONFIGMAP)
    manager = ConfigManager(settings)
    manager.set_labels({LABEL: "a"})
    served: list[str] = []

    def run_pass() -> None:
        if manager.reconcile().changed:
            served.append(dst.read_text())

    def api(replicas: int, version: int, listed: bool = False) -> None:
        manager.sources.set_api(ConfigMapData(str(version), {"a": ts(replicas).encode()}), listed)
        run_pass()

    def mount(replicas: int) -> None:
        src.update({"a": ts(replicas)})
        run_pass()

    api(3, 12, listed=True)  # the mount shows version 10 (replicas 1)
    mount(2)  # version 11, which the kubelet fetched before the list and writes after it
    mount(3)  # the kubelet catches up
    api(4, 13)  # an edit: the API is ahead of the mount
    run_pass()
    manager.sources.api_failed()  # the watch fails; the mount still shows 3
    run_pass()
    mount(5)  # edits the watch misses, heard by the kubelet: the mount is ahead
    mount(6)
    manager.sources.api_recovered()  # the resumed watch replays what it missed, oldest first
    api(5, 14)
    api(6, 15)
    api(7, 16, listed=True)  # after a 410 Gone, a fresh list: the state now
    run_pass()  # the mount lags at 6
    assert served == [ts(3), ts(4), ts(5), ts(6), ts(7)]
    assert manager.applied_total == 5 and src.generation == 5
    assert len(os.listdir(dst.parent / ".config.yaml.entries")) <= 2


def test_a_configmap_missing_from_the_api_leaves_the_mount_and_a_deleted_one_its_last_entries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = ConfigMapDir(tmp_path / "src", {"a": ts(1)})
    dst = tmp_path / "dst" / "config.yaml"
    manager = ConfigManager(
        Settings(
            NODE, str(src.root), str(dst), send_signal=False, configmap_name=CONFIGMAP, namespace=NAMESPACE
        )
    )
    manager.set_labels({LABEL: "a"})
    with caplog.at_level(logging.INFO, logger="nvdp.side.configmanager.sources"):
        manager.sources.set_api(None, True)  # not created yet (the kubelet would not start the pod)
        assert manager.sources.ready and manager.reconcile().changed and dst.read_text() == ts(1)
        manager.sources.set_api(ConfigMapData("20", {"a": ts(2).encode(), "..data": b"", "b/c": b""}), False)
        assert manager.reconcile().changed and dst.read_text() == ts(2)
        assert manager.sources.entries().names() == ["a"]  # only what a volume can hold
        manager.sources.set_api(None, False)  # deleted: the kubelet keeps the mounted files, we the entries
        manager.sources.set_api(None, False)
        assert not manager.reconcile().changed and dst.read_text() == ts(2)
    assert [r.getMessage() for r in caplog.records] == [
        "ConfigMap not in the API; reading the mounted copy",
        "reading config entries from the mounted volume",
        "reading config entries from the API",
        "ConfigMap not in the API; keeping the entries last served",
    ]
    assert [getattr(r, FIELDS_ATTR).get("configmap") for r in caplog.records] == [
        f"{NAMESPACE}/{CONFIGMAP}"
    ] * 4


def test_without_the_api_the_first_pass_waits_for_its_answer(tmp_path: Path) -> None:
    """The sidecar's first pass on the mount alone would put a lagging entry in place, and signal,
    only to put the API's back a moment later: it waits for the API's first answer or failure."""
    src = ConfigMapDir(tmp_path / "src", {"a": ts(1)})
    settings = Settings(NODE, str(src.root), str(tmp_path / "config.yaml"), configmap_name=CONFIGMAP)
    manager = ConfigManager(settings)
    assert not manager.sources.ready
    manager.sources.api_failed()
    assert manager.sources.ready
    mount_only = ConfigManager(Settings(NODE, str(src.root), str(tmp_path / "other.yaml")))
    assert mount_only.sources.ready and not mount_only.sources.copies


# ---- settings ------------------------------------------------------------------------------------


def _resolve(environ: dict[str, str], namespace_file: Path) -> Settings:
    import argparse

    parser = argparse.ArgumentParser()
    add_flags(parser)
    base = {"NODE_NAME": NODE, "CONFIG_FILE_SRCDIR": "/src", "CONFIG_FILE_DST": "/dst"}
    return resolve(parser.parse_args([]), base | environ, str(namespace_file))


def test_the_configmaps_namespace_is_the_pods_unless_given(tmp_path: Path) -> None:
    account = tmp_path / "namespace"
    account.write_text("gpu-system\n")
    assert _resolve({"CONFIGMAP_NAME": CONFIGMAP}, account).namespace == "gpu-system"
    assert _resolve({"CONFIGMAP_NAME": CONFIGMAP, "NAMESPACE": "other"}, account).namespace == "other"
    assert _resolve({}, account).configmap_name == ""
    with pytest.raises(ConfigError) as caught:
        _resolve({"CONFIGMAP_NAME": CONFIGMAP}, tmp_path / "none")
    assert str(caught.value).startswith(
        "--configmap-name: the namespace is required (--namespace / NAMESPACE"
    )
    with pytest.raises(ConfigError) as caught:
        _resolve({"CONFIGMAP_NAME": "Plugin_Configs", "NAMESPACE": "a/b"}, account)
    assert caught.value.problems == [
        'CONFIGMAP_NAME: not a valid ConfigMap name, got "Plugin_Configs"',
        'NAMESPACE: not a valid namespace, got "a/b"',
    ]
