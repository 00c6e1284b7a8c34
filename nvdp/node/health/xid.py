"""XID catalog and the policy that decides what an NVML event means for a device (pure).

- As NVIDIA's plugin: every XID marks Unhealthy but the application errors 13, 31, 43, 45, 68, 109;
  `DP_DISABLE_HEALTHCHECKS` (comma list, any case; `all` / `xids` or numbers) ignores, malformed
  entries skipped; `DP_ENABLE_HEALTHCHECKS` XIDs always mark; double-bit ECC follows XID 48's rules,
  single-bit only when configured.
- nvdp's: `xids` turns off XID and ECC events, keeping the probe; `all` also the probe; enabled
  XIDs still count under `all`, as NVIDIA documents. `health.ignoredXids` ignores like the env list.
- *Fatal* XIDs (by default NVIDIA's RESET_GPU / RESTART_BM ones, NVLink and double-bit ECC) stay
  Unhealthy until the plugin restarts: it cannot see the reset.
- Others (94, 69, ...: restart the app; 63, 92, 121: ignore) recover after the quiet period once
  a probe passes, unless a pending page retirement / row remap waits for a reset.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from nvdp.base.logs import log_event
from nvdp.node.health.types import HealthSettings
from nvdp.node.nvml.types import EventType, NvmlEvent

log = logging.getLogger(__name__)

DISABLE_ENV = "DP_DISABLE_HEALTHCHECKS"
ENABLE_ENV = "DP_ENABLE_HEALTHCHECKS"
_ALL_TOKENS = frozenset({"all", "xids"})

# Application errors: the GPU is fine, the application that caused them is not (NVIDIA's list).
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

# Short reasons, in our words, for the XIDs one meets on data-centre GPUs (NVIDIA's XID catalog).
XID_REASONS: Mapping[int, str] = {
    8: "GPU stopped processing (engine idle timeout)",
    13: "graphics engine exception (usually an application fault)",
    31: "GPU memory page fault (usually an application fault)",
    32: "invalid or corrupted push buffer stream",
    38: "driver firmware error",
    43: "GPU stopped processing (channel reset after an application fault)",
    44: "graphics engine fault during a context switch",
    45: "preemptive cleanup after an earlier error",
    46: "GPU stopped processing (GPU timeout)",
    48: "double-bit ECC error (uncorrectable memory error)",
    61: "internal micro-controller breakpoint or warning",
    62: "internal micro-controller halt",
    63: "memory page retirement or row remapping recorded (applied at the next GPU reset)",
    64: "memory page retirement or row remapping failed",
    68: "video decoder (NVDEC) exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained memory error (only the affected application was stopped)",
    95: "uncontained memory error",
    109: "context switch timeout",
    110: "security fault",
    119: "GSP firmware RPC timeout",
    120: "GSP firmware error",
    121: "C2C link error",
    136: "NVLink link training failed",
    140: "unrecovered ECC error",
    143: "GPU initialization error",
    154: "GPU recovery action changed",
    155: "NVLink software-defined error",
    156: "resource retirement event (applied at the next GPU reset)",
    158: "GPU fatal timeout",
}

# Never recover without a GPU reset, driver reload or reboot (see the module docstring).
DEFAULT_FATAL_XIDS: frozenset[int] = frozenset(
    {46, 48, 62, 64, 74, 79, 95, 110, 119, 120, 136, 140, 143, 155, 156, 158}
)

DBE_XID = 48  # a double-bit ECC event follows the rules of XID 48


def xid_reason(xid: int) -> str:
    return XID_REASONS.get(xid, f"XID {xid} (not in nvdp's catalog; see NVIDIA's XID catalog)")


@dataclass(frozen=True)
class Verdict:
    """What an event means for the device(s) it concerns."""

    marks_unhealthy: bool
    fatal: bool
    reason: str


def _parse_list(value: str, env: str) -> tuple[bool, frozenset[int]]:
    """NVIDIA's parsing: lower-cased comma list; `all`/`xids` means every XID; junk is skipped."""
    xids: set[int] = set()
    for raw in value.lower().split(","):
        token = raw.strip()
        if token in _ALL_TOKENS:
            return True, frozenset()
        if not token:
            continue
        if not (token.isascii() and token.isdigit()):
            log_event(log, logging.WARNING, "ignoring malformed XID", env=env, value=token)
            continue
        xids.add(int(token))
    return False, frozenset(xids)


