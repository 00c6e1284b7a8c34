"""One error tree for nvdp.

Expected errors (bad config, bad requests, NVML failures) are `NvdpError`s: they are reported as one
clear line, never a traceback. Anything else is a bug. Mapping to gRPC status codes happens in one
place, `nvdp.plugin.server`.
"""

from __future__ import annotations


class NvdpError(Exception):
    """Base of every expected nvdp error."""


class ConfigError(NvdpError):
    """The configuration (flags, env, file) is invalid. Carries every problem found, one per line."""

    def __init__(self, problems: list[str] | str, source: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        prefix = f"{source}: " if source else ""
        super().__init__("; ".join(prefix + p for p in self.problems))


class RequestError(NvdpError):
    """A kubelet request is invalid (unknown device ID, bad size...). Maps to INVALID_ARGUMENT."""


class NvmlError(NvdpError):
    """An NVML call failed. `code` is the NVML error name, e.g. NVML_ERROR_GPU_IS_LOST."""

    def __init__(self, code: str, call: str, detail: str = "", device: str | None = None) -> None:
        self.code = code
        self.call = call
        self.device = device
        where = f" device={device}" if device else ""
        extra = f": {detail}" if detail else ""
        super().__init__(f"{call} failed: {code}{where}{extra}")


class NvmlNotSupported(NvmlError):
    """NVML_ERROR_NOT_SUPPORTED: the device or driver does not offer this query."""


class GpuLostError(NvmlError):
    """NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus or stopped answering."""


class NvmlLibraryNotFound(NvmlError):
    """libnvidia-ml.so.1 could not be loaded (no driver on this node)."""


class RegistrationError(NvdpError):
    """The kubelet refused or did not answer a Register call."""


class KubeError(NvdpError):
    """The Kubernetes API server could not be reached or refused a request (one line)."""
