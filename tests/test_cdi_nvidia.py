"""The parts of the `gpu` CDI spec that follow NVIDIA's container toolkit (what NVIDIA's plugin
v0.20.0 writes): the createContainer hooks and `--cdi-disable-hooks`, `NVIDIA_CTK_LIBCUDA_DIR`, the
device node fields stat gives (and the groups a node needs), the mount options, and the feature
flags of `--cdi-feature-flags` / `flags.plugin.cdiFeatureFlags`."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nvdp.base.errors import ConfigError
from nvdp.cli import main
from nvdp.config import add_plugin_flags, resolve
from nvdp.config.model import CDI_FEATURE_FLAGS
from nvdp.config.rules import COHERENT_ANNOTATIONS_UNSUPPORTED
from nvdp.config.runtime import CDI_HOOKS
from nvdp.node.cdi import CdiSettings
from nvdp.node.cdi.edits import HOOKS, IPC_MOUNT_OPTIONS, MOUNT_OPTIONS
from nvdp.node.cdi.node_files import DriverFiles, NodeFiles
from nvdp.node.cdi.scan import scan_dev, scan_driver
from nvdp.node.cdi.spec import build_specs, node_devices
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.deviceplugin.daemon_settings import cdi_settings
from testkit import REPO
from tests.builders import sim_gpus
from tests.cdi_support import DRIVER_VERSION, LIB_DIR, assert_valid, make_char_device, make_node

GPU_SPEC = "k8s.device-plugin.nvidia.com-gpu.json"
LIB = f"/{LIB_DIR}"
CDI_ON = ["--device-list-strategy", "cdi-cri"]


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, list[GpuInfo], bool]:
    """A fake driver root with two GPUs; whether its device nodes are real (mknod permitted)."""
    gpus = sim_gpus("pcie-4")[:2]
    mknod_ok = make_node(tmp_path, gpus)
    return tmp_path, gpus, mknod_ok


def gpu_spec(root: Path, gpus: list[GpuInfo], **settings: Any) -> dict[str, Any]:
    """The `gpu` spec for `gpus` over the fake root, with `settings` over the defaults."""
    cdi = replace(
        CdiSettings(driver_root=str(root), dev_root=str(root), container_driver_root=str(root / "none")),
        **settings,
    )
    files = NodeFiles(scan_driver(str(root), DRIVER_VERSION), scan_dev(str(root)))
    built = build_specs(node_devices(gpus, None, cdi.id_strategy), files, cdi)
    spec = built.specs[GPU_SPEC]
    assert_valid(spec)
    return spec


def hooks(spec: dict[str, Any]) -> dict[str, list[str]]:
    """Hook name -> its arguments after the name, in the spec's order."""
    out = {}
    for hook in spec["containerEdits"]["hooks"]:
        assert hook["hookName"] == "createContainer" and hook["env"] == ["NVIDIA_CTK_DEBUG=false"]
        program, *argv = hook["args"]
        assert program == os.path.basename(hook["path"])
        name, *args = argv[1:] if program == "nvidia-ctk" else argv  # `nvidia-ctk hook <name>`
        out[name] = args
    return out


# ---- hooks ---------------------------------------------------------------------------------------


def test_nvidias_hooks_in_nvidias_order_with_their_arguments(node: tuple[Path, list[GpuInfo], bool]) -> None:
    root, gpus, _ = node
    spec = gpu_spec(root, gpus, hook_path="/usr/local/nvidia/toolkit/nvidia-cdi-hook")
    assert list(hooks(spec)) == [
        "create-symlinks",
        "enable-cuda-compat",
        "update-ldcache",
        "disable-device-node-modification",
        "update-application-profile",
    ]
    assert hooks(spec)["enable-cuda-compat"] == [f"--host-driver-version={DRIVER_VERSION}"]
    assert hooks(spec)["update-ldcache"] == ["--folder", LIB]
    assert hooks(spec)["disable-device-node-modification"] == hooks(spec)["update-application-profile"] == []
    assert hooks(spec)["create-symlinks"][:4] == [
        "--link",
        f"libcuda.so.1::{LIB}/libcuda.so",
        "--link",
        f"libcuda.so.{DRIVER_VERSION}::{LIB}/libcuda.so.1",
    ]


