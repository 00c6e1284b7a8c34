"""The product's timers that tests wait on, as settings with production's defaults (`Timers`).

- A process reads them once, at import, from the env var NVDP_TEST_TIMERS: comma-separated
  `name=duration` pairs, a duration being a Go duration ("500ms") or a number of seconds.
  Example: `NVDP_TEST_TIMERS=stopDeadline=1s,handoffRetry=0.1`.
- The env var is hidden: no flag, no help line, no chart value. Production leaves it unset.
- Tests set it on the processes they start, and shorten only the timers they wait out.
- `nvdp` refuses a bad value at start with one line (`check`); a module reading the timers before
  that check keeps the defaults.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from nvdp.base.errors import ConfigError
from nvdp.base.units import MAX_GO_DURATION_S, parse_go_duration

ENV = "NVDP_TEST_TIMERS"


@dataclass(frozen=True)
class Timers:
    """Seconds; each default is production's."""

    stop_deadline: float = 10.0  # first stop signal to forced exit (nvdp.base.signals)
    request_deadline: float = 3.0  # connection to end of headers (nvdp.base.http_endpoint)
    handoff_retry: float = 5.0  # hand-over look-again period (nvdp.plugins.handoff.records)
    handoff_switch_grace: float = 30.0  # other side still advertising a free GPU: said after this
    handoff_lost_grace: float = 30.0  # record and lock gone: unknown for this long
    node_condition_settle: float = (
        3.0  # a healthy node confirmed after this (nvdp.node.health.node_condition)
    )
    node_condition_pacing: float = 1.0  # the first wait between two writes of the Node condition
    watch_backoff: float = 0.8  # a watch's first wait before a re-list or retry (nvdp.kube.reflector)
    mps_quit_timeout: float = 3.0  # an MPS daemon's `quit` at stop; killed then (nvdp.node.mps.controller)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


NAMES = {_camel(f.name): f.name for f in fields(Timers)}


def _seconds(name: str, text: str) -> float:
    try:
        seconds = float(text) if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text) else parse_go_duration(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_GO_DURATION_S:
        raise ConfigError(f"{ENV}: {name}: must be a duration >= 0 such as 500ms or 0.5, got {text!r}")
    return seconds


def parse(text: str) -> Timers:
    """The timers `text` sets (see the module), the others at their defaults; ConfigError (one line)
    for an unknown name or a bad duration."""
    timers = Timers()
    for pair in filter(None, (p.strip() for p in text.split(","))):
        name, equals, value = pair.partition("=")
        name = name.strip()
        if not equals or name not in NAMES:
            known = ", ".join(sorted(NAMES))
            raise ConfigError(f"{ENV}: {pair!r} is not name=duration with a name of {known}")
        timers = replace(timers, **{NAMES[name]: _seconds(name, value.strip())})
    return timers


def check(environ: Mapping[str, str]) -> Timers:
    """The timers `environ` sets; ConfigError (one line) when NVDP_TEST_TIMERS is bad."""
    return parse(environ.get(ENV, ""))


def _at_import() -> Timers:
    try:
        return check(os.environ)
    except ConfigError:
        return Timers()  # `nvdp` refuses it before any command runs


TIMERS = _at_import()


def as_env(**seconds: float) -> dict[str, str]:
    """`{NVDP_TEST_TIMERS: ...}` setting the given timers (by field name), for a test's process."""
    return {ENV: ",".join(f"{_camel(name)}={value:g}" for name, value in seconds.items())}
