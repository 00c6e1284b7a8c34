"""`nvidia.com/gpu.clique` (pure): the node's NVLink clique, from its GPUs' fabric registration.

It follows NVIDIA's rules (gfd's imex labeler, go-nvlib's IsFabricAttached):
- A GPU counts when attached to the fabric: NVML answered (not NVML_ERROR_NOT_SUPPORTED), the state
  is completed, the cluster UUID is not all zeros, the registration succeeded; others are left out.
- Every GPU that counts must name the same cluster UUID and clique id, else there is no label (one
  warning naming the GPUs of each value).
- The value is `<cluster UUID>.<clique id>`: the UUID in canonical lowercase 8-4-4-4-12 form, the
  clique id in decimal. No GPU counts: no label.
- IMEX / compute-domain scheduling on GB200 / GB300 NVL systems selects nodes by this label.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from nvdp.node.nvml.types import GpuFabric

CLIQUE_LABEL = "nvidia.com/gpu.clique"


def clique_labels(fabrics: Sequence[tuple[int, GpuFabric | None]]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The clique label of GPUs given as (index, fabric info or None), and the warnings."""
    clusters: dict[str, list[int]] = {}
    cliques: dict[int, list[int]] = {}
    for index, fabric in fabrics:
        if fabric is None or not fabric.attached:
            continue
        clusters.setdefault(str(uuid.UUID(bytes=fabric.cluster_uuid)), []).append(index)
        cliques.setdefault(fabric.clique_id, []).append(index)
    for what, seen in (("NVLink domains (cluster UUIDs)", clusters), ("clique ids", cliques)):
        if len(seen) > 1:
            found = "; ".join(f"{value} on GPUs {', '.join(map(str, gpus))}" for value, gpus in seen.items())
            return {}, (f"the GPUs are in different {what}: {found}; no {CLIQUE_LABEL} label",)
    if not clusters:
        return {}, ()
    return {CLIQUE_LABEL: f"{next(iter(clusters))}.{next(iter(cliques))}"}, ()