@pytest.mark.parametrize("name", HOOKS)
def test_each_hook_is_left_out_by_its_name(node: tuple[Path, list[GpuInfo], bool], name: str) -> None:
    """`--cdi-disable-hooks <name>` (as NVIDIA's plugin takes it) leaves that hook out, the rest in."""
    root, gpus, _ = node
    parser = argparse.ArgumentParser()
    add_plugin_flags(parser)
    options = resolve(parser.parse_args([*CDI_ON, "--cdi-disable-hooks", name]), {})
    settings = cdi_settings(options.config, options.runtime)
    assert settings is not None and settings.disabled_hooks == (name,)
    left = gpu_spec(root, gpus, disabled_hooks=settings.disabled_hooks)
    assert list(hooks(left)) == [h for h in HOOKS if h != name]
    assert "hooks" not in gpu_spec(root, gpus, disabled_hooks=("all",))["containerEdits"]


def test_the_accepted_hook_names_are_nvidias() -> None:
    """Every hook the spec runs can be named; `chmod` (NVIDIA's deprecated hook, written by neither
    NVIDIA's spec nor nvdp's) and `all` are accepted too; anything else is refused in one line."""
    assert set(CDI_HOOKS) == {*HOOKS, "chmod", "all"}
    parser = argparse.ArgumentParser()
    add_plugin_flags(parser)
    with pytest.raises(
        ConfigError, match=r'--cdi-disable-hooks / CDI_DISABLE_HOOKS: invalid value "ldcache" \(accepted: '
    ):
        resolve(parser.parse_args(["--cdi-disable-hooks", "ldcache"]), {})


def test_cuda_compat_hook_without_a_known_driver_version() -> None:
    """NVIDIA's spec runs enable-cuda-compat without `--host-driver-version` when the version is not
    known; the hooks that need files (symlinks, ldcache) are left out without them."""
    files = NodeFiles(DriverFiles(version=""), {"/dev/nvidia0": None})
    built = build_specs(node_devices(sim_gpus("pcie-4")[:1], None, "uuid"), files, CdiSettings())
    assert hooks(built.specs[GPU_SPEC]) == {
        "enable-cuda-compat": [],
        "disable-device-node-modification": [],
        "update-application-profile": [],
    }


def test_libcuda_dir_names_every_driver_library_directory() -> None:
    libraries = (
        (f"/usr/lib64/libcuda.so.{DRIVER_VERSION}",) * 2,
        (f"{LIB}/libnvidia-ml.so.{DRIVER_VERSION}",) * 2,
        ("/opt/legacy/libnvidia-nvvm70.so.4",) * 2,  # not named with the version: not a driver directory
    )
    files = NodeFiles(DriverFiles(version=DRIVER_VERSION, libraries=libraries), {"/dev/nvidia0": None})
    spec = build_specs(node_devices(sim_gpus("pcie-4")[:1], None, "uuid"), files, CdiSettings()).specs[
        GPU_SPEC
    ]
    assert spec["containerEdits"]["env"] == [
        f"NVIDIA_CTK_LIBCUDA_DIR=/usr/lib64:{LIB}",
        "NVIDIA_VISIBLE_DEVICES=void",
    ]
    assert hooks(spec)["update-ldcache"] == [
        "--folder",
        "/usr/lib64",
        "--folder",
        LIB,
        "--folder",
        "/opt/legacy",
    ]


# ---- device nodes and mounts ---------------------------------------------------------------------


