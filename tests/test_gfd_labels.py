"""GPU feature labels: golden label files per simulated node x MIG strategy x sharing, the agreement
of labels with what the plugin advertises to a kubelet, and the pure label rules.

Regenerate the golden files after an intended change: `NVDP_UPDATE_GOLDEN=1 pytest tests/test_gfd_labels.py`.
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.config import PluginOptions, resolve
from nvdp.node.gpus.devices import AnnotatedID
from nvdp.node.mps.simulated import skip_daemon
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.deviceplugin.daemon import Daemon
from nvdp.side.gfd.discover import discover, pci_mode
from nvdp.side.gfd.labels import (
    GPU_RESOURCE,
    NodeFacts,
    format_labels,
    gpu_family,
    node_labels,
    sanitise,
    single_strategy_problem,
    version_labels,
)
from nvdp.sim.kubelet import Kubelet
from testkit import short_temp_dir
from tests.builders import full_gpu, mig_enabled_gpu

DATA = Path(__file__).resolve().parent / "data" / "gfd"
PROFILES = ("dgx-a100", "dgx-a100-mig", "pcie-4", "dgx-h100")
MACHINE_FILE = DATA / "product_name"


def _node(name: str) -> str:
    return (
        f"sim:{DATA / 'nodes' / (name + '.yaml')}"
        if (DATA / "nodes" / f"{name}.yaml").exists()
        else f"sim:{name}"
    )


# (node, MIG strategy, sharing config or None)
CASES: list[tuple[str, str, str | None]] = [
    (p, m, None) for p in PROFILES for m in ("none", "single", "mixed")
]
CASES += [
    ("a100-mig-single", "single", None),
    ("h100-mig-mixed", "mixed", None),
    ("mixed-models", "none", None),
    ("dgx-a100", "none", "ts"),
    ("dgx-a100", "none", "ts-renamed"),
    ("dgx-a100", "none", "ts-partial"),
    ("dgx-a100", "none", "ts-partial-renamed"),
    ("dgx-a100-mig", "mixed", "ts-mig"),
    ("dgx-h100", "single", "ts"),
    ("pcie-4", "none", "ts-per-gpu"),
    ("dgx-a100", "none", "mps"),
    ("dgx-a100", "none", "mps-renamed"),
    ("dgx-a100", "none", "mps-per-gpu"),
    ("a100-mig-single", "single", "mps"),  # MPS on MIG devices: the plugin refuses the node
    # A MIG-enabled GPU without MIG devices (mig-manager between layouts), alone and beside others.
    *[(n, m, None) for n in ("a100-mig-empty", "dgx-a100-repartition") for m in ("none", "single", "mixed")],
    ("dgx-a100", "none", "ts-unmatched"),  # an entry for a MIG profile on a node without MIG
    ("dgx-a100-mig", "mixed", "ts-unmatched"),  # the same entry where both apply
    ("dgx-a100-mig", "single", "ts"),  # invalid single layout: NVIDIA's whole-GPU sharing label stays
    ("dgx-a100", "none", "ts-rename-all"),  # every GPU renamed: NVIDIA's gpu.* values, -SHARED kept
    ("a100-mig-single", "none", None),  # MIG-enabled GPUs under none: NVIDIA's gpu.replicas=0
    # The NVLink fabric: one clique, GPUs left out (no fabric, registration not done), GPUs that disagree
    *[(n, "none", None) for n in ("gb200-nvl", "nvl-partial", "nvl-split")],
]


def _case_id(case: tuple[str, str, str | None]) -> str:
    node, mig, sharing = case
    return f"{node}-{mig}" + (f"-{sharing}" if sharing else "")


def _config(
    node: str,
    mig: str,
    sharing: str | None,
    kubelet_socket: str = "/tmp/unused/kubelet.sock",
    mps_root: str = "/tmp/unused/mps",
) -> PluginOptions:
    args = argparse.Namespace(
        nvml=_node(node),
        mig_strategy=mig,
        config_file=str(DATA / "configs" / f"{sharing}.yaml") if sharing else None,
        kubelet_socket=kubelet_socket,
        metrics_address="",
    )
    return resolve(args, {"MPS_ROOT": mps_root} if sharing and sharing.startswith("mps") else {})


def _labels(options: PluginOptions) -> dict[str, str]:
    config, nvml = options.config, open_nvml(options.runtime.nvml)
    nvml.init()
    try:
        return discover(nvml, config, machine_type_file=str(MACHINE_FILE)).labels
    finally:
        nvml.shutdown()


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_golden_label_file(case: tuple[str, str, str | None]) -> None:
    text = format_labels(_labels(_config(*case)))
    golden = DATA / f"{_case_id(case)}.labels"
    if os.environ.get("NVDP_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"labels differ from {golden.name}"


# ---- agreement with the plugin, through the kubelet stand-in ----------------------------------


@pytest.fixture(scope="module")
def short_dir() -> Iterator[Path]:
    with short_temp_dir("nvdp-gfd-") as path:
        yield path


def _advertised(config: PluginOptions, plugin_dir: Path) -> dict[str, list[str]]:
    """Resource name -> device IDs, as the kubelet stand-in sees them from the real plugin daemon
    (with MPS, once the ready markers the control daemon would write exist)."""
    skip_daemon(config.config)
    with Kubelet(plugin_dir) as kubelet:
        daemon = Daemon(config, reload_config=lambda: config, environ={})
        thread = threading.Thread(target=daemon.run, daemon=True)
        thread.start()
        try:
            assert daemon.ready.wait(20), "the plugin did not register"
            names = list(daemon.supervisor.servers)
            return {name: list(kubelet.wait_for_devices(name, timeout=20)) for name in names}
        finally:
            daemon.request_stop()
            thread.join(10)


# Layouts NVIDIA's gfd labels invalid under the single strategy (nvdp's plugin serves part of some of
# them, or nothing), and a node whose only GPU has no MIG devices yet (nothing advertised under
# mixed): labelled as NVIDIA's gfd labels them, tested below.
LABELLED_APART = [
    ("dgx-a100-mig", "single", None),
    ("dgx-a100-mig", "single", "ts"),
    ("a100-mig-single", "single", "mps"),
    ("a100-mig-empty", "single", None),
    ("a100-mig-empty", "mixed", None),
    ("dgx-a100-repartition", "single", None),
    # MIG-enabled GPUs under the none strategy: NVIDIA's gpu.replicas=0 although the plugin serves them
    ("a100-mig-empty", "none", None),
    ("a100-mig-single", "none", None),
]
VALID_CASES = [c for c in CASES if c not in LABELLED_APART]


@pytest.mark.parametrize("case", VALID_CASES, ids=_case_id)
def test_labels_agree_with_advertised_resources(case: tuple[str, str, str | None], short_dir: Path) -> None:
    plugin_dir = short_dir / _case_id(case)[:40]
    plugin_dir.mkdir()
    config = _config(*case, kubelet_socket=str(plugin_dir / "kubelet.sock"), mps_root=str(plugin_dir / "mps"))
    labels = _labels(config)
    advertised = _advertised(config, plugin_dir)
    assert advertised, "the plugin advertised nothing"
    for name, ids in advertised.items():
        units: dict[str, int] = {}
        for device_id in ids:
            parsed = AnnotatedID.parse(device_id)
            units[parsed.uuid] = units.get(parsed.uuid, 0) + 1
        assert labels[f"{name}.count"] == str(len(units)), name
        # per-GPU replica counts: the most devices the kubelet sees for one GPU
        assert labels[f"{name}.replicas"] == str(max(units.values())), name
        shared = max(units.values()) > 1
        assert (labels[f"{name}.sharing-strategy"] != "none") == shared, name
    # mps.capable (which schedules the MPS control daemon) exactly when an MPS resource is served
    mps_served = any(labels[f"{name}.sharing-strategy"] == "mps" for name in advertised)
    assert labels["nvidia.com/mps.capable"] == str(mps_served).lower()
    # Every resource the labels count is one the kubelet sees; nvidia.com/gpu when it is not advertised
    # says 0, or what NVIDIA's gfd says of GPUs all shared under a new name (test below).
    counted = {k[: -len(".count")] for k, v in labels.items() if k.endswith(".count") and v != "0"}
    if GPU_RESOURCE not in advertised and counted - set(advertised):
        assert case[2] is not None and "rename" in case[2]
        counted.discard(GPU_RESOURCE)
    assert counted == set(advertised)


# Sharing entries that move every GPU of nvidia.com/gpu to a new name: NVIDIA's gfd ignores the rename
# (DisableResourceNamingInConfig) and labels nvidia.com/gpu with the GPUs, replicas and strategy, the
# product without -SHARED only under renameByDefault (its rename then stays <name>.shared).
@pytest.mark.parametrize(
    ("sharing", "renamed_to", "expected"),
    [
        pytest.param(
            "ts-renamed", "gpu.shared", ("8", "4", "time-slicing", "NVIDIA-A100-SXM4-40GB"), id="ts"
        ),
        pytest.param("mps-renamed", "gpu.shared", ("8", "4", "mps", "NVIDIA-A100-SXM4-40GB"), id="mps"),
        pytest.param(
            "ts-rename-all",
            "gpu-shared",
            ("8", "3", "time-slicing", "NVIDIA-A100-SXM4-40GB-SHARED"),
            id="rename",
        ),
    ],
)
def test_gpus_shared_under_a_new_name_keep_nvidias_gpu_labels(
    sharing: str, renamed_to: str, expected: tuple[str, str, str, str]
) -> None:
    labels = _labels(_config("dgx-a100", "none", sharing))
    keys = ("count", "replicas", "sharing-strategy", "product")
    assert tuple(labels[f"nvidia.com/gpu.{k}"] for k in keys) == expected
    # nvdp's labels of the resource the plugin advertises stay beside them
    shared = tuple(labels[f"nvidia.com/{renamed_to}.{k}"] for k in keys)
    assert shared == (expected[0], expected[1], expected[2], "NVIDIA-A100-SXM4-40GB")


@pytest.mark.parametrize("node", ["a100-mig-empty", "a100-mig-single"])
def test_mig_enabled_gpus_under_the_none_strategy_have_nvidias_zero_replicas(node: str) -> None:
    """NVIDIA's gfd labels MIG-enabled GPUs without sharing (replicas 0) unless a MIG-disabled GPU of
    the same model labels over them; the plugin still serves them whole under `none`."""
    labels = _labels(_config(node, "none", None))
    assert (labels["nvidia.com/gpu.replicas"], labels["nvidia.com/gpu.sharing-strategy"]) == ("0", "none")
    assert labels["nvidia.com/gpu.count"] == ("1" if node == "a100-mig-empty" else "2")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    beside = _labels(_config("dgx-a100-mig", "none", "ts"))  # GPUs 4-7 are MIG-disabled
    assert (beside["nvidia.com/gpu.replicas"], beside["nvidia.com/gpu.count"]) == ("4", "8")


# What NVIDIA's gfd writes for a node whose only GPU is MIG-enabled without MIG devices, with the
# timestamp: 27 labels under mixed and under single (its whole-GPU labels, then the invalid ones).
NVIDIA_KEYS_ONE_EMPTY_MIG_GPU = {
    *(f"nvidia.com/cuda.{k}" for k in ("driver.major", "driver.minor", "driver.rev", "runtime.major")),
    *(f"nvidia.com/cuda.{k}" for k in ("runtime.minor", "runtime-version.major", "runtime-version.minor")),
    *(f"nvidia.com/cuda.driver-version.{k}" for k in ("major", "minor", "revision", "full")),
    "nvidia.com/cuda.runtime-version.full",
    *(f"nvidia.com/gpu.{k}" for k in ("product", "count", "replicas", "sharing-strategy", "memory")),
    *(f"nvidia.com/gpu.{k}" for k in ("family", "compute.major", "compute.minor", "mode", "machine")),
    "nvidia.com/mig.capable",
    "nvidia.com/mig.strategy",
    "nvidia.com/mps.capable",
    "nvidia.com/vgpu.present",
}


@pytest.mark.parametrize("mig", ["mixed", "single"])
def test_a_mig_gpu_without_mig_devices_gets_nvidias_labels(mig: str) -> None:
    labels = _labels(_config("a100-mig-empty", mig, None))
    assert set(labels) == NVIDIA_KEYS_ONE_EMPTY_MIG_GPU and len(labels) + 1 == 27  # + the timestamp
    assert labels["nvidia.com/mig.strategy"] == mig and labels["nvidia.com/mig.capable"] == "true"
    identity = {
        k: labels["nvidia.com/gpu." + k] for k in ("family", "compute.major", "compute.minor", "mode")
    }
    assert identity == {"family": "ampere", "compute.major": "8", "compute.minor": "0", "mode": "compute"}
    assert labels["nvidia.com/gpu.replicas"] == "0" and labels["nvidia.com/gpu.sharing-strategy"] == "none"
    product = "NVIDIA-A100-SXM4-40GB" + ("-MIG-INVALID" if mig == "single" else "")
    assert labels["nvidia.com/gpu.product"] == product


@pytest.mark.parametrize(
    ("node", "sharing", "reason"),
    [
        pytest.param("dgx-a100-mig", None, "devices with MIG enabled and disable detected", id="mixed-modes"),
        pytest.param(
            "dgx-a100-mig", "ts", "devices with MIG enabled and disable detected", id="mixed-modes-ts"
        ),
        pytest.param("a100-mig-empty", None, "at least one MIG device is enabled but empty", id="empty"),
        pytest.param(
            "dgx-a100-repartition", None, "at least one MIG device is enabled but empty", id="repartition"
        ),
        pytest.param("a100-mig-single", "mps", "MPS sharing is not supported for MIG devices", id="mps"),
    ],
)
def test_invalid_single_layouts_keep_nvidias_whole_gpu_labels(
    node: str, sharing: str | None, reason: str
) -> None:
    options = _config(node, "single", sharing)
    config, nvml = options.config, open_nvml(options.runtime.nvml)
    nvml.init()
    try:
        result = discover(nvml, config, machine_type_file="")
    finally:
        nvml.shutdown()
    labels = result.labels
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-INVALID"
    zeros = {k: labels["nvidia.com/gpu." + k] for k in ("count", "replicas", "memory")}
    assert zeros == {"count": "0", "replicas": "0", "memory": "0"}
    # NVIDIA's whole-GPU labels stay: the GPUs' architecture, mode and sharing strategy.
    assert (labels["nvidia.com/gpu.family"], labels["nvidia.com/gpu.mode"]) == ("ampere", "compute")
    assert (labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]) == ("8", "0")
    # Time-slicing whole GPUs shows where the node has MIG-disabled GPUs (dgx-a100-mig's GPUs 4-7).
    assert labels["nvidia.com/gpu.sharing-strategy"] == ("time-slicing" if sharing == "ts" else "none")
    assert labels["nvidia.com/mps.capable"] == "false"
    assert result.warnings == (f"invalid configuration for mig-strategy=single: {reason}",)


@pytest.mark.parametrize(
    ("gpus", "sharing", "reason"),
    [
        pytest.param([full_gpu(0), full_gpu(1)], "none", None, id="no-mig"),
        pytest.param([mig_enabled_gpu(0, "1g.5gb"), mig_enabled_gpu(1, "1g.5gb")], "none", None, id="valid"),
        pytest.param(
            [mig_enabled_gpu(0, "1g.5gb"), mig_enabled_gpu(1)],
            "none",
            "at least one MIG device is enabled but empty",
            id="empty",
        ),
        pytest.param(
            [mig_enabled_gpu(0, "1g.5gb"), full_gpu(1)],
            "none",
            "devices with MIG enabled and disable detected",
            id="mixed-modes",
        ),
        pytest.param(  # NVIDIA checks for an empty MIG GPU first
            [mig_enabled_gpu(0), full_gpu(1)],
            "none",
            "at least one MIG device is enabled but empty",
            id="order",
        ),
        pytest.param(
            [mig_enabled_gpu(0, "1g.5gb"), mig_enabled_gpu(1, "2g.10gb")],
            "none",
            "more than one MIG device type present on node",
            id="profiles",
        ),
        pytest.param(
            [mig_enabled_gpu(0, "1g.5gb")], "mps", "MPS sharing is not supported for MIG devices", id="mps"
        ),
        pytest.param([mig_enabled_gpu(0, "1g.5gb")], "time-slicing", None, id="time-slicing"),
    ],
)
def test_single_strategy_problems_are_nvidias(gpus: list[GpuInfo], sharing: str, reason: str | None) -> None:
    assert single_strategy_problem(gpus, sharing) == reason


def test_mps_on_mig_devices_is_labelled_invalid_and_not_mps_capable() -> None:
    # The plugin refuses MPS on MIG devices; NVIDIA's GFD fails the pass ("MPS sharing is not
    # supported for mig devices"). nvdp labels what the plugin advertises: nothing, and no MPS
    # control daemon is scheduled (mps.capable=false).
    labels = _labels(_config("a100-mig-single", "single", "mps"))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-INVALID"
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.replicas"]) == ("0", "0")
    assert labels["nvidia.com/mps.capable"] == "false"


@pytest.mark.parametrize(
    ("sharing", "expected"),
    [
        pytest.param(
            "mps",
            {"gpu.product": "NVIDIA-A100-SXM4-40GB-SHARED", "gpu.replicas": "4", "gpu.count": "8"},
            id="mps",
        ),
        pytest.param(
            "mps-renamed",
            {
                "gpu.count": "8",
                "gpu.product": "NVIDIA-A100-SXM4-40GB",
                "gpu.shared.product": "NVIDIA-A100-SXM4-40GB",
                "gpu.shared.replicas": "4",
                "gpu.shared.sharing-strategy": "mps",
            },
            id="renamed",
        ),
        pytest.param(
            "mps-per-gpu",
            {"gpu.product": "NVIDIA-A100-SXM4-40GB-SHARED", "gpu.replicas": "4", "gpu.count": "8"},
            id="per-gpu",
        ),
    ],
)
def test_mps_labels(sharing: str, expected: dict[str, str]) -> None:
    labels = _labels(_config("dgx-a100", "none", sharing))
    assert {k: labels["nvidia.com/" + k] for k in expected} == expected
    assert labels["nvidia.com/mps.capable"] == "true"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"


# ---- pure rules --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capability", "family"),
    [
        pytest.param((3, 7), "kepler", id="kepler"),
        pytest.param((6, 0), "pascal", id="pascal"),
        pytest.param((7, 0), "volta", id="volta"),
        pytest.param((7, 5), "turing", id="turing"),
        pytest.param((8, 6), "ampere", id="ampere"),
        pytest.param((8, 9), "ada-lovelace", id="ada"),
        pytest.param((9, 0), "hopper", id="hopper"),
        pytest.param((10, 0), "blackwell", id="blackwell"),
        pytest.param((12, 0), "blackwell", id="blackwell-rtx"),
        pytest.param((4, 0), "undefined", id="unknown"),
    ],
)
def test_family_from_compute_capability(capability: tuple[int, int], family: str) -> None:
    assert gpu_family(*capability) == family


def test_product_is_sanitised() -> None:
    assert sanitise("NVIDIA  A100-SXM4-40GB (rev/2)") == "NVIDIA-A100-SXM4-40GB-rev2"


@pytest.mark.parametrize(
    ("driver", "cuda", "error"),
    [
        pytest.param("550", "12.4", 'driver version "550" does not match the format X.Y[.Z]', id="short"),
        pytest.param(
            "550.1.2.3", "12.4", 'driver version "550.1.2.3" does not match the format X.Y[.Z]', id="long"
        ),
        pytest.param(
            "550.54", "twelve", 'CUDA driver version "twelve" does not match the format X.Y', id="cuda"
        ),
    ],
)
def test_bad_versions_are_one_line(driver: str, cuda: str, error: str) -> None:
    with pytest.raises(ValueError) as raised:
        version_labels(driver, cuda)
    assert str(raised.value) == error


def test_two_part_driver_version_has_an_empty_revision() -> None:
    labels = version_labels("550.54", "12.4")
    assert labels["nvidia.com/cuda.driver-version.revision"] == ""
    assert labels["nvidia.com/cuda.driver.rev"] == ""


def test_no_gpus_no_labels() -> None:
    result = node_labels(NodeFacts((), "550.54.15", "12.4"), (), mig_strategy="none", sharing_strategy="none")
    assert result.labels == {} and result.warnings


def test_graphics_mode_from_the_pci_class(tmp_path: Path) -> None:
    (tmp_path / "0000:07:00.0").mkdir()
    (tmp_path / "0000:07:00.0" / "class").write_text("0x030000\n")
    assert pci_mode("00000000:07:00.0", tmp_path) == "graphics"
    (tmp_path / "0000:07:00.0" / "class").write_text("0x030200\n")
    assert pci_mode("00000000:07:00.0", tmp_path) == "compute"
    assert pci_mode("00000000:08:00.0", tmp_path) == "unknown"


def test_mode_label_uses_the_reader() -> None:
    gpu = full_gpu(
        0,
        name="Tesla T4",
        memory_bytes=15360 * 2**20,
        compute_capability=(7, 5),
        numa_node=None,
        mig_capable=False,
    )
    from nvdp.node.gpus.resources import build_resources

    facts = NodeFacts((gpu,), "550.54.15", "12.4", modes={"GPU-0": "graphics"})
    labels = node_labels(
        facts, build_resources([gpu]).resources, mig_strategy="none", sharing_strategy="none"
    ).labels
    assert labels["nvidia.com/gpu.mode"] == "graphics"
    assert labels["nvidia.com/gpu.family"] == "turing"


@pytest.mark.parametrize(
    ("machine", "label"),
    [
        pytest.param("NVIDIA DGX A100\n", "NVIDIA-DGX-A100", id="spaces"),
        pytest.param("Standard PC (Q35 + ICH9, 2009)", "Standard-PC-Q35-ICH9-2009", id="qemu"),
        pytest.param("x" * 70, "x" * 63, id="long"),
        pytest.param("  ", "unknown", id="empty"),
    ],
)
def test_machine_type_is_a_valid_label_value(machine: str, label: str) -> None:
    from nvdp.side.gfd.labels import sanitise_machine

    assert sanitise_machine(machine) == label
