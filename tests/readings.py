"""How the tests read what a daemon says: a page of its HTTP endpoint, its log records as the text log
writes them."""

from __future__ import annotations

import pytest

from nvdp.logs import FIELDS_ATTR, format_fields
from nvdp.testing import http_get

__all__ = ["http_get", "log_lines"]


def log_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The captured records as the text log writes them, less time and level: `message k=v ...`."""
    return [
        " ".join(part for part in (r.getMessage(), format_fields(getattr(r, FIELDS_ATTR, {}))) if part)
        for r in caplog.records
    ]
