"""Where labels go: NFD's local feature file, or a NodeFeature object through the API server.

- The feature file is replaced atomically (a temp file in its directory, then rename), and only
  when the labels changed (the timestamp label alone does not count).
- A failed write (no room, a failed write or fsync, a refused rename) removes the temp file and
  raises; the last labels stay.
- The NodeFeature is created or replaced through `nvdp.kube`, retried with backoff, and owned (as
  NVIDIA's) by this pod's DaemonSet and the pod (`--pod-name` / POD_NAME), so that `helm uninstall`
  takes the node's GPU labels with it.
- Without a pod name or an owning DaemonSet it has no owner; a pod that cannot be read is one
  WARNING, the object is written without owners, and the pod is read again at the next write.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from nvdp.base.backoff import Backoff
from nvdp.base.errors import NvdpError, UnreadableFile
from nvdp.base.files import read_bounded, write_atomic
from nvdp.base.logs import log_event
from nvdp.side.gfd.labels import TIMESTAMP_LABEL, format_labels

log = logging.getLogger(__name__)

NODE_FEATURE_PREFIX = "nvidia-features-for-"


class Output(Protocol):
    def write(self, labels: Mapping[str, str]) -> bool:
        """Publish the labels; True when something was written. Raises NvdpError."""
        ...

    def remove(self) -> None:
        """Withdraw the labels on exit (the loop mode). Idempotent, never raises."""
        ...


def _without_timestamp(text: str) -> str:
    return "".join(line for line in text.splitlines(True) if not line.startswith(TIMESTAMP_LABEL + "="))


class FileOutput:
    """The NFD local feature file (`features.d/gfd`); "" writes to stdout as NVIDIA does."""

    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None

    def write(self, labels: Mapping[str, str]) -> bool:
        text = format_labels(labels)
        if self.path is None:
            sys.stdout.write(text)
            sys.stdout.flush()
            return True
        try:  # what is on disk now: someone may have removed, edited or replaced the file
            on_disk = read_bounded(self.path).decode("utf-8", errors="replace")
            current: str | None = _without_timestamp(on_disk)
        except UnreadableFile:  # gone, or no longer a file of labels: it is replaced
            current = None
        if current == _without_timestamp(text):
            return False
        write_atomically(self.path, text)
        log_event(log, logging.INFO, "labels written", file=str(self.path), labels=len(labels))
        return True

    def remove(self) -> None:
        if self.path is None:
            return
        try:
            self.path.unlink()
        except OSError:
            pass


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace `path` by a file holding `text` in one rename. Raises NvdpError (one line)."""
    try:
        write_atomic(path, text.encode("utf-8"), mode)
    except OSError as error:
        raise NvdpError(f"cannot write labels to {path}: {error.strerror or error}") from error


class NodeFeatureOutput:
    """A NodeFeature object `nvidia-features-for-<node>` in `namespace`, through `nvdp.kube`, owned by
    the DaemonSet of pod `pod_name` (in `namespace`) and that pod.

    Each write retries API errors with exponential backoff (`backoff` doubling up to `max_backoff`)
    for at most `attempts` tries; `sleep(delay)` waits and says whether to stop instead.
    """

    def __init__(
        self,
        node: str,
        namespace: str,
        *,
        api_factory: Callable[[], Any],
        pod_name: str = "",
        attempts: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        self.node = node
        self.namespace = namespace
        self.name = NODE_FEATURE_PREFIX + node
        self._api_factory = api_factory
        self._api: Any = None
        self._attempts = attempts
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._sleep = sleep or threading.Event().wait
        self._last: tuple[dict[str, str], list[dict[str, Any]]] | None = None
        self.pod_name = pod_name
        self.owners: list[dict[str, Any]] | None = None if pod_name else []  # None: not read yet
        self._owner_error: str | None = None

    def _owner_references(self) -> list[dict[str, Any]]:
        """The pod's owner references, read once; [] (and the pod read again next time) when the
        API server does not answer with the pod."""
        if self.owners is not None:
            return self.owners
        from nvdp.kube import pod_owner_references

        try:
            if self._api is None:
                self._api = self._api_factory()
            owners = pod_owner_references(self._api, self.namespace, self.pod_name)
        except NvdpError as error:
            if str(error) != self._owner_error:
                log_event(
                    log, logging.WARNING, "cannot read this pod; the NodeFeature is written without "
                    "owner references (it outlives the DaemonSet) until it can be read",
                    pod=f"{self.namespace}/{self.pod_name}", error=str(error),
                )  # fmt: skip
            self._owner_error = str(error)
            return []
        if not owners:
            log_event(
                log, logging.INFO, "no DaemonSet owns this pod; the NodeFeature has no owner references",
                pod=f"{self.namespace}/{self.pod_name}",
            )  # fmt: skip
        self.owners = owners
        return owners

    def write(self, labels: Mapping[str, str]) -> bool:
        from nvdp.kube import apply_node_feature

        owners = self._owner_references()
        compare = ({k: v for k, v in labels.items() if k != TIMESTAMP_LABEL}, owners)
        if compare == self._last:
            return False
        retries = Backoff(self._backoff, self._max_backoff)
        for attempt in range(1, self._attempts + 1):
            try:
                if self._api is None:
                    self._api = self._api_factory()
                outcome = apply_node_feature(
                    self._api, self.namespace, self.name, self.node, labels,
                    ignore=(TIMESTAMP_LABEL,), owners=owners,
                )  # fmt: skip
            except NvdpError as error:
                if attempt == self._attempts:
                    raise
                delay = retries.next()
                log_event(
                    log, logging.WARNING, "NodeFeature update failed; retrying",
                    error=str(error), attempt=attempt, retry_in=f"{delay:g}s",
                )  # fmt: skip
                if self._sleep(delay):
                    raise NvdpError(
                        f"NodeFeature {self.namespace}/{self.name}: stopped while retrying"
                    ) from error
                continue
            self._last = compare
            log_event(
                log, logging.INFO, f"NodeFeature {outcome}",
                name=self.name, namespace=self.namespace, labels=len(labels),
            )  # fmt: skip
            return outcome != "unchanged"
        raise AssertionError("unreachable")

    def remove(self) -> None:
        """NVIDIA leaves the NodeFeature in place on exit; so do we."""