@dataclass(frozen=True)
class XidPolicy:
    """Which events mark a device Unhealthy, and which of those are fatal.

    `enabled` False means health checking is off entirely (DP_DISABLE_HEALTHCHECKS=all with nothing
    re-enabled): no event set, no probe, every device stays Healthy.
    """

    ignored: frozenset[int] = APPLICATION_XIDS
    reenabled: frozenset[int] = frozenset()
    ignore_all: bool = False
    enable_all: bool = False
    fatal_xids: frozenset[int] = DEFAULT_FATAL_XIDS
    single_bit_ecc: bool = False
    probe: bool = True

    @classmethod
    def from_env(cls, environ: Mapping[str, str], settings: HealthSettings | None = None) -> XidPolicy:
        settings = settings or HealthSettings()
        disable_all, disabled = _parse_list(environ.get(DISABLE_ENV, ""), DISABLE_ENV)
        enable_all, enabled = _parse_list(environ.get(ENABLE_ENV, ""), ENABLE_ENV)
        fatal = DEFAULT_FATAL_XIDS if settings.fatal_xids is None else frozenset(settings.fatal_xids)
        # "all" turns the active probe off too; "xids" (in our reading) only the XID/ECC events.
        tokens = {t.strip() for t in environ.get(DISABLE_ENV, "").lower().split(",")}
        probe_off = "all" in tokens and not enable_all
        return cls(
            ignored=APPLICATION_XIDS | disabled | frozenset(settings.ignored_xids),
            reenabled=enabled,
            ignore_all=disable_all,
            enable_all=enable_all,
            fatal_xids=fatal,
            single_bit_ecc=settings.single_bit_ecc,
            probe=not probe_off,
        )

    @property
    def events_enabled(self) -> bool:
        """Whether any NVML event can mark a device (else no event set is needed)."""
        return self.enable_all or bool(self.reenabled) or not self.ignore_all

    @property
    def enabled(self) -> bool:
        return self.events_enabled or self.probe

    def is_critical(self, xid: int) -> bool:
        """Whether this XID marks the device Unhealthy."""
        if self.enable_all or xid in self.reenabled:
            return True
        if self.ignore_all:
            return False
        return xid not in self.ignored

    def classify(self, event: NvmlEvent) -> Verdict:
        if event.event_type & EventType.XID_CRITICAL:
            xid = event.data
            return Verdict(self.is_critical(xid), xid in self.fatal_xids, xid_reason(xid))
        if event.event_type & EventType.DOUBLE_BIT_ECC:
            return Verdict(self.is_critical(DBE_XID), DBE_XID in self.fatal_xids, "double-bit ECC error")
        if event.event_type & EventType.SINGLE_BIT_ECC:
            marks = self.single_bit_ecc and (self.enable_all or not self.ignore_all)
            return Verdict(marks, False, "single-bit ECC error")
        return Verdict(False, False, f"NVML event type {int(event.event_type):#x} is not a health event")

    def describe(self) -> dict[str, object]:
        """Fields for the one start-up log line."""
        return {
            "ignored_xids": "all" if self.ignore_all else _join(self.ignored - self.reenabled),
            "reenabled_xids": "all" if self.enable_all else _join(self.reenabled),
            "fatal_xids": _join(self.fatal_xids),
            "single_bit_ecc": self.single_bit_ecc,
            "probe": self.probe,
        }


def _join(xids: frozenset[int]) -> str:
    return ",".join(map(str, sorted(xids))) or "none"
