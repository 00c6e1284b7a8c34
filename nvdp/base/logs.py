"""Logging set-up and structured log lines.

Every significant event is one line: a message followed by key=value fields, e.g.
`device unhealthy resource=nvidia.com/gpu device=GPU-... xid=79 reason="GPU has fallen off the bus"`.
With `--log-format json` the same record is one JSON object with the fields as keys.
Use `log_event(logger, logging.WARNING, "device unhealthy", resource=..., xid=79)`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

FIELDS_ATTR = "nvdp_fields"
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
# Between info and warning (syslog's notice): nothing wrong, but what an operator should see, e.g. a
# config key that NVIDIA's plugin ignores and nvdp applies (nvdp.config.notices). Shown at info.
NOTICE = 25
logging.addLevelName(NOTICE, "NOTICE")


def format_value(value: Any) -> str:
    """A value as it appears after `key=` in text logs: quoted when it has spaces or quotes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping | list):  # structured (the start-up config): compact JSON, unquoted
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    text = str(value)
    if text == "" or any(c in text for c in ' "=\t\n'):
        return json.dumps(text)
    return text


def format_fields(fields: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={format_value(v)}" for k, v in fields.items() if v is not None)


def log_event(logger: logging.Logger, level: int, message: str, **fields: Any) -> None:
    """Log one structured line. Fields whose value is None are left out."""
    if logger.isEnabledFor(level):
        logger.log(level, message, extra={FIELDS_ATTR: fields})


class TextFormatter(logging.Formatter):
    """`2026-11-22T10:00:00.123Z level=info logger=nvdp.x msg="..." k=v` is too noisy for
    kubectl logs; we print `<time> <LEVEL> <message> k=v ...`."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        fields: Mapping[str, Any] = getattr(record, FIELDS_ATTR, {})
        line = f"{stamp}.{int(record.msecs):03d}Z {record.levelname:<7} {record.getMessage()}"
        if fields:
            line += " " + format_fields(fields)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields: Mapping[str, Any] = getattr(record, FIELDS_ATTR, {})
        for key, value in fields.items():
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(log_format: str = "text", level: str = "info", stream: Any = None) -> None:
    """Configure the root logger once for a daemon or CLI process."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    # grpc's own logger is chatty at info on some versions.
    logging.getLogger("grpc").setLevel(logging.WARNING)
