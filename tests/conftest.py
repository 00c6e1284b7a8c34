"""Shared fixtures."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.base.logs import JsonFormatter, TextFormatter
from nvdp.sim.kubelet import Kubelet
from testkit import Process, short_temp_dir


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (the default, pyproject's addopts): two workers per CPU this process may run on, up to
    16 (or one per CPU beyond). A test spends most of its time waiting on sockets, child processes and
    timers, so a worker per CPU leaves small machines' CPUs idle; PYTEST_XDIST_AUTO_NUM_WORKERS, when
    set, decides (as pytest-xdist's own rule)."""
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    cpus = len(os.sched_getaffinity(0))
    return min(2 * cpus, max(cpus, 16))


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Pytest's `tmp_path`, made short: tests bind unix sockets in it, and sun_path holds 107 bytes,
    which pytest's own directory (deeper still under pytest-xdist) leaves too little of. Removed after
    the test; what a failed test's processes said is printed (`processes`)."""
    with short_temp_dir() as path:
        yield path


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
    """A second fresh, short directory, for unix sockets apart from the test's files."""
    with short_temp_dir() as path:
        yield path


@pytest.fixture
def kubelet(sock_dir: Path) -> Iterator[Kubelet]:
    """The kubelet stand-in serving in sock_dir."""
    with Kubelet(sock_dir) as kubelet:
        yield kubelet


@pytest.fixture
def processes(tmp_path: Path, sock_dir: Path) -> Iterator[list[Process]]:
    """Plugin processes a test starts; whatever is still running at the end is killed. Their logs are
    printed, which pytest shows when the test failed (set up after the directories the logs are in,
    so torn down before them)."""
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
