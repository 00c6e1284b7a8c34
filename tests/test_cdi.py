"""CDI spec generation: golden specs from a fake driver root, the CDI schema, the publisher's
writing rules, and the Allocate answers' names resolving in the written specs."""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvdp.base.dir_watch import IN_CLOSE_WRITE
from nvdp.base.errors import ConfigError
from nvdp.config import Config, ReplicatedResource, RuntimeOptions
from nvdp.node.cdi import CdiSettings
from nvdp.node.cdi.node_files import DevNode, NodeFiles
from nvdp.node.cdi.publisher import CdiPublisher, answer_names
from nvdp.node.cdi.roots import visible_roots
from nvdp.node.cdi.scan import scan_dev, scan_driver
from nvdp.node.cdi.spec import build_specs, node_devices, render
from nvdp.node.gpus.devices import parse_mig_minors
from nvdp.node.gpus.misfits import Misfit
from nvdp.node.gpus.resources import build_resources
from nvdp.node.gpus.unusable import Unusable, leave_out
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.deviceplugin.daemon_settings import cdi_settings, imex_channels
from nvdp.plugins.deviceplugin.responses import ResponseOptions, container_response
from tests.builders import sim_gpus
from tests.cdi_support import (
    DRIVER_VERSION,
    assert_valid,
    make_node,
    strict_schema,
    validate,
    without_device_fields,
)
from tests.readings import log_lines
from tests.test_lock_file import holder_of

GOLDEN = Path(__file__).parent / "data" / "cdi" / "golden"
UPDATE = os.environ.get("NVDP_UPDATE_GOLDEN") == "1"
MODE_NODES = ("/dev/nvidia-fs0", "/dev/nvidia-fs1", "/dev/infiniband/uverbs0", "/dev/gdrdrv")
IMEX_NODE = "/dev/nvidia-caps-imex-channels/channel0"
# gpu0 of dgx-a100-mig has GPU instances 7..13 with compute instance 0: a mig-minors file that
# places their access nodes apart from the driver's default layout.
MIG_MINORS = "".join(
    f"gpu0/gi{gi}/access {500 + 2 * gi}\ngpu0/gi{gi}/ci0/access {501 + 2 * gi}\n" for gi in range(15)
)


def first(profile: str, count: int) -> list[GpuInfo]:
    return sim_gpus(profile)[:count]


def generate(
    root: Path, gpus: Sequence[GpuInfo], cdi: CdiSettings, minors: str | None = None
) -> dict[str, Any]:
    driver_here, dev_here = visible_roots(cdi.driver_root, cdi.dev_root, cdi.container_driver_root)
    files = NodeFiles(scan_driver(driver_here, DRIVER_VERSION), scan_dev(dev_here))
    parsed = parse_mig_minors(minors) if minors else None
    built = build_specs(node_devices(gpus, parsed, cdi.id_strategy), files, cdi)
    assert not built.problems
    return {
        name: json.loads(render(spec).decode().replace(str(root), "$ROOT"))
        for name, spec in built.specs.items()
    }


GOLDEN_CASES = {
    # id: (profile, gpu count, settings over the fake root (None: the root itself), mig-minors text)
    "gpus-uuid": ("pcie-4", 2, {}, None),
    "gpus-index-container-driver-root": (
        "pcie-4",
        2,
        {
            "id_strategy": "index",
            "driver_root": "/run/nvidia/driver",
            "dev_root": "/run/nvidia/driver",
            "container_driver_root": None,
            "hook_path": "/usr/local/nvidia/bin/nvidia-cdi-hook",
        },
        None,
    ),
    "mig-uuid": ("dgx-a100-mig", 2, {}, None),
    "mig-index-mig-minors": ("dgx-a100-mig", 1, {"id_strategy": "index"}, MIG_MINORS),
    "hooks-off": ("pcie-4", 1, {"disabled_hooks": ("all",)}, None),
    "hooks-no-ldcache": ("pcie-4", 1, {"disabled_hooks": ("update-ldcache",)}, None),
    "gds-mofed-gdrcopy-imex": (
        "pcie-4",
        1,
        {"modes": ("gds", "mofed", "gdrcopy"), "imex_channels": (0,)},
        None,
    ),
    "kind-nvidia-ctk": ("pcie-4", 1, {"gpu_kind": "nvidia.com/gpu"}, None),
}


