"""Shared fixtures."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A fresh, short directory for unix sockets: sun_path holds 107 bytes, tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="nvdp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
