"""What the allocation ledger knows (pure): which container holds which device of which resource,
as the kubelet records it, and one snapshot of that record."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Holding:
    """One device ID of one resource, held by one container (as the kubelet's PodResources API says).

    `uid` is the pod's UID when the kubelet's device checkpoint names it (the PodResources API does
    not carry it); None when unknown. `claim` (`namespace/name`) is the ResourceClaim a DRA device is
    held through ("" for the device plugin's devices; `container` is then "" as well)."""

    resource: str
    device_id: str
    namespace: str
    pod: str
    container: str
    uid: str | None = None
    claim: str = ""

    @property
    def pod_key(self) -> str:
        """`namespace/name`, as kubectl names a pod."""
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True)
class LedgerSnapshot:
    """The ledger at one read. `read_at` is the wall-clock time (time.time()) of the last successful
    read, None before the first; `problem` says why the last read failed (the holdings are then those
    of the last successful read), None when it worked."""

    source: str  # the PodResources socket read
    holdings: tuple[Holding, ...] = ()
    read_at: float | None = None
    problem: str | None = None
    _by_device: dict[tuple[str, str], list[Holding]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for holding in self.holdings:
            self._by_device.setdefault((holding.resource, holding.device_id), []).append(holding)

    def held(self, resource: str, device_ids: Collection[str]) -> list[Holding]:
        """The holdings of these devices of `resource`, in the order of `device_ids`."""
        return [h for device_id in device_ids for h in self._by_device.get((resource, device_id), ())]

    def holders(self, resource: str, device_id: str) -> list[Holding]:
        return list(self._by_device.get((resource, device_id), ()))