@pytest.mark.parametrize("case", list(GOLDEN_CASES), ids=list(GOLDEN_CASES))
def test_golden_spec(case: str, tmp_path: Path) -> None:
    profile, count, overrides, minors = GOLDEN_CASES[case]
    gpus = first(profile, count)
    root = tmp_path / "root"
    mknod_ok = make_node(
        root, gpus, extra_nodes=(*MODE_NODES, IMEX_NODE), mig_minors=parse_mig_minors(minors or "")
    )
    cdi = CdiSettings(driver_root=str(root), dev_root=str(root), container_driver_root=str(tmp_path / "none"))
    if overrides.get("container_driver_root", "") is None:
        overrides = {**overrides, "container_driver_root": str(root)}  # the chart's layout
    specs = generate(root, gpus, replace(cdi, **overrides), minors)
    golden = GOLDEN / f"{case}.json"
    if UPDATE:
        assert mknod_ok, "golden specs are written from real device nodes (mknod)"
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps(specs, indent=2) + "\n")
    expected = json.loads(golden.read_text())
    # Without mknod the fake nodes are plain files, and the spec names them by path alone.
    assert specs == (expected if mknod_ok else without_device_fields(expected))
    for name, spec in specs.items():
        assert_valid(spec, name)


def test_validator_catches_what_the_schema_forbids() -> None:
    schema = strict_schema()
    bad = {
        "cdiVersion": "0.5.0",
        "kind": "k/gpu",
        "devices": [{"name": "x", "containerEdits": {"mounts": [{}]}}],
    }
    assert validate(bad, schema) == [
        "$.devices[0].containerEdits.mounts[0]: missing required 'hostPath'",
        "$.devices[0].containerEdits.mounts[0]: missing required 'containerPath'",
    ]
    assert validate({"kind": 1, "devices": [], "hostpath": "x"}, schema) == [
        "$: missing required 'cdiVersion'",
        "$.kind: expected string, got int",
        "$: unexpected property 'hostpath'",
    ]


def test_scan_finds_driver_files_by_version_and_follows_symlinks(tmp_path: Path) -> None:
    mknod_ok = make_node(tmp_path, first("pcie-4", 1))
    files = scan_driver(str(tmp_path), DRIVER_VERSION)
    lib = "/usr/lib/x86_64-linux-gnu"
    names = ("libcuda", "libcudadebugger", "libnvidia-allocator")
    assert files.libraries == (  # by directory, then by name, as NVIDIA's spec finds them
        *((f"{lib}/{n}.so.{DRIVER_VERSION}",) * 2 for n in names),
        # found through an absolute symlink, resolved inside the root: mounted under its library name
        (f"{lib}/libnvidia-cfg.so.{DRIVER_VERSION}", "/opt/nvidia/libnvidia-cfg.so.real"),
        *((f"{lib}/{n}.so.{DRIVER_VERSION}",) * 2 for n in ("libnvidia-ml", "libnvidia-ptxjitcompiler")),
        (f"{lib}/libnvidia-nvvm70.so.4",) * 2,  # NVIDIA's legacy NVVM, beside the driver's libraries
    )
    assert files.links[:4] == (
        ("libcuda.so.1", f"{lib}/libcuda.so"),  # always, as NVIDIA's spec makes it
        (f"libcuda.so.{DRIVER_VERSION}", f"{lib}/libcuda.so.1"),  # the SONAME link the host has
        (f"libcudadebugger.so.{DRIVER_VERSION}", f"{lib}/libcudadebugger.so.1"),
        (f"libnvidia-allocator.so.{DRIVER_VERSION}", f"{lib}/libnvidia-allocator.so.1"),
    )
    assert ("libnvidia-ml.so.1", f"{lib}/libnvidia-ml.so") in files.links  # the host has libnvidia-ml.so
    assert not any(link.endswith(("libcudadebugger.so", "libnvidia-cfg.so.1")) for _, link in files.links)
    assert files.library_dirs == (lib,)
    assert files.explicit_libraries == ((f"{lib}/libEGL.so.1.1.0",) * 2,)  # libEGL.so, symlinks followed
    assert files.binaries == ("/usr/bin/nvidia-smi", "/usr/bin/nvidia-persistenced")
    assert files.firmware == (f"/lib/firmware/nvidia/{DRIVER_VERSION}/gsp_ga10x.bin",)
    assert files.ipc_sockets == ("/run/nvidia-persistenced/socket",)
    nodes = scan_dev(str(tmp_path))
    assert sorted(nodes) == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"]
    # Character devices when mknod is permitted (root with CAP_MKNOD), with the numbers, mode and
    # group stat gives; files otherwise, which the spec names by path alone.
    if mknod_ok:
        assert nodes["/dev/nvidiactl"] == DevNode(195, 255, 0o666, 0, True)
    else:
        assert set(nodes.values()) == {None}


