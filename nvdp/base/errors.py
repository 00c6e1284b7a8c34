"""One error tree for nvdp: every expected error class, and the NVML error-name mapping.

- Expected errors (bad config, bad requests, NVML failures) are `NvdpError`s, reported as one
  line, never a traceback; anything else is a bug.
- gRPC status codes are mapped in one place, `nvdp.plugins.deviceplugin.status`.
- Module-private signals that never leave their module are no NvdpError:
  `nvdp.config.values.InvalidValue` and `nvdp.node.nvml.sim.mig.MigLayoutError` (ValueErrors their
  callers turn into field-named `ConfigError` lines), and `nvdp.node.nvml.sim.events.SimEventError` (a
  bad events-file line, logged and skipped).
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


_NVML_ERROR_CLASSES: dict[str, type[NvmlError]] = {
    "NVML_ERROR_NOT_SUPPORTED": NvmlNotSupported,
    "NVML_ERROR_GPU_IS_LOST": GpuLostError,
    "NVML_ERROR_LIBRARY_NOT_FOUND": NvmlLibraryNotFound,
}


def nvml_error(code: str, call: str, detail: str = "", device: str | None = None) -> NvmlError:
    """The NvmlError (or subclass) for an NVML error name, e.g. NVML_ERROR_GPU_IS_LOST."""
    return _NVML_ERROR_CLASSES.get(code, NvmlError)(code, call, detail, device)


class InitError(NvdpError):
    """NVML could not be initialised and fail-on-init-error is set."""


class RegistrationError(NvdpError):
    """The kubelet refused or did not answer a Register call."""


class KubeError(NvdpError):
    """The Kubernetes API server could not be reached or refused a request (one line)."""


class KubeStatusError(KubeError):
    """The API server answered with an error status (or a watch stream with an ERROR event)."""

    def __init__(self, status: int, detail: str, reason: str = "") -> None:
        self.status, self.reason = status, reason
        super().__init__(f"HTTP {status} {' '.join(detail.split())[:200]}")


class KubeGone(KubeStatusError):
    """410 Gone: the resourceVersion asked for is too old (compacted); list again."""


class KubeWatchSilent(KubeError):
    """A watch stream said nothing, not even its headers, for `bound` seconds: taken for dead."""

    def __init__(self, bound: float, last_heard: float) -> None:
        self.last_heard = last_heard  # time.monotonic() of the last bytes (or of the request)
        super().__init__(f"watch silent for {bound:g}s; connection dropped")


class KubeletError(NvdpError):
    """The kubelet stand-in cannot do what was asked (bad socket path, no plugin for a resource...)."""


class PluginNotConnected(KubeletError):
    """No plugin is connected for the resource (never registered, stream ended, kubelet restarted)."""


class PodResourcesUnavailable(NvdpError):
    """The kubelet's PodResources API cannot be read (no socket, not answering): the allocation
    ledger keeps what it read last."""


class DirLockHeld(NvdpError):
    """Another process holds the kubelet directory's lock (fail-on-init-error: exit 1)."""


class MpsError(NvdpError):
    """An MPS control command failed (the binary is missing, exited non-zero or hung)."""


class SelectionError(NvdpError):
    """config-manager: no entry can be selected (unknown label value, missing default, every
    fallback failed)."""


class CandidateError(NvdpError):
    """config-manager: the selected entry cannot be read, or the plugin's loader refuses it."""


class UnreadableFile(NvdpError):
    """A file nvdp was pointed at cannot be read, is not a regular file, or is too large
    (`nvdp.base.files.read_bounded`). `reason` says which, in words ("is a FIFO", "larger than 1 MiB")."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")
