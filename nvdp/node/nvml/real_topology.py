"""The real backend's topology queries: PCIe common ancestor and NVLinks between two GPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nvdp.base.errors import NvmlError, nvml_error
from nvdp.node.nvml.naming import normalize_bus_id
from nvdp.node.nvml.types import GpuLink, PcieLevel

if TYPE_CHECKING:
    from nvdp.node.nvml.real import RealNvml


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RealTopology:
    """Links between GPUs through pynvml; caches each GPU's NVLink remotes for one NVML session."""

    def __init__(self, nvml: RealNvml) -> None:
        self._nvml = nvml
        self._remotes_cache: dict[str, list[tuple[str, bool]]] = {}

    def link(self, uuid_a: str, uuid_b: str) -> GpuLink:
        call = "nvmlDeviceGetTopologyCommonAncestor"
        if uuid_a == uuid_b:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT", call, "both devices are the same GPU", uuid_a)
        a, b = self._nvml._handle(uuid_a), self._nvml._handle(uuid_b)
        level = int(self._nvml._call(call, a, b, device=f"{uuid_a},{uuid_b}"))
        try:
            pcie = PcieLevel(level)
        except ValueError:  # a level newer than this code: assume the farthest
            pcie = PcieLevel.SYSTEM
        return GpuLink(self._nvlinks(uuid_a, a, uuid_b, b), pcie)

    def _nvlinks(self, uuid_a: str, a: Any, uuid_b: str, b: Any) -> int:
        """Direct NVLinks from a to b, plus (on NVSwitch systems) the links both have into the
        switch fabric when NVML reports NVLink P2P between them; NVIDIA's plugin ignores the latter."""
        remotes_a, remotes_b = self._remotes(uuid_a, a), self._remotes(uuid_b, b)
        bus_b = self._nvml._bus_id(uuid_b, b)
        links = sum(1 for bus, _ in remotes_a if bus == bus_b)
        switch_a = sum(1 for _, is_switch in remotes_a if is_switch)
        switch_b = sum(1 for _, is_switch in remotes_b if is_switch)
        if switch_a and switch_b and self._p2p_nvlink(a, b, uuid_a, uuid_b):
            links += min(switch_a, switch_b)
        return links

    def _remotes(self, uuid: str, handle: Any) -> list[tuple[str, bool]]:
        """(remote bus id, remote is an NVSwitch) of each active NVLink of a GPU."""
        if uuid in self._remotes_cache:
            return self._remotes_cache[uuid]
        remotes = []
        for link in range(int(getattr(self._nvml._nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if (
                    self._nvml._call("nvmlDeviceGetNvLinkState", handle, link, device=uuid)
                    != self._nvml._nv.NVML_FEATURE_ENABLED
                ):
                    continue
                remote = self._nvml._call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link, device=uuid)
            except NvmlError as e:
                if e.code in ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT"):
                    continue  # no such link on this GPU
                raise
            remotes.append(
                (normalize_bus_id(_text(remote.busId)), self._remote_is_switch(handle, link, uuid))
            )
        self._remotes_cache[uuid] = remotes
        return remotes

    def _remote_is_switch(self, handle: Any, link: int, uuid: str) -> bool:
        try:
            kind = self._nvml._call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link, device=uuid)
        except NvmlError:  # older driver: the remote's type is unknown
            return False
        return bool(kind == getattr(self._nvml._nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2))

    def _p2p_nvlink(self, a: Any, b: Any, uuid_a: str, uuid_b: str) -> bool:
        try:
            status = self._nvml._call(
                "nvmlDeviceGetP2PStatus",
                a,
                b,
                self._nvml._nv.NVML_P2P_CAPS_INDEX_NVLINK,
                device=f"{uuid_a},{uuid_b}",
            )
        except NvmlError:  # cannot tell: trust the switch links
            return True
        return bool(status == self._nvml._nv.NVML_P2P_STATUS_OK)