def test_device_nodes_carry_what_stat_gives(node: tuple[Path, list[GpuInfo], bool]) -> None:
    root, gpus, mknod_ok = node
    if not mknod_ok:
        pytest.skip("mknod is not permitted here: the fake nodes are plain files")
    make_char_device(root / "dev/nvidia-modeset", mode=0o640)
    devices = {d["name"]: d for d in gpu_spec(root, gpus)["devices"]}
    assert devices[gpus[1].uuid]["containerEdits"]["deviceNodes"] == [
        {
            "path": "/dev/nvidia1",
            "hostPath": f"{root}/dev/nvidia1",
            "major": 195,
            "minor": 1,
            "fileMode": 0o666,
            "permissions": "rwm",
        }
    ]
    # Zero values are left out, as NVIDIA's Go types leave them out: minor 0 of /dev/nvidia0.
    assert "minor" not in devices[gpus[0].uuid]["containerEdits"]["deviceNodes"][0]
    controls = gpu_spec(root, gpus)["containerEdits"]["deviceNodes"]
    assert [(n["path"], n.get("minor"), n["fileMode"]) for n in controls] == [
        ("/dev/nvidia-modeset", 254, 0o640),
        ("/dev/nvidia-uvm", None, 0o666),
        ("/dev/nvidia-uvm-tools", 1, 0o666),
        ("/dev/nvidiactl", 255, 0o666),
    ]


def test_a_node_that_is_no_device_is_named_by_its_paths_alone(tmp_path: Path) -> None:
    gpus = sim_gpus("pcie-4")[:1]
    make_node(tmp_path, gpus)
    (tmp_path / "dev/nvidia0").unlink()
    (tmp_path / "dev/nvidia0").touch()
    devices = {d["name"]: d for d in gpu_spec(tmp_path, gpus)["devices"]}
    assert devices[gpus[0].uuid]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": f"{tmp_path}/dev/nvidia0"}
    ]


def test_a_node_others_cannot_open_adds_its_group_at_cdi_0_7_0(
    node: tuple[Path, list[GpuInfo], bool],
) -> None:
    """A node of group 44 (mode 0660): NVIDIA's spec gives the device `additionalGids: [44]` so a
    container process of another group can open it, which takes CDI 0.7.0 (the minimum the CDI
    library computes for it); `no-additional-gids-for-device-nodes` keeps the spec at 0.5.0. A node
    of group 44 that others may read and write needs no group."""
    root, gpus, mknod_ok = node
    if not mknod_ok:
        pytest.skip("mknod is not permitted here: the fake nodes are plain files")
    os.chown(root / "dev/nvidia1", 0, 44)
    os.chmod(root / "dev/nvidia1", 0o660)
    os.chown(root / "dev/nvidia0", 0, 45)  # mode 0666: no group needed
    spec = gpu_spec(root, gpus)
    devices = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert spec["cdiVersion"] == "0.7.0"
    assert devices[gpus[1].uuid]["additionalGids"] == devices["all"]["additionalGids"] == [44]
    assert devices[gpus[1].uuid]["deviceNodes"][0]["gid"] == 44
    assert (
        "additionalGids" not in devices[gpus[0].uuid] and devices[gpus[0].uuid]["deviceNodes"][0]["gid"] == 45
    )
    flagged = gpu_spec(root, gpus, feature_flags=("no-additional-gids-for-device-nodes",))
    assert flagged["cdiVersion"] == "0.5.0"
    assert not any("additionalGids" in d["containerEdits"] for d in flagged["devices"])


def test_mounts_are_read_only_recursive_private_binds(node: tuple[Path, list[GpuInfo], bool]) -> None:
    root, gpus, _ = node
    mounts = {m["containerPath"]: m["options"] for m in gpu_spec(root, gpus)["containerEdits"]["mounts"]}
    assert MOUNT_OPTIONS == ("ro", "nosuid", "nodev", "rbind", "rprivate")
    assert mounts.pop("/run/nvidia-persistenced/socket") == list(IPC_MOUNT_OPTIONS)
    assert mounts and set(map(tuple, mounts.values())) == {MOUNT_OPTIONS}


# ---- feature flags -------------------------------------------------------------------------------


def test_explicit_driver_libraries_flag_mounts_nvidias_list(node: tuple[Path, list[GpuInfo], bool]) -> None:
    root, gpus, _ = node
    plain = gpu_spec(root, gpus)["containerEdits"]["mounts"]
    flagged = gpu_spec(root, gpus, feature_flags=("enable-explicit-driver-libraries",))["containerEdits"]
    egl = f"{LIB}/libEGL.so.1.1.0"  # libEGL.so, its symlinks followed, mounted where they lead
    assert egl not in {m["containerPath"] for m in plain}
    assert {"hostPath": f"{root}{egl}", "containerPath": egl, "options": list(MOUNT_OPTIONS)} in flagged[
        "mounts"
    ]
    assert len(flagged["mounts"]) == len(plain) + 1