# ---- the publisher: writing rules ------------------------------------------------------------


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, list[GpuInfo]]:
    gpus = sim_gpus("pcie-4")
    make_node(tmp_path / "root", gpus, extra_nodes=(*MODE_NODES, IMEX_NODE))
    return tmp_path / "root", gpus


def specs(spec_dir: Path) -> list[str]:
    """The spec files in `spec_dir` (not the lock file beside them)."""
    return sorted(n for n in os.listdir(spec_dir) if not n.startswith("."))


def settings_for(root: Path, spec_dir: Path, **overrides: Any) -> CdiSettings:
    base = CdiSettings(
        spec_dir=str(spec_dir),
        driver_root=str(root),
        dev_root=str(root),
        container_driver_root=str(root.parent / "no-container-root"),
    )
    return replace(base, **overrides)


def test_publish_writes_once_and_keeps_unchanged_files(
    node: tuple[Path, list[GpuInfo]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, gpus = node
    spec_dir = tmp_path / "cdi"
    cdi = settings_for(root, spec_dir)
    resources = build_resources(gpus).resources
    publisher = CdiPublisher()
    with caplog.at_level(logging.INFO, logger="nvdp.node.cdi"):
        result = publisher.publish(cdi, gpus, resources, DRIVER_VERSION)
        spec = spec_dir / "k8s.device-plugin.nvidia.com-gpu.json"
        before = spec.stat()
        again = publisher.publish(cdi, gpus, resources, DRIVER_VERSION)
    assert result.resources == resources == again.resources
    assert result.misfits == again.misfits == () and publisher.retry_in() is None
    lock = spec_dir / ".k8s.device-plugin.nvidia.com.lock"  # no temp file left; the lock held meanwhile
    assert sorted(os.listdir(spec_dir)) == [lock.name, "k8s.device-plugin.nvidia.com-gpu.json"]
    assert lock.read_text().startswith(f"pid={os.getpid()} host=") and lock.stat().st_mode & 0o777 == 0o600
    after = spec.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert log_lines(caplog).count(f"wrote CDI spec path={spec} kind=k8s.device-plugin.nvidia.com/gpu") == 1
    assert oct(after.st_mode & 0o777) == "0o644"
    publisher.close()
    assert os.listdir(spec_dir) == [spec.name]  # the specs stay, the lock goes


@pytest.fixture
def publisher() -> Iterator[CdiPublisher]:
    publisher = CdiPublisher()
    yield publisher
    publisher.close()


def test_unwritable_spec_dir_withholds_every_resource_and_is_retried(
    node: tuple[Path, list[GpuInfo]], tmp_path: Path, publisher: CdiPublisher
) -> None:
    root, gpus = node
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    cdi = settings_for(root, blocker / "cdi")
    result = publisher.publish(cdi, gpus, build_resources(gpus).resources, DRIVER_VERSION)
    assert result.resources == []
    assert result.misfits == (
        Misfit(
            "CdiSpecNotWritten",
            f"{blocker}/cdi",
            f"cannot use CDI spec directory {blocker}/cdi: Not a directory; nvidia.com/gpu not advertised "
            "until it can be written (retrying)",
            withholds=("nvidia.com/gpu",),
        ),
    )
    assert publisher.retry_in() == pytest.approx(0.5, abs=0.1)  # and then 1, 2, ... up to 10 s
    blocker.unlink()
    blocker.mkdir()
    again = publisher.publish(cdi, gpus, build_resources(gpus).resources, DRIVER_VERSION)
    assert again.misfits == () and len(again.resources) == 1 and publisher.retry_in() is None


def test_device_missing_from_the_spec_is_left_out_of_its_resources(
    node: tuple[Path, list[GpuInfo]], tmp_path: Path, publisher: CdiPublisher
) -> None:
    root, gpus = node
    (root / "dev/nvidia3").unlink()
    resources = build_resources(
        gpus,
        sharing=[ReplicatedResource("nvidia.com/gpu", 2, rename="nvidia.com/gpu.shared", devices=("3",))],
    ).resources
    assert [r.name for r in resources] == ["nvidia.com/gpu", "nvidia.com/gpu.shared"]
    result = publisher.publish(settings_for(root, tmp_path / "cdi"), gpus, resources, DRIVER_VERSION)
    assert [(r.name, len(r.devices)) for r in result.resources] == [("nvidia.com/gpu", 3)]
    assert result.resources[0] == resources[0]
    name = f"k8s.device-plugin.nvidia.com/gpu={gpus[3].uuid}"
    assert result.misfits == (
        Misfit(
            "CdiDeviceNotInSpec",
            name,
            f"GPU 3 ({gpus[3].uuid}): not in the CDI spec (/dev/nvidia3 not found under the dev root); "
            "not advertised",
            withholds=("nvidia.com/gpu.shared",),
        ),
    )


def test_modes_and_imex_names_and_stale_spec_removed(
    node: tuple[Path, list[GpuInfo]], tmp_path: Path
) -> None:
    root, gpus = node
    spec_dir = tmp_path / "cdi"
    on = settings_for(root, spec_dir, modes=("gds", "mofed", "gdrcopy"), imex_channels=(0,))
    publisher = CdiPublisher()
    result = publisher.publish(on, gpus, build_resources(gpus).resources, DRIVER_VERSION)
    assert result.extra_names == (
        "k8s.device-plugin.nvidia.com/gds=all",
        "k8s.device-plugin.nvidia.com/mofed=all",
        "k8s.device-plugin.nvidia.com/gdrcopy=all",
        "k8s.device-plugin.nvidia.com/imex-channel=channel0",
    )
    assert len(specs(spec_dir)) == 5
    publisher.publish(settings_for(root, spec_dir), gpus, build_resources(gpus).resources, DRIVER_VERSION)
    publisher.close()
    assert os.listdir(spec_dir) == ["k8s.device-plugin.nvidia.com-gpu.json"]


def test_mode_without_device_nodes_is_not_offered(tmp_path: Path, publisher: CdiPublisher) -> None:
    gpus = sim_gpus("pcie-4")
    make_node(tmp_path / "root", gpus)
    cdi = settings_for(tmp_path / "root", tmp_path / "cdi", modes=("gds",))
    result = publisher.publish(cdi, gpus, build_resources(gpus).resources, DRIVER_VERSION)
    assert result.extra_names == () and len(result.resources) == 1


def test_unusable_devices_are_left_out_of_every_resource_replicas_included() -> None:
    gpus = sim_gpus("dgx-a100-mig")
    rules = [ReplicatedResource("nvidia.com/mig-1g.5gb", 2), ReplicatedResource("nvidia.com/mig-3g.20gb", 3)]
    resources = build_resources(gpus, mig_strategy="mixed", sharing=rules).resources
    by_name = {r.name: r for r in resources}
    small = [d for d in by_name["nvidia.com/mig-1g.5gb"].devices.values() if d.replica == 0]
    big = [d for d in by_name["nvidia.com/mig-3g.20gb"].devices.values() if d.replica == 0]
    fact = Unusable("DeviceNodeMissing", "/dev/nvidia0", "/dev/nvidia0 not found under the dev root /")
    other = Unusable("DeviceNodeMissing", "/dev/nvidia-caps/nvidia-cap9", "nvidia-cap9 not found")
    gone = {d.uuid: fact for d in small if d.gpu_index == 0} | {d.uuid: other for d in big}
    result = leave_out(resources, gone)
    out = {r.name: r for r in result.resources}
    assert "nvidia.com/mig-3g.20gb" not in out  # every device of it gone: withheld
    left = out["nvidia.com/mig-1g.5gb"]
    assert not {d.uuid for d in left.devices.values()} & set(gone)
    assert len(left.devices) == len(by_name["nvidia.com/mig-1g.5gb"].devices) - 2 * len(
        gone.keys() & {d.uuid for d in small}
    )
    assert set(left.replica_counts) == {d.uuid for d in left.devices.values()} and left.replicas == 2
    gpu0 = ", ".join(d.index for d in small if d.gpu_index == 0)
    assert len(big) == 1 and gpu0.count(",") >= 1  # one device said with its uuid, several by index
    assert [(m.reason, m.message, m.withholds) for m in result.misfits] == [
        (
            "DeviceNodeMissing",
            f"MIG devices {gpu0}: /dev/nvidia0 not found under the dev root /; not advertised",
            (),
        ),
        (
            "DeviceNodeMissing",
            f"MIG device {big[0].index} ({big[0].uuid}): nvidia-cap9 not found; not advertised",
            ("nvidia.com/mig-3g.20gb",),
        ),
    ]
    assert leave_out(resources, {}).resources == resources


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class RecordingWatcher:
    """Records what the publisher watches; the real inotify watch is tested in the process tests."""

    def __init__(self) -> None:
        self.added: list[tuple[Path, int]] = []

    def add(self, directory: Path, extra_events: int = 0) -> bool:
        self.added.append((directory, extra_events))
        return True


def test_failed_publishes_are_retried_with_capped_backoff(
    node: tuple[Path, list[GpuInfo]], tmp_path: Path
) -> None:
    root, gpus = node
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    clock = Clock()
    publisher = CdiPublisher(clock=clock)
    cdi = settings_for(root, blocker / "cdi")
    resources = build_resources(gpus).resources
    watcher = RecordingWatcher()
    delays = []
    for _ in range(7):
        publisher.publish(cdi, gpus, resources, DRIVER_VERSION)
        delays.append(publisher.retry_in())
        assert not publisher.changed(watcher)  # not due yet
        clock.now += delays[-1] or 0
        assert publisher.changed(watcher)  # due: publish again
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    blocker.unlink()
    assert publisher.publish(cdi, gpus, resources, DRIVER_VERSION).misfits == ()
    assert publisher.retry_in() is None and not publisher.changed(watcher)  # all well: no timer
    assert (blocker / "cdi", IN_CLOSE_WRITE) in watcher.added
    publisher.close()


def test_a_kept_spec_is_written_back_and_our_own_write_is_not_a_change(
    node: tuple[Path, list[GpuInfo]],
    tmp_path: Path,
    publisher: CdiPublisher,
    caplog: pytest.LogCaptureFixture,
) -> None:
    root, gpus = node
    spec = tmp_path / "cdi" / "k8s.device-plugin.nvidia.com-gpu.json"
    publisher.publish(
        settings_for(root, tmp_path / "cdi"), gpus, build_resources(gpus).resources, DRIVER_VERSION
    )
    ours = spec.read_bytes()
    watcher = RecordingWatcher()
    assert not publisher.changed(watcher)
    os.utime(spec)  # touched, same content: left alone
    with caplog.at_level(logging.WARNING, logger="nvdp.node.cdi"):
        assert not publisher.changed(watcher)
        assert caplog.records == []
        spec.write_bytes(ours + b" ")  # one byte more: not ours (the compare reads len + 1 bytes)
        assert not publisher.changed(watcher) and spec.read_bytes() == ours
        spec.unlink()
        assert not publisher.changed(watcher) and spec.read_bytes() == ours
        os.mkfifo(tmp_path / "fifo")
        spec.unlink()
        os.rename(tmp_path / "fifo", spec)  # a FIFO in its place is not waited on: replaced
        assert not publisher.changed(watcher) and spec.read_bytes() == ours
    assert [line.split(" path=")[0] for line in log_lines(caplog)] == [
        "CDI spec changed under the plugin; written back",
        "CDI spec removed under the plugin; written back",
        "CDI spec changed under the plugin; written back",
    ]
    caplog.clear()
    assert not publisher.changed(watcher) and caplog.records == []  # its own write is no change


def test_a_spec_that_cannot_be_written_back_asks_for_a_publish(
    node: tuple[Path, list[GpuInfo]], tmp_path: Path, publisher: CdiPublisher
) -> None:
    root, gpus = node
    spec_dir = tmp_path / "cdi"
    cdi = settings_for(root, spec_dir)
    publisher.publish(cdi, gpus, build_resources(gpus).resources, DRIVER_VERSION)
    for name in os.listdir(spec_dir):
        (spec_dir / name).unlink()
    spec_dir.rmdir()
    spec_dir.write_text("")  # the directory replaced by a file
    assert publisher.changed(RecordingWatcher())  # cannot be kept: publish again
    result = publisher.publish(cdi, gpus, build_resources(gpus).resources, DRIVER_VERSION)
    assert result.resources == [] and [m.reason for m in result.misfits] == ["CdiSpecNotWritten"]


def test_a_second_publisher_on_the_spec_dir_withholds_until_the_first_releases(
    node: tuple[Path, list[GpuInfo]], tmp_path: Path, publisher: CdiPublisher
) -> None:
    root, gpus = node
    spec_dir = tmp_path / "cdi"
    resources = build_resources(gpus).resources
    publisher.publish(settings_for(root, spec_dir), gpus, resources, DRIVER_VERSION)
    ours = (spec_dir / "k8s.device-plugin.nvidia.com-gpu.json").read_bytes()
    second = CdiPublisher()
    index = settings_for(root, spec_dir, id_strategy="index")
    result = second.publish(index, gpus, resources, DRIVER_VERSION)
    lock = spec_dir / ".k8s.device-plugin.nvidia.com.lock"
    assert result.resources == [] and result.misfits == (
        Misfit(
            "CdiSpecDirInUse",
            str(lock),
            f"CDI spec directory {spec_dir} is in use by another device plugin (lock {lock} held by "
            f"pid={os.getpid()} host={socket.gethostname()}); nvidia.com/gpu not advertised until it is "
            "released",
            withholds=("nvidia.com/gpu",),
        ),
    )
    assert (spec_dir / "k8s.device-plugin.nvidia.com-gpu.json").read_bytes() == ours
    watcher = RecordingWatcher()
    assert not second.changed(watcher)  # still held, retry not due
    publisher.close()  # removes the lock file: what wakes the second one's watch
    assert second.changed(watcher)
    again = second.publish(index, gpus, resources, DRIVER_VERSION)
    assert again.misfits == () and again.resources == resources
    assert (spec_dir / "k8s.device-plugin.nvidia.com-gpu.json").read_bytes() != ours
    second.close()


def test_a_lock_holder_killed_without_removing_its_file_is_taken_over_at_the_next_retry(
    node: tuple[Path, list[GpuInfo]], tmp_path: Path
) -> None:
    root, gpus = node
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    with holder_of(spec_dir / ".k8s.device-plugin.nvidia.com.lock") as holder:
        clock = Clock()
        publisher = CdiPublisher(clock=clock)
        cdi = settings_for(root, spec_dir)
        resources = build_resources(gpus).resources
        [misfit] = publisher.publish(cdi, gpus, resources, DRIVER_VERSION).misfits
        pid = holder.process.pid
        assert misfit.reason == "CdiSpecDirInUse" and f"held by pid={pid} host=" in misfit.message
    # the holder was killed (SIGKILL): the kernel dropped the flock, the file stays
    watcher = RecordingWatcher()
    assert not publisher.changed(watcher)  # the file is still there: nothing woke
    clock.now += publisher.retry_in() or 0
    assert publisher.changed(watcher)
    assert publisher.publish(cdi, gpus, resources, DRIVER_VERSION).resources == resources
    assert (spec_dir / ".k8s.device-plugin.nvidia.com.lock").read_text().startswith(f"pid={os.getpid()} ")
    publisher.close()


def test_replicas_resolve_to_their_gpu_device() -> None:
    gpus = sim_gpus("pcie-4")
    [shared] = build_resources(
        gpus, sharing=[ReplicatedResource("nvidia.com/gpu", 4, devices=("1",))][:1]
    ).resources[-1:]
    cdi = CdiSettings()
    names = answer_names(shared, cdi)
    assert f"k8s.device-plugin.nvidia.com/gpu={gpus[1].uuid}" in names
    assert len(names) == len(gpus)


# ---- settings and IMEX ---------------------------------------------------------------------


def test_settings_only_with_a_cdi_strategy() -> None:
    config = Config()
    assert cdi_settings(config, RuntimeOptions()) is None
    plugin = replace(
        config.flags.plugin, device_list_strategy=("envvar", "cdi-cri"), device_id_strategy="index"
    )
    flags = replace(config.flags, plugin=plugin, gds_enabled=True, gdrcopy_enabled=True)
    cdi = cdi_settings(replace(config, flags=flags), RuntimeOptions(cdi_spec_dir="/x"), (0,))
    assert cdi == CdiSettings(
        spec_dir="/x",
        id_strategy="index",
        modes=("gds", "gdrcopy"),
        imex_channels=(0,),
        hook_path="/usr/bin/nvidia-ctk",
    )


def imex_config(dev_root: Path, required: bool) -> Config:
    config = Config()
    flags = replace(
        config.flags,
        nvidia_driver_root=str(dev_root),
        plugin=replace(config.flags.plugin, container_driver_root=str(dev_root / "none")),
    )
    return replace(config, flags=flags, imex=replace(config.imex, channel_ids=(0,), required=required))


def test_imex_required_channel_missing_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        imex_channels(imex_config(tmp_path, required=True))
    assert str(refused.value) == (
        "imex.required: IMEX channel 0 not found (/dev/nvidia-caps-imex-channels/channel0 under dev root "
        f"{tmp_path}); create the channel or set imex.required to false"
    )
    assert imex_channels(imex_config(tmp_path, required=False)) == ()
    (tmp_path / "dev/nvidia-caps-imex-channels").mkdir(parents=True)
    (tmp_path / "dev/nvidia-caps-imex-channels/channel0").touch()
    assert imex_channels(imex_config(tmp_path, required=True)) == (0,)


def test_imex_channel_nodes_passed_with_device_specs() -> None:
    gpu = build_resources(sim_gpus("pcie-4")).resources[0].devices
    options = ResponseOptions(pass_device_specs=True, imex_channels=(0,))
    response = container_response([next(iter(gpu.values()))], options, "")
    assert [d.container_path for d in response.devices] == ["/dev/nvidia0", IMEX_NODE]  # NVIDIA's order


def test_answer_names_use_the_compat_kind_when_asked() -> None:
    gpus = sim_gpus("pcie-4")
    device = next(iter(build_resources(gpus).resources[0].devices.values()))
    options = ResponseOptions(
        device_list_strategy=("cdi-cri",), cdi_kind="nvidia.com/gpu", cdi_devices=("v/gds=all",)
    )
    response = container_response([device], options, "")
    assert [c.name for c in response.cdi_devices] == [f"nvidia.com/gpu={gpus[0].uuid}", "v/gds=all"]


# ---- property: every name in every answer resolves; every edit names an existing host path ----

# name -> GPUs; GPU 0 of dgx-a100-mig alone is a node MIG strategy `single` accepts (one profile).
NODES = {
    "pcie-4": lambda: sim_gpus("pcie-4"),
    "dgx-a100-mig": lambda: sim_gpus("dgx-a100-mig"),
    "dgx-a100-mig-gpu0": lambda: sim_gpus("dgx-a100-mig")[:1],
}
PROFILES = tuple(NODES)


@pytest.fixture(scope="module")
def roots() -> Iterator[dict[str, Path]]:
    with tempfile.TemporaryDirectory(prefix="nvdp-cdi-") as base:
        out = {}
        for profile, gpus in NODES.items():
            root = Path(base) / profile
            make_node(root, gpus(), extra_nodes=(*MODE_NODES, IMEX_NODE))
            out[profile] = root
        yield out


def test_single_and_mixed_strategies_are_both_exercised() -> None:
    gpus = NODES["dgx-a100-mig-gpu0"]()
    assert [r.name for r in build_resources(gpus, mig_strategy="single").resources] == ["nvidia.com/gpu"]
    assert [r.name for r in build_resources(gpus, mig_strategy="mixed").resources] == [
        "nvidia.com/mig-1g.5gb"
    ]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    profile=st.sampled_from(PROFILES),
    mig_strategy=st.sampled_from(("none", "single", "mixed")),
    id_strategy=st.sampled_from(("uuid", "index")),
    replicas=st.sampled_from((0, 2, 3)),
    modes=st.lists(st.sampled_from(("gds", "mofed", "gdrcopy")), unique=True),
    imex=st.booleans(),
    kind=st.sampled_from(("k8s.device-plugin.nvidia.com/gpu", "nvidia.com/gpu")),
    picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=6),
)
def test_every_answer_name_resolves_in_written_specs(
    roots: dict[str, Path],
    profile: str,
    mig_strategy: str,
    id_strategy: str,
    replicas: int,
    modes: list[str],
    imex: bool,
    kind: str,
    picks: list[int],
) -> None:
    gpus = NODES[profile]()
    resources = build_resources(gpus, mig_strategy=mig_strategy).resources
    if replicas:
        rules = [ReplicatedResource(r.name, replicas) for r in resources]
        resources = build_resources(gpus, mig_strategy=mig_strategy, sharing=rules).resources
    root = roots[profile]
    with tempfile.TemporaryDirectory(prefix="nvdp-cdi-specs-") as spec_dir:
        cdi = settings_for(
            root,
            Path(spec_dir),
            id_strategy=id_strategy,
            modes=tuple(modes),
            imex_channels=(0,) if imex else (),
            gpu_kind=kind,
        )
        publisher = CdiPublisher()
        result = publisher.publish(cdi, gpus, resources, DRIVER_VERSION)
        publisher.close()
        assert result.resources == resources
        defined: set[str] = set()
        for name in specs(Path(spec_dir)):
            spec = json.loads((Path(spec_dir) / name).read_text())
            defined |= {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
            for edits in [spec.get("containerEdits", {})] + [d["containerEdits"] for d in spec["devices"]]:
                for entry in edits.get("deviceNodes", []) + edits.get("mounts", []):
                    assert os.path.exists(entry["hostPath"]), entry
    options = ResponseOptions(
        device_list_strategy=("cdi-annotations", "cdi-cri"),
        device_id_strategy=id_strategy,
        cdi_kind=kind,
        cdi_devices=result.extra_names,
    )
    for resource in result.resources:
        devices = list(resource.devices.values())
        chosen = [devices[p % len(devices)] for p in picks]
        response = container_response(chosen, options, "req")
        names = [c.name for c in response.cdi_devices]
        names += [n for value in response.annotations.values() for n in value.split(",")]
        assert names and set(names) <= defined, (resource.name, set(names) - defined)
