"""How the tests read what a daemon says: a page of its HTTP endpoint, its log records as the text log
writes them, what `nvdp status` prints of it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nvdp.base.logs import FIELDS_ATTR, format_fields
from testkit import REPO, clean_env, http_get

__all__ = ["http_get", "log_lines", "status_lines"]


def log_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The captured records as the text log writes them, less time and level: `message k=v ...`."""
    return [
        " ".join(part for part in (r.getMessage(), format_fields(getattr(r, FIELDS_ATTR, {}))) if part)
        for r in caplog.records
    ]


def status_lines(port: int) -> list[str]:
    """The lines `nvdp status` prints of the daemon whose metrics listen on 127.0.0.1:`port` (it exits 0)."""
    done = subprocess.run(
        [sys.executable, "-m", "nvdp.cli", "status"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=clean_env({"METRICS_ADDRESS": f"127.0.0.1:{port}"}),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()