def test_ipc_discoverer_flag_leaves_the_sockets_out(node: tuple[Path, list[GpuInfo], bool]) -> None:
    root, gpus, _ = node
    flagged = gpu_spec(root, gpus, feature_flags=("disable-ipc-discoverer",))["containerEdits"]["mounts"]
    plain = gpu_spec(root, gpus)["containerEdits"]["mounts"]
    assert [m for m in plain if m not in flagged] == [
        {
            "hostPath": f"{root}/run/nvidia-persistenced/socket",
            "containerPath": "/run/nvidia-persistenced/socket",
            "options": list(IPC_MOUNT_OPTIONS),
        }
    ]


@pytest.mark.parametrize("flag", ["disable-multiple-csv-devices", "disable-nvsandbox-utils"])
def test_flags_for_what_nvdp_never_does_change_nothing(
    node: tuple[Path, list[GpuInfo], bool], flag: str
) -> None:
    """nvdp has no CSV (Tegra) mode and never uses nvsandboxutils: the spec is what it is without."""
    root, gpus, _ = node
    assert gpu_spec(root, gpus, feature_flags=(flag,)) == gpu_spec(root, gpus)


def test_feature_flags_reach_spec_generation() -> None:
    parser = argparse.ArgumentParser()
    add_plugin_flags(parser)
    options = resolve(parser.parse_args(CDI_ON), {"CDI_FEATURE_FLAGS": "disable-ipc-discoverer"})
    settings = cdi_settings(options.config, options.runtime)
    assert settings is not None and settings.feature_flags == ("disable-ipc-discoverer",)
    assert set(CDI_FEATURE_FLAGS) == {
        "disable-ipc-discoverer",
        "disable-multiple-csv-devices",
        "disable-nvsandbox-utils",
        "enable-coherent-annotations",
        "enable-explicit-driver-libraries",
        "no-additional-gids-for-device-nodes",
    }


def refused_at_start(*flags: str) -> str:
    """`nvdp plugin` with `flags`: it must exit 1 at once (a deadline, not a hang, should it serve);
    what it said on stderr."""
    plugin = [sys.executable, "-m", "nvdp.cli", "plugin", "--nvml", "sim:pcie-4", "--metrics-address", ""]
    done = subprocess.run([*plugin, *flags], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert done.returncode == 1, done.stderr
    return done.stderr


def test_unknown_feature_flag_refused_at_start_in_one_line() -> None:
    assert refused_at_start("--cdi-feature-flags", "enable-magic") == (
        'error: --cdi-feature-flags / CDI_FEATURE_FLAGS: invalid value "enable-magic" (accepted: '
        + ", ".join(CDI_FEATURE_FLAGS)
        + ")\n"
    )


def test_coherent_annotations_refused_at_start_in_one_line() -> None:
    """NVIDIA's flag that nvdp cannot apply (it does not read a GPU's coherence) is refused, not ignored."""
    assert refused_at_start("--cdi-feature-flags", "enable-coherent-annotations") == (
        f"error: {COHERENT_ANNOTATIONS_UNSUPPORTED}\n"
    )


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        pytest.param(
            "[disable-ipc-discoverer, enable-magic]",
            'flags.plugin.cdiFeatureFlags[1]: invalid value "enable-magic" (accepted: '
            + ", ".join(CDI_FEATURE_FLAGS)
            + ")",
            id="unknown",
        ),
        pytest.param("enable-coherent-annotations", COHERENT_ANNOTATIONS_UNSUPPORTED, id="unsupported"),
    ],
)
def test_config_check_refuses_feature_flags_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: str, line: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"version: v1\nflags:\n  plugin:\n    cdiFeatureFlags: {flags}\n")
    assert main(["config", "check", str(path)]) == 1
    assert capsys.readouterr().err == f"error: {path}: {line}\n"
