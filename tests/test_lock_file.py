"""The one lock file (`nvdp.base.lock_file`): what stands at the path is refused unless it is a regular file,
two processes exclude each other, and a file replaced while a process waits is not taken for the lock.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nvdp.base.lock_file import LockFile, is_locked

# Holds the lock at argv[1] (note: pid and host), says "held"; on stdin "swap" it puts a new file it
# locks too in its place (noted "swapped") and lets the first go, on "release" removes it.
HOLD_LOCK = """
import os, socket, sys
from pathlib import Path
from nvdp.base.lock_file import LockFile
path = Path(sys.argv[1])
lock = LockFile(path, note=f"pid={os.getpid()} host={socket.gethostname()}")
assert lock.acquire() is None
print("held", flush=True)
for line in sys.stdin:
    if line == "swap\\n":
        path.rename(path.with_name("moved-away"))
        second = LockFile(path, note="swapped")
        assert second.acquire() is None
        lock.close()
        print("swapped", flush=True)
    elif line == "release\\n":
        lock.release()
        print("released", flush=True)
"""


class Holder:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def say(self, command: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{command}\n")
        self.process.stdin.flush()
        return self.process.stdout.readline()


@contextmanager
def holder_of(path: Path) -> Iterator[Holder]:
    """Another process holding the lock at `path` until the block ends."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "held\n"
        yield Holder(process)
    finally:
        process.kill()
        process.wait(10)


def test_two_processes_exclude_each_other_and_the_waiter_says_who_holds_it(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    lock = LockFile(path, note="mine")
    with holder_of(path) as holder:
        assert lock.acquire() == f"pid={holder.process.pid} host={socket.gethostname()}"
        assert is_locked(path) and not lock.taken
        assert holder.say("release") == "released\n"
        assert not is_locked(path)
        assert lock.acquire() is None and lock.held
        assert path.read_text() == "mine\n" and path.stat().st_mode & 0o777 == 0o600
    lock.release()
    assert not path.exists() and not lock.taken


def test_a_second_process_finds_the_lock_held_by_this_one(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    lock = LockFile(path, note="pid=1 host=here")
    assert lock.acquire() is None
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, check=True, timeout=30
    )
    assert probe.stdout == "pid=1 host=here\n"
    lock.release()


PROBE = """
import sys
from pathlib import Path
from nvdp.base.lock_file import LockFile
print(LockFile(Path(sys.argv[1])).acquire())
"""


def test_a_file_replaced_while_waiting_is_not_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    lock = LockFile(path)
    with holder_of(path) as holder:
        swaps: list[str] = []

        def wait(_seconds: float) -> None:  # the first wait: the holder replaces the file meanwhile
            if not swaps:
                swaps.append(holder.say("swap"))

        assert lock.acquire(tries=3, wait=wait) == "swapped"
        assert swaps == ["swapped\n"] and not lock.taken


def test_tries_are_bounded_and_waited_between(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    waits: list[float] = []
    with holder_of(path):
        assert LockFile(path).acquire(tries=4, wait=waits.append, every_s=0.5) is not None
    assert waits == [0.5, 0.5, 0.5]


@pytest.mark.parametrize(
    ("make", "error"),
    [
        pytest.param(lambda p: p.symlink_to(p.with_name("target")), "is a symbolic link", id="symlink"),
        pytest.param(lambda p: p.symlink_to(p.with_name("gone") / "x"), "is a symbolic link", id="dangling"),
        pytest.param(os.mkfifo, "is a FIFO", id="fifo"),
        pytest.param(lambda p: p.mkdir(), "Is a directory", id="directory"),
    ],
)
def test_what_is_not_a_regular_file_is_refused_in_one_line(tmp_path: Path, make: object, error: str) -> None:
    path = tmp_path / "x.lock"
    (tmp_path / "target").write_text("")
    make(path)  # type: ignore[operator]
    with pytest.raises(OSError) as raised:
        LockFile(path).acquire()
    assert str(raised.value).split("] ", 1)[1] == f"{error}: '{path}'"
    assert (tmp_path / "target").read_text() == "" and not (tmp_path / "gone").exists()


def test_a_removed_lock_file_is_not_held_and_is_taken_again(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    lock = LockFile(path)
    assert lock.acquire() is None
    path.unlink()
    assert lock.taken and not lock.held
    lock.release()  # not ours any more: nothing to remove
    assert not path.exists()
    assert lock.acquire() is None and lock.held
    lock.close()  # unlocks, leaves the file
    assert path.exists() and not is_locked(path)


def test_is_locked_without_a_file_and_through_a_symlink(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    assert not is_locked(path)
    path.symlink_to(tmp_path / "target")
    with pytest.raises(OSError, match=f"is a symbolic link: '{path}'"):
        is_locked(path)
