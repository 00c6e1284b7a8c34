"""Whether a stopping process's release is being uninstalled, and so what it leaves on its node.

- A SIGTERM is a restart, rolling update, drain or uninstall; only an uninstall may remove what the
  process wrote for the node (the GPU health condition, config-manager's annotation, the hand-over
  record, the DRA checkpoint): otherwise the pod that follows needs it.
- `Release` asks the API server at stop whether the DaemonSet owning this pod is gone or being
  deleted (`helm uninstall` deletes it before its pods get SIGTERM).
- Any doubt (no pod name, no API server, an error, a timeout) counts as a restart: everything stays.
- `helm uninstall` deletes the RBAC with the DaemonSets, so the chart's pre-delete hook
  (`nvdp delete-daemonsets`, `delete_daemonsets`) deletes the release's DaemonSets in the
  foreground first and waits for their pods, while their RBAC still stands.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvdp import kube
from nvdp.base.errors import ConfigError, KubeError
from nvdp.base.logs import log_event
from nvdp.config import values as v
from nvdp.config.groups import KUBECONFIG, SERVICE_ACCOUNT_NAMESPACE, pod_namespace
from nvdp.config.options import Option, flag, read_options, with_values
from nvdp.plugins.handoff import UNKNOWN_HOLDER, Handoff

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 3.0  # each request at stop: the pod's grace period (30 s) covers them all
POD_NAME_ENV = "POD_NAME"
POD_NAMESPACE_ENV = "POD_NAMESPACE"


@dataclass(frozen=True)
class DeleteDaemonSetsFlags:
    """`nvdp delete-daemonsets`'s settings (the DaemonSets' names are its arguments)."""

    namespace: str = ""  # "": the pod's, from its service account
    wait: float = 180.0
    kubeconfig: str = ""


def _wait_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = v.parse_go_duration(text)
    if not 0 <= seconds < float("inf"):
        raise v.InvalidValue(f"must be >= 0, got {v.show(text)}")
    return seconds


DELETE_DAEMONSETS_OPTIONS: tuple[Option, ...] = (
    flag(
        "--namespace $POD_NAMESPACE",
        v.string,
        "the DaemonSets' namespace (when unset: the pod's, from its service account)",
    ),
    flag(
        "--wait $DELETE_WAIT",
        _wait_seconds,
        "how long to wait for the DaemonSets to go, their pods stopped (seconds or Go duration)",
        "seconds",
    ),
    KUBECONFIG,
)


def resolve_delete_daemonsets(
    args: Any, environ: Mapping[str, str], *, namespace_file: str = SERVICE_ACCOUNT_NAMESPACE
) -> DeleteDaemonSetsFlags:
    """The settings from flags and env, the namespace defaulting to the pod's. Raises ConfigError
    (every problem, one line each)."""
    given, problems = read_options(DELETE_DAEMONSETS_OPTIONS, args, environ)
    flags = with_values(DeleteDaemonSetsFlags(), given)
    if not flags.namespace:
        flags = DeleteDaemonSetsFlags(pod_namespace(namespace_file), flags.wait, flags.kubeconfig)
        if not flags.namespace:
            problems.append("--namespace: not given, and no pod namespace to default to")
    if problems:
        raise ConfigError(problems)
    return flags


class Release:
    """This pod's DaemonSet (`namespace`/`pod_name`'s owner), asked once at stop whether it goes."""

    def __init__(
        self,
        client_factory: Callable[[], Any],
        namespace: str,
        pod_name: str,
        *,
        timeout: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._factory = client_factory
        self._client: Any = None
        self.namespace, self.pod_name, self.timeout = namespace, pod_name, timeout

    @property
    def api_client(self) -> Any:
        """The API client, built at first use (not while the process runs)."""
        if self._client is None:
            self._client = self._factory()
        return self._client

    def removed(self) -> bool:
        """The DaemonSet is gone or being deleted (said in one INFO line); False on any doubt (one
        WARNING line)."""
        try:
            gone = kube.owner_daemonset_removed(
                self.api_client, self.namespace, self.pod_name, timeout=self.timeout
            )
        except KubeError as error:
            log_event(
                log,
                logging.WARNING,
                "cannot tell an uninstall from a restart; the node's records stay",
                pod=f"{self.namespace}/{self.pod_name}",
                error=str(error),
            )
            return False
        if gone:
            log_event(
                log,
                logging.INFO,
                "DaemonSet removed (uninstall): cleaning up the node's records",
                pod=f"{self.namespace}/{self.pod_name}",
            )
        return gone


def release_from_env(
    environ: Mapping[str, str], *, kubeconfig: str = "", token_file: str = kube.SERVICE_ACCOUNT_TOKEN
) -> Release | None:
    """The pod's release when POD_NAME and POD_NAMESPACE are set (the chart sets them from the
    downward API) and the API server is reachable (`kubeconfig`, else in-cluster); None otherwise:
    a process that cannot ask keeps everything at stop."""
    pod, namespace = environ.get(POD_NAME_ENV, ""), environ.get(POD_NAMESPACE_ENV, "")
    if not pod or not namespace:
        return None
    if not kubeconfig and not kube.in_cluster(environ, token_file):
        return None
    return Release(lambda: kube.new_api_client(kubeconfig=kubeconfig or None, retries=0), namespace, pod)


def clean_up_dra_node(release: Release | None, handoff: Handoff, checkpoint: Path, prepared: bool) -> None:
    """The DRA plugin stopped (its hand-over lock released, its plugin directory still claimed): after
    an uninstall its hand-over record goes unless a claim holds a GPU, and its checkpoint unless a
    claim is `prepared` (a pod being deleted with one stays Terminating until a DRA plugin unprepares
    it, which needs the checkpoint). CDI specs of prepared claims stay: running containers use them."""
    if release is None or not release.removed():
        return
    remove_handoff_record(handoff)
    if prepared:
        log_event(log, logging.INFO, "checkpoint kept: a claim is prepared", path=str(checkpoint))
        return
    try:
        checkpoint.unlink(missing_ok=True)
    except OSError as error:
        log_event(log, logging.WARNING, "checkpoint not removed", path=str(checkpoint), error=str(error))
        return
    log_event(log, logging.INFO, "checkpoint removed: no claim is prepared", path=str(checkpoint))


def remove_handoff_record(handoff: Handoff) -> bool:
    """After an uninstall (the process's hand-over lock released): its record and lock go, unless the
    record says its pods or claims hold a GPU, or cannot be read (it stays, so that the other API
    keeps off those GPUs until they are free), or another process of the API took the lock (a new
    pod). Whether they went."""
    record, record_path, lock_path = handoff.own_record()
    where = str(handoff.directory)
    if not record.known or record.holds:
        held = ",".join(sorted(record.holds)) if record.known else UNKNOWN_HOLDER
        log_event(log, logging.INFO, "GPU hand-over record kept: GPUs are held", directory=where, holds=held)
        return False
    try:
        fd: int | None = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        fd = None
    except OSError:
        return False
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while another process holds it
        for path in (record_path, lock_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)
    log_event(log, logging.INFO, "GPU hand-over record removed", directory=where, api=handoff.api)
    return True


def delete_daemonsets(
    api_client: Any,
    namespace: str,
    names: Sequence[str],
    *,
    deadline_s: float,
    poll_s: float = 1.0,
    timeout: float = REQUEST_TIMEOUT_S,
) -> list[str]:
    """Delete the DaemonSets `names` in the foreground and wait, up to `deadline_s`, until they are
    gone (their pods stopped, each having cleaned up after itself). The names still there (or that
    could not be deleted, said in one WARNING line each): never an error, the uninstall goes on."""
    deadline = time.monotonic() + deadline_s
    waiting: list[str] = []
    for name in names:
        try:
            if kube.delete_daemonset(api_client, namespace, name, timeout=timeout):
                waiting.append(name)
        except KubeError as error:
            log_event(log, logging.WARNING, "DaemonSet not deleted", error=str(error))
    if waiting:
        log_event(log, logging.INFO, "waiting for the DaemonSets' pods to stop", daemonsets=",".join(waiting))
    while waiting:
        try:
            waiting = [n for n in waiting if kube.daemonset_exists(api_client, namespace, n, timeout=timeout)]
        except KubeError as error:
            log_event(log, logging.WARNING, "cannot follow the DaemonSets' deletion", error=str(error))
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
    if waiting:
        log_event(
            log,
            logging.WARNING,
            "DaemonSets still there; their pods may not have cleaned up the node",
            daemonsets=",".join(waiting),
            waited_s=deadline_s,
        )
    else:
        log_event(log, logging.INFO, "DaemonSets deleted", namespace=namespace)
    return waiting
