"""Shared fixtures."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.kubelet_standin import Kubelet
from nvdp.logs import JsonFormatter, TextFormatter
from nvdp.testing import Process


@pytest.fixture(autouse=True)
def root_logger_restored() -> Iterator[None]:
    """A command run in-process (`main([...])`) sets up logging on the root logger, writing to that
    test's stderr: its handler and level are taken back after the test, so none leaks into the next."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in [h for h in root.handlers if isinstance(h.formatter, TextFormatter | JsonFormatter)]:
        root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A fresh, short directory for unix sockets: sun_path holds 107 bytes, tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="nvdp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(sock_dir: Path) -> Iterator[Kubelet]:
    """The kubelet stand-in serving in sock_dir."""
    with Kubelet(sock_dir) as kubelet:
        yield kubelet


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    """Plugin processes a test starts; whatever is still running at the end is killed. Their logs are
    printed, which pytest shows when the test failed."""
    started: list[Process] = []
    yield started
    for process in started:
        process.kill()
        print(f"---- {' '.join(process.argv[2:])}\n{process.log()[-8000:]}")


@pytest.fixture
def open_umask() -> Iterator[None]:
    """Umask 000 in this process while the test runs, so the processes it starts inherit it."""
    old = os.umask(0)
    yield
    os.umask(old)
