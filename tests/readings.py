"""How the tests read what a daemon says: a page of its HTTP endpoint, its log records as the text log
writes them."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from nvdp.logs import FIELDS_ATTR, format_fields


def http_get(port: int, path: str) -> tuple[int, str]:
    """The status and body of `path` on 127.0.0.1:`port`; (0, "") while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()
    except OSError:
        return 0, ""


def log_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The captured records as the text log writes them, less time and level: `message k=v ...`."""
    return [
        " ".join(part for part in (r.getMessage(), format_fields(getattr(r, FIELDS_ATTR, {}))) if part)
        for r in caplog.records
    ]
