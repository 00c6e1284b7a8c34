"""NVIDIA DRA driver checkpoints for the tests, in the form that driver writes (Go's compact JSON,
the kubelet checkpoint manager's checksums): claims prepared by NVIDIA's driver on node-a."""

from __future__ import annotations

import json
from typing import Any

from nvdp.plugins.dra.nvidia_checkpoint import go_checksum

NODE = "node-a"


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def prepared_gpu(uid: str, device: str, gpu_uuid: str, request: str = "gpu") -> dict[str, Any]:
    """One claim's `status` and `preparedDevices`: one whole GPU."""
    result = {"request": request, "driver": "gpu.nvidia.com", "pool": NODE, "device": device}
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    answer = {
        "Requests": [request],
        "PoolName": NODE,
        "DeviceName": device,
        "CDIDeviceIDs": [f"k8s.gpu.nvidia.com/claim={uid}-{device}"],
    }
    return {
        "status": {
            "allocation": {"devices": {"results": [result]}, "nodeSelector": {"nodeSelectorTerms": [term]}}
        },
        "preparedDevices": [
            {
                "devices": [{"gpu": {"info": {"uuid": gpu_uuid}, "device": answer}, "mig": None}],
                "configState": {"mpsControlDaemonID": ""},
            }
        ],
    }


def checkpoint_v1(claims: dict[str, dict[str, Any]]) -> str:
    """Releases 25.3's checkpoint: `{"checksum":C,"v1":{"preparedClaims":...}}`."""
    v1 = compact({"preparedClaims": claims})
    return f'{{"checksum":{_v1_checksum(v1)},"v1":{v1}}}'


def checkpoint_v2(claims: dict[str, dict[str, Any]], boot_id: str) -> str:
    """The current checkpoint: `v1` (the completed claims, without state and names) and `v2`, each
    with its checksum. `claims` are V2 claims (checkpointState, status, preparedDevices, name,
    namespace)."""
    completed = {
        uid: {"status": c["status"], "preparedDevices": c["preparedDevices"]}
        for uid, c in claims.items()
        if c["checkpointState"] == "PrepareCompleted"
    }
    v1 = compact({"preparedClaims": completed})
    body = compact({"preparedClaims": claims, "nodeBootID": boot_id})[1:]  # without its "{"
    zeroed = '{"checksum":0,' + body
    v2 = f'{{"checksum":{go_checksum(zeroed.encode())},{body}'
    return f'{{"checksum":{_v1_checksum(v1)},"v1":{v1},"v2":{v2}}}'


def _v1_checksum(v1: str) -> int:
    """Over the checkpoint without `v2`, its checksum 0."""
    return go_checksum(('{"checksum":0,"v1":' + v1 + "}").encode())


def v2_claim(
    uid: str, name: str, device: str, gpu_uuid: str, state: str = "PrepareCompleted"
) -> dict[str, Any]:
    return {"checkpointState": state, **prepared_gpu(uid, device, gpu_uuid), "name": name, "namespace": "ml"}
