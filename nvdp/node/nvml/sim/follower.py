"""Follow a file like `tail -F`: hand every line appended to it to a callback, from one thread.

- It polls stat() every `interval_s`, starts at the file's end, and copes with the file appearing
  later, truncated, removed or replaced.
- A line is handed over once its newline is written; callback failures are logged, never fatal.
- A line over `max_line` bytes is dropped with one warning (skipped to the next newline).
- Only a regular file is read, at most 1 MiB a poll; a directory, FIFO or device is one warning and
  never opened (O_NONBLOCK, so a FIFO swapped in cannot block).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from nvdp.base.files import OPEN_FLAGS, not_regular

logger = logging.getLogger(__name__)

_MAX_READ = 1 << 20
MAX_LINE = 64 * 1024  # bytes; an events-file line is a small JSON object


class FileFollower:
    def __init__(
        self,
        path: str,
        on_line: Callable[[str], None],
        interval_s: float = 0.02,
        max_line: int = MAX_LINE,
    ) -> None:
        self._path = path
        self._max_line = max_line
        self._skipping = False  # inside an over-long line: drop bytes up to its newline
        self._on_line = on_line
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file being read
        self._offset = 0
        self._partial = b""
        self._last_error = ""
        self._refused: tuple[int, int, str] | None = None  # the non-regular file last warned about

    def start(self) -> None:
        """Start following from the file's current end (from its start if it appears later)."""
        if self._thread is not None:
            return
        try:
            st = os.stat(self._path)
            self._identity, self._offset = (st.st_dev, st.st_ino), st.st_size
            self._regular(st)  # a directory, FIFO or device there: said now, once
        except OSError:
            self._identity, self._offset = None, 0
        if not os.path.isdir(os.path.dirname(os.path.abspath(self._path))):
            logger.warning(
                "simulated events file's directory does not exist; nothing is read until it does file=%s",
                self._path,
            )
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvdp-sim-events", daemon=True)
        self._thread.start()
        logger.info("following simulated events file=%s", self._path)

    def stop(self) -> None:
        """Stop the thread and wait for it. Idempotent."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.poll()
            except Exception as e:  # the follower never dies
                message = f"{type(e).__name__}: {e}"
                if message != self._last_error:
                    logger.warning("simulated events file unreadable file=%s error=%r", self._path, message)
                self._last_error = message

    def poll(self) -> None:
        """Read what was appended since the last poll and hand over its complete lines."""
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            self._identity, self._offset, self._partial, self._skipping = None, 0, b"", False
            return
        if not self._regular(st):
            return
        identity = (st.st_dev, st.st_ino)
        if identity != self._identity or st.st_size < self._offset:  # new file, or truncated
            self._identity, self._offset, self._partial, self._skipping = identity, 0, b"", False
        if st.st_size == self._offset:
            return
        fd = os.open(self._path, OPEN_FLAGS)  # a FIFO swapped in after stat() cannot block the open
        try:
            st = os.fstat(fd)
            if not self._regular(st):
                return
            if (st.st_dev, st.st_ino) != self._identity:  # replaced between stat and open
                self._identity, self._offset, self._partial, self._skipping = (
                    (st.st_dev, st.st_ino),
                    0,
                    b"",
                    False,
                )
            data = os.pread(fd, _MAX_READ, self._offset)
        finally:
            os.close(fd)
        self._last_error = ""
        self._offset += len(data)
        for raw in self._complete_lines(data):
            try:
                self._on_line(raw.decode("utf-8", errors="replace"))
            except Exception:  # one bad line never stops the follower
                logger.exception("simulated event line failed file=%s", self._path)

    def _regular(self, st: os.stat_result) -> bool:
        """Whether the path is a regular file now; one warning when it is something else (a FIFO or
        a device is never read: it could block the follower or never end)."""
        kind = not_regular(st.st_mode)
        if kind is None:
            self._refused = None
            return True
        if (st.st_dev, st.st_ino, kind) != self._refused:
            logger.warning("simulated events file %s; nothing is read while it is file=%s", kind, self._path)
            self._refused = (st.st_dev, st.st_ino, kind)
        self._identity, self._offset, self._partial, self._skipping = None, 0, b"", False
        return False

    def _complete_lines(self, data: bytes) -> list[bytes]:
        """The lines `data` completes; an over-long line is dropped (one warning) up to its newline."""
        lines = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            chunk = data[start:] if end < 0 else data[start:end]
            if self._skipping:
                if end >= 0:
                    self._skipping = False
            elif len(self._partial) + len(chunk) > self._max_line:
                logger.warning(
                    "simulated event line too long; skipped file=%s limit_bytes=%d",
                    self._path,
                    self._max_line,
                )
                self._partial, self._skipping = b"", end < 0
            elif end < 0:
                self._partial += chunk
            else:
                lines.append(self._partial + chunk)
                self._partial = b""
            if end < 0:
                return lines
            start = end + 1
