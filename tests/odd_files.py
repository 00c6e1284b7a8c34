"""Paths that are no config file, for the bounded-read tests: `/dev/zero`, a FIFO, a 2 GB sparse file
(no disk cost), a directory, and a fake shadow file whose lines carry password-hash-looking text."""

from __future__ import annotations

import os
from pathlib import Path

SHADOW_LINES = (
    "root:$6$Qx9aB3fW$kL0pZ8wVhF2sT4nR7yU1cE5gJ6mD3qA9xB0zK8lP2oW4iN7vC1tY5rS3eH6uM9jG0fD2bQ4:19000:0:99999:7:::",
    "daemon:*:19000:0:99999:7:::",
    "bin:*:19000:0:99999:7:::",
    "alice:$y$j9T$abcdefghijklmnopqrstuv$QRSTUVWXYZ0123456789abcdefghijklmnopqrs:19500:0:99999:7:::",
)
HASH_PIECES = ("$6$", "$y$", "kL0pZ8", "QRSTUVWXYZ")  # none may reach any output


def write_shadow(path: Path) -> Path:
    path.write_text("".join(line + "\n" for line in SHADOW_LINES))
    return path


def make_fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def make_sparse(path: Path, size: int = 2 << 30) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)  # a hole: no block is written
    return path


def make_dir(path: Path) -> Path:
    path.mkdir()
    return path


def odd_path(kind: str, tmp_path: Path) -> tuple[Path, str]:
    """A path of `kind` and what the bounded reader says about it."""
    if kind == "dev-zero":
        return Path("/dev/zero"), "is a character device"
    if kind == "fifo":
        return make_fifo(tmp_path / "fifo"), "is a FIFO"
    if kind == "sparse-2g":
        return make_sparse(tmp_path / "sparse"), "larger than 1 MiB"
    if kind == "directory":
        return make_dir(tmp_path / "adir"), "is a directory"
    raise ValueError(kind)


ODD_KINDS = ("dev-zero", "fifo", "sparse-2g", "directory")


def leaked(output: str) -> list[str]:
    """The pieces of the fake shadow file found in `output`."""
    lines = [line for line in SHADOW_LINES if line in output]
    return lines + [piece for piece in HASH_PIECES if piece in output]
