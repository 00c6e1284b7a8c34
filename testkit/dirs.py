"""Short temporary directories for unix sockets: a socket's path must fit sun_path (107 bytes), and
pytest's own temporary directories (`/tmp/pytest-of-USER/pytest-N/popen-gwK/a_test_name_of_30_chars0/`
under pytest-xdist) leave too little of that for a node's nested directories."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def short_temp_dir(prefix: str = "nvdp-") -> Iterator[Path]:
    """A fresh directory `/tmp/<prefix>XXXXXXXX`, removed with its contents after the block."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
