"""`nvidia.com/gpu.clique` from the GPUs' NVLink fabric: NVIDIA's rules (which GPUs count, when GPUs
disagree, the value's form), both NVML backends' fabric query (the real one's NVIDIA order of
functions and NOT_SUPPORTED, the simulated node's `fabric` section), and `nvdp gfd` on an NVL node.
The golden label files of the fabric nodes are in tests/test_gfd_labels.py; the C stand-in's struct
layouts in tests/test_nvml_standin.py."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import fake_pynvml as fake
import pytest
from fake_pynvml import FakeGpu, FakePynvml

from nvdp.base.errors import ConfigError, GpuLostError, NvmlError, nvml_error
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.real import RealNvml
from nvdp.node.nvml.sim import SimNvml, load_node_file
from nvdp.node.nvml.types import FabricState, GpuFabric
from nvdp.side.gfd.clique import CLIQUE_LABEL, clique_labels
from nvdp.side.gfd.discover import discover
from testkit import REPO
from tests.test_gfd_process import gfd_argv, gfd_env

CLUSTER = uuid.UUID("5ad4a1c2-3f0e-4b8d-9c61-7e2f40b1d9a3")
OTHER = uuid.UUID("00000000-0000-4000-8000-0000000000ff")
DONE = FabricState.COMPLETED


def fabric(
    cluster: uuid.UUID = CLUSTER, clique: int = 32766, state: int = DONE, status: int = 0
) -> GpuFabric:
    return GpuFabric(cluster.bytes, clique, state, status)


# ---- NVIDIA's rules (pure) ---------------------------------------------------------------------


def test_gpus_of_one_clique_give_the_label_uuid_dot_decimal_clique() -> None:
    labels, warnings = clique_labels([(0, fabric()), (1, fabric()), (2, fabric())])
    assert labels == {CLIQUE_LABEL: "5ad4a1c2-3f0e-4b8d-9c61-7e2f40b1d9a3.32766"} and warnings == ()
    upper = uuid.UUID("ABCDEF01-2345-6789-ABCD-EF0123456789")
    assert clique_labels([(0, fabric(upper, 4294967295))])[0] == {
        CLIQUE_LABEL: "abcdef01-2345-6789-abcd-ef0123456789.4294967295"  # 47 characters at most
    }


@pytest.mark.parametrize(
    "left_out",
    [
        pytest.param(None, id="no-fabric"),
        pytest.param(fabric(state=FabricState.NOT_SUPPORTED), id="state-not-supported"),
        pytest.param(fabric(state=FabricState.NOT_STARTED), id="not-started"),
        pytest.param(fabric(state=FabricState.IN_PROGRESS), id="in-progress"),
        pytest.param(fabric(uuid.UUID(int=0)), id="zero-cluster-uuid"),
        pytest.param(fabric(status=999), id="failed-status"),
    ],
)
def test_gpus_not_attached_to_the_fabric_are_left_out(left_out: GpuFabric | None) -> None:
    """go-nvlib's IsFabricAttached: completed, a cluster UUID, status success. The other GPUs do not
    count, neither for nor against the label."""
    elsewhere = (
        None if left_out is None else GpuFabric(left_out.cluster_uuid, 1, left_out.state, left_out.status)
    )
    for odd in (left_out, elsewhere):
        labels, warnings = clique_labels([(0, fabric()), (1, odd), (2, fabric())])
        assert labels == {CLIQUE_LABEL: f"{CLUSTER}.32766"} and warnings == ()
    assert clique_labels([(0, left_out), (1, left_out)]) == ({}, ())


def test_gpus_that_disagree_give_no_label_and_one_warning_naming_them() -> None:
    labels, warnings = clique_labels(
        [(0, fabric()), (1, fabric(clique=7)), (2, fabric()), (3, fabric(clique=7))]
    )
    assert labels == {}
    assert warnings == (
        "the GPUs are in different clique ids: 32766 on GPUs 0, 2; 7 on GPUs 1, 3; "
        "no nvidia.com/gpu.clique label",
    )
    labels, warnings = clique_labels([(0, fabric()), (1, fabric(OTHER))])
    assert labels == {}
    assert warnings == (
        f"the GPUs are in different NVLink domains (cluster UUIDs): {CLUSTER} on GPUs 0; {OTHER} on GPUs 1; "
        "no nvidia.com/gpu.clique label",
    )


def test_no_gpus_no_label() -> None:
    assert clique_labels([]) == ({}, ())


# ---- the real backend: NVIDIA's order of functions, through pynvml's calling conventions ------


def _real(*gpus: FakeGpu, v1: bool = True) -> tuple[RealNvml, FakePynvml]:
    lib = FakePynvml(list(gpus))
    lib.has_fabric_info_v1 = v1
    nvml = RealNvml(pynvml=lib)
    nvml.init()
    return nvml, lib


def _gpu(n: int, fabric_info: tuple[bytes, int, int, int] | None) -> FakeGpu:
    return FakeGpu(uuid=f"GPU-{n}", bus_id=f"00000000:0{n}:00.0", minor=n, fabric=fabric_info)


def test_real_backend_reads_the_struct_by_reference() -> None:
    nvml, lib = _real(_gpu(0, (CLUSTER.bytes, 32766, 3, 0)), _gpu(1, (bytes(16), 0, 1, 0)))
    assert nvml.gpu_fabric("GPU-0") == fabric()
    assert nvml.gpu_fabric("GPU-1") == GpuFabric(bytes(16), 0, FabricState.NOT_STARTED, 0)
    assert "nvmlDeviceGetGpuFabricInfoV" not in lib.calls  # NVIDIA asks the unversioned one first


def test_real_backend_falls_back_to_the_versioned_function() -> None:
    nvml, lib = _real(_gpu(0, (CLUSTER.bytes, 9, 3, 0)), v1=False)
    assert nvml.gpu_fabric("GPU-0") == fabric(clique=9)
    assert lib.calls[-2:] == ["nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV"]


def test_real_backend_not_supported_is_no_fabric_and_other_errors_raise() -> None:
    nvml, lib = _real(_gpu(0, None), _gpu(1, (CLUSTER.bytes, 1, 3, 0)))
    assert nvml.gpu_fabric("GPU-0") is None
    assert "nvmlDeviceGetGpuFabricInfoV" not in lib.calls  # NOT_SUPPORTED is the answer, not a fallback
    lib.gpus[1].errors["nvmlDeviceGetGpuFabricInfo"] = fake.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(GpuLostError):
        nvml.gpu_fabric("GPU-1")
    lib.gpus[1].errors["nvmlDeviceGetGpuFabricInfo"] = fake.NVML_ERROR_UNKNOWN
    with pytest.raises(NvmlError, match="NVML_ERROR_CODE_999|NVML_ERROR_UNKNOWN"):
        nvml.gpu_fabric("GPU-1")


# ---- the simulated node's fabric section -------------------------------------------------------


def test_simulated_fabric_per_gpu_values(tmp_path: Path) -> None:
    node = load_node_file(REPO / "tests" / "data" / "gfd" / "nodes" / "nvl-partial.yaml")
    assert node.fabric[0] == node.fabric[1] == fabric()
    assert 2 not in node.fabric  # null: no fabric
    assert node.fabric[3] == GpuFabric(CLUSTER.bytes, 0, FabricState.IN_PROGRESS, 0)
    nvml = SimNvml(node)
    nvml.init()
    gpus = nvml.gpus()
    assert [nvml.gpu_fabric(g.uuid) for g in gpus] == [fabric(), fabric(), None, node.fabric[3]]
    plain = open_nvml("sim:dgx-h100")
    plain.init()
    assert plain.gpu_fabric(plain.gpus()[0].uuid) is None  # no fabric section: NOT_SUPPORTED


def test_simulated_fabric_section_problems_are_one_line_each(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "gpus: [{name: NVIDIA GB200, count: 2}]\n"
        "fabric:\n  clique_id: -1\n  state: done\n  status: x\n  colour: red\n"
        "  gpus: {0: {cluster_uuid: not-a-uuid}, 5: {clique_id: 1}, 1: [1]}\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_node_file(path)
    assert raised.value.problems == [
        "fabric.colour: unknown field (accepted: cluster_uuid, clique_id, state, status, gpus)",
        "fabric.cluster_uuid: required: the NVLink domain's UUID, e.g. 6f1c2a9e-0000-4000-8000-000000000001",
        "fabric.clique_id: must be an integer from 0 to 2**32-1, got '-1'",
        "fabric.state: must be one of not_supported, not_started, in_progress, completed, got 'done'",
        "fabric.status: must be an integer from 0 to 2**32-1, got 'x'",
        "fabric.gpus.0.cluster_uuid: must be a UUID, got 'not-a-uuid'",
        "fabric.gpus.5: not a GPU index of this node (0..1)",
        "fabric.gpus.1: must be a mapping of cluster_uuid, clique_id, state, status, or null",
    ]


# ---- labelling a node --------------------------------------------------------------------------


class FabricFailingNvml(SimNvml):
    """The simulated GB200 node whose GPU `failing` answers the fabric query with an NVML error."""

    failing = 1

    def gpu_fabric(self, gpu_uuid: str) -> GpuFabric | None:
        if self.gpus()[self.failing].uuid == gpu_uuid:
            raise nvml_error("NVML_ERROR_UNKNOWN", "nvmlDeviceGetGpuFabricInfo", "unknown error", gpu_uuid)
        return super().gpu_fabric(gpu_uuid)


def test_an_unreadable_fabric_costs_only_the_clique_label() -> None:
    """NVIDIA's gfd fails the whole pass; nvdp labels the rest of the node and says why in one line."""
    from nvdp.config import Config
    from nvdp.node.nvml.sim import load_profile

    nvml = FabricFailingNvml(load_profile("gb200-nvl"))
    nvml.init()
    result = discover(nvml, Config(), machine_type_file="")
    assert CLIQUE_LABEL not in result.labels and result.labels["nvidia.com/gpu.count"] == "4"
    assert len(result.warnings) == 1
    assert result.warnings[0].startswith(
        "cannot read the NVLink fabric of GPU 1: nvmlDeviceGetGpuFabricInfo failed: NVML_ERROR_UNKNOWN"
    )
    assert result.warnings[0].endswith("; no nvidia.com/gpu.clique label")


def test_gfd_on_an_nvl_node_writes_the_clique_and_warns_once_where_gpus_disagree(tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    ok = subprocess.run(
        gfd_argv("--oneshot", "-o", str(out), nvml="sim:gb200-nvl"),
        env=gfd_env(), cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert f"{CLIQUE_LABEL}={CLUSTER}.32766\n" in out.read_text()
    split = REPO / "tests" / "data" / "gfd" / "nodes" / "nvl-split.yaml"
    result = subprocess.run(
        gfd_argv("--oneshot", "-o", str(out), nvml=f"sim:{split}"),
        env=gfd_env(), cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert CLIQUE_LABEL not in out.read_text() and "nvidia.com/gpu.count=4\n" in out.read_text()
    warnings = [line for line in result.stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 1 and "different clique ids: 32766 on GPUs 0, 1, 2; 7 on GPUs 3" in warnings[0]
