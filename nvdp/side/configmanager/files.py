"""The candidate config file, checked with the plugin's own loader, and the atomic symlink swap.

- The destination links to `<srcdir>/<entry>` (through `..data`, so ConfigMap edits show through)
  or to /dev/null for the empty config.
- With the ConfigMap read from the API, it links to a copy written beside it,
  `.<dst name>.entries/<entry>@<digest>` (relative); a copy is never changed once written.
- A swap is rename(2) of a fresh link: the plugin never sees a missing or half-written file.
- Entries and the destination are read as the plugin reads its config (`nvdp.base.files.read_bounded`):
  a regular file of at most 1 MiB, or /dev/null.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from nvdp.base.dirs import make_dirs
from nvdp.base.errors import CandidateError as CandidateError  # defined in nvdp.base.errors
from nvdp.base.errors import ConfigError, UnreadableFile
from nvdp.base.files import read_bounded, write_atomic
from nvdp.config import parse_text
from nvdp.config.rules import file_problems

DEV_NULL = "/dev/null"


@dataclass(frozen=True)
class Effective:
    """What the destination points at, and a digest of the content the plugin would read."""

    target: str
    digest: str


def read_candidate(srcdir: str, entry: str) -> tuple[Effective, bytes]:
    """The link target and content of an entry ("" = the empty config). Raises CandidateError."""
    if not entry:
        return Effective(DEV_NULL, digest(b"")), b""
    target = os.path.join(srcdir, entry)
    try:
        content = read_bounded(target)
    except UnreadableFile as error:
        raise CandidateError(f"cannot read entry {entry!r}: {error.reason}") from error
    return Effective(target, digest(content)), content


def validate(entry: str, content: bytes, *, strict: bool = False) -> None:
    """The plugin's loader accepts it (lenient about unknown keys, as the plugin is by default;
    `strict` as the plugin is with --strict-config), and so do the plugin's support rules on what
    the file states (`nvdp.config.rules.file_problems`)."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CandidateError(f"entry {entry!r} is not UTF-8 text (byte {error.start})") from error
    try:
        problems = file_problems(parse_text(text, source=entry or None, strict=strict))
        if problems:  # a value the plugin refuses even though the loader parses it (e.g. tegra)
            raise ConfigError(problems, source=entry or None)
    except ConfigError as error:
        raise CandidateError(str(error)) from error


def current(dst: str) -> Effective | None:
    """What `dst` points at now (None when it does not exist or cannot be read: a link to
    something that is no config file, say, which the next apply replaces)."""
    try:
        target = os.readlink(dst) if os.path.islink(dst) else os.path.abspath(dst)
        return Effective(target, digest(read_bounded(dst)))
    except (OSError, UnreadableFile):
        return None


def link(dst: str, target: str) -> None:
    """Point `dst` at `target` atomically (a new link renamed over the old one)."""
    folder = os.path.dirname(os.path.abspath(dst))
    make_dirs(Path(folder))
    temporary = os.path.join(folder, f".{os.path.basename(dst)}.{os.getpid()}.tmp")
    try:
        os.unlink(temporary)
    except FileNotFoundError:
        pass
    os.symlink(target, temporary)
    os.replace(temporary, dst)


def copy_target(dst: str, entry: str, content: bytes) -> str:
    """Where the copy of an entry with `content` goes, relative to the destination's directory."""
    return f".{os.path.basename(dst)}.entries/{entry}@{digest(content)[:16]}"


def write_copy(dst: str, target: str, content: bytes) -> None:
    """Write the copy `target` (from `copy_target`) atomically. Raises OSError."""
    path = Path(os.path.dirname(os.path.abspath(dst))) / target
    make_dirs(path.parent)
    write_atomic(path, content)


def prune_copies(dst: str, keep: set[str]) -> None:
    """Remove the copies next to `dst` but those in `keep` (targets from `copy_target`: the one in
    place, and the one before it, which a reader may have resolved just before the swap).
    Best effort: a copy left behind is only a few bytes."""
    folder = os.path.join(os.path.dirname(os.path.abspath(dst)), f".{os.path.basename(dst)}.entries")
    kept = {os.path.basename(target) for target in keep}
    try:
        with os.scandir(folder) as found:
            stale = [e.path for e in found if e.name not in kept and e.is_file(follow_symlinks=False)]
    except OSError:
        return
    for path in stale:
        try:
            os.unlink(path)
        except OSError:
            pass


def digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()
