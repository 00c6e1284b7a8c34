"""`nvdp simulate --api dra` on a node with `dra.consumableCapacity`: one GPU shared by three claims,
each allocated by the stand-in scheduler (`consumedCapacity`, `shareID`) and prepared as an MPS client
limited to its share, a fourth that does not fit, then all unprepared. A simulated node runs no MPS
control daemon (`nvdp.plugins.dra.mps`: its ready marker is written instead)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from nvdp.base.bounded import loads_json
from nvdp.base.files import read_bounded
from nvdp.plugins.dra.names import DRIVER_NAME, claim_spec_file
from nvdp.sim.dra.scheduler import AllocationError
from nvdp.sim.kubelet.dra import Claim, DraManager

Allocate = Callable[[str, str, str, Mapping[str, str]], tuple[Claim, dict[str, Any]]]

SHARES: tuple[tuple[str, dict[str, str]], ...] = (
    ("share-a", {"memory": "10Gi", "compute": "50"}),
    ("share-b", {"memory": "1500Mi"}),
    ("share-c", {}),
    ("share-d", {"memory": "30Gi"}),
)


def show_shares(
    out: TextIO, device: dict[str, Any], allocated: Allocate, kubelet: DraManager, cdi_root: str
) -> None:
    """Print the demo; `allocated` makes and allocates a claim (`DraSimulation.allocated`)."""
    name, index = device["name"], device["attributes"]["index"]["int"]
    out.write(f"\n{name} is shared by capacity (allowMultipleAllocations: true):\n")
    for capacity, said in device["capacity"].items():
        policy = said.get("requestPolicy") or {}
        valid = policy.get("validRange") or {}
        out.write(
            f"  {capacity:<8} {said['value']:>6}  default {policy.get('default')}, min {valid.get('min')}, "
            f"step {valid.get('step')}\n"
        )
    selector = f"device.attributes['{DRIVER_NAME}'].index == {index}"
    prepared = []
    for claim_name, asked in SHARES:
        wants = ", ".join(f"{k} {v}" for k, v in asked.items()) or "no capacity (the defaults)"
        out.write(
            f"\nResourceClaim default/{claim_name}: class gpu.nvidia.com where {selector}, asking {wants}\n"
        )
        try:
            ref, claim = allocated(claim_name, "gpu.nvidia.com", selector, asked)
        except AllocationError as error:
            out.write(f"  not allocated: {error}\n")
            continue
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        consumed = ", ".join(f"{k} {v}" for k, v in result["consumedCapacity"].items())
        out.write(
            f"  allocated {result['device']}: consumedCapacity {consumed}; shareID {result['shareID']}\n"
        )
        answer = kubelet.node_prepare(DRIVER_NAME, [ref]).claims[ref.uid]
        if answer.error:
            out.write(f"  NodePrepareResources -> error: {answer.error}\n")
            continue
        prepared.append(ref)
        out.write(
            f"  NodePrepareResources -> {', '.join(answer.devices[0].cdi_device_ids)}; MPS client env:\n"
        )
        spec = loads_json(read_bounded(Path(cdi_root) / claim_spec_file(ref.uid)))
        for device_spec in spec["devices"]:
            for env in device_spec["containerEdits"].get("env") or []:
                if env.startswith("CUDA_MPS_"):
                    out.write(f"    {env}\n")
    kubelet.node_unprepare(DRIVER_NAME, prepared)
    out.write(f"\nNodeUnprepareResources of the {len(prepared)} shares -> their specs removed\n")
