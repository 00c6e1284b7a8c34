"""The node file's `fabric` section: each simulated GPU's NVLink fabric registration (what
nvmlDeviceGetGpuFabricInfo answers on a GB200 / GB300 NVL node), validated with every problem named.

```yaml
fabric:
  cluster_uuid: 6f1c2a9e-...   # the NVLink domain (required); all zeros: registered to no domain
  clique_id: 1                 # default 0
  state: completed             # not_supported, not_started, in_progress, completed (default)
  status: 0                    # the registration's nvmlReturn_t; default 0 (success)
  gpus: {3: {clique_id: 2}, 5: null}   # per GPU index: other values, or null (no fabric)
```
- Without the section every GPU answers NVML_ERROR_NOT_SUPPORTED.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from nvdp.node.nvml.types import FabricState, GpuFabric

_FIELDS = ("cluster_uuid", "clique_id", "state", "status", "gpus")
_STATES = {state.name.lower(): state for state in FabricState}
_UINT32 = 2**32 - 1

Fail = Callable[[str, str], None]  # (where, message)


def parse_fabric(value: object, n_gpus: int, fail: Fail) -> dict[int, GpuFabric]:
    """GPU index -> its fabric info (a GPU left out has none). Problems go to `fail`."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        fail("fabric", f"must be a mapping with a cluster_uuid, got {type(value).__name__}")
        return {}
    _unknown(value, _FIELDS, "fabric.", fail)
    if "cluster_uuid" not in value:
        fail(
            "fabric.cluster_uuid",
            "required: the NVLink domain's UUID, e.g. 6f1c2a9e-0000-4000-8000-000000000001",
        )
    base = _info(value, "fabric", GpuFabric(bytes(16), 0, FabricState.COMPLETED), fail)
    fabric = dict.fromkeys(range(n_gpus), base)
    overrides = value.get("gpus", {})
    if not isinstance(overrides, dict):
        fail("fabric.gpus", "must map GPU indices to their own values (or null: no fabric)")
        return fabric
    for index, entry in overrides.items():
        where = f"fabric.gpus.{index}"
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n_gpus:
            fail(where, f"not a GPU index of this node (0..{n_gpus - 1})")
        elif entry is None:
            del fabric[index]
        elif not isinstance(entry, dict):
            fail(where, "must be a mapping of cluster_uuid, clique_id, state, status, or null")
        else:
            _unknown(entry, _FIELDS[:-1], f"{where}.", fail)
            fabric[index] = _info(entry, where, base, fail)
    return fabric


def _info(entry: Mapping[str, Any], where: str, base: GpuFabric, fail: Fail) -> GpuFabric:
    cluster, clique, state, status = base.cluster_uuid, base.clique_id, base.state, base.status
    if "cluster_uuid" in entry:
        import uuid  # only for a node with a fabric: uuid imports platform, a dozen regexes

        try:
            cluster = uuid.UUID(str(entry["cluster_uuid"])).bytes
        except ValueError:
            fail(f"{where}.cluster_uuid", f"must be a UUID, got {str(entry['cluster_uuid'])[:64]!r}")
    if "clique_id" in entry:
        clique = _uint32(entry["clique_id"], f"{where}.clique_id", fail, clique)
    if "state" in entry:
        name = entry["state"]
        if isinstance(name, str) and name in _STATES:
            state = _STATES[name]
        else:
            fail(f"{where}.state", f"must be one of {', '.join(_STATES)}, got {str(name)[:64]!r}")
    if "status" in entry:
        status = _uint32(entry["status"], f"{where}.status", fail, status)
    return GpuFabric(cluster, clique, state, status)


def _uint32(value: object, where: str, fail: Fail, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT32:
        fail(where, f"must be an integer from 0 to 2**32-1, got {str(value)[:64]!r}")
        return default
    return value


def _unknown(entry: Mapping[Any, Any], accepted: tuple[str, ...], prefix: str, fail: Fail) -> None:
    for key in entry:
        if key not in accepted:
            fail(f"{prefix}{str(key)[:64]}", f"unknown field (accepted: {', '.join(accepted)})")
