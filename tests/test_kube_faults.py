"""nvdp.kube and the config-manager's Node watch under connection faults, with the real
`kubernetes` client against the API stand-in: answers whose body comes after their headers on a
keep-alive connection (every body is read before its connection is reused), a watch answered by an
in-stream 410 every time (re-lists back off as client-go's reflector does), a watch that stalls
after its headers (dropped within the silence bound; /readyz of the config-manager fails meanwhile)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nvdp import kube
from nvdp.base.errors import KubeError
from nvdp.kube.reflector import DEFAULT_TIMERS, WatchTimers, relist_backoff
from nvdp.side.configmanager import object_watch
from nvdp.side.configmanager.status import Snapshot, StatusServer, failing_for
from tests import test_config_manager
from tests.kube_api_standin import KubeApiStandin
from tests.test_config_manager import LABEL, NODE, NODE_PATH

EVENTS = "/api/v1/namespaces/default/events"
LATE = 0.15  # seconds between an answer's headers and its body


# test_config_manager's fixture (the Kubernetes API stand-in serving the Node), used here by name
api = test_config_manager.api


def client(api: KubeApiStandin, tmp_path: Path) -> Any:
    """No urllib3 retries (as the config-manager's watch runs): a stale body on a reused connection
    would show as an error instead of being retried away on a fresh connection."""
    return kube.new_api_client(kubeconfig=str(api.write_kubeconfig(tmp_path / "kubeconfig")), retries=0)


# ---- every answer read before its connection is reused -----------------------------------------


def test_events_in_a_row_on_a_keep_alive_connection_all_arrive(api: KubeApiStandin, tmp_path: Path) -> None:
    """Events were lost (BadStatusLine carrying the previous answer's JSON) when the body of a
    created Event came after its headers and the connection went back to the pool unread."""
    api.late_bodies = LATE
    events = kube.KubeEvents(NODE, api_client=client(api, tmp_path))
    for n in range(6):
        events.create_event(kube.Involved.node(NODE), "Warning", "Test", f"event {n}")
    assert [e["message"] for e in api.created] == [f"event {n}" for n in range(6)]


def test_an_error_answer_with_a_body_leaves_the_connection_clean(api: KubeApiStandin, tmp_path: Path) -> None:
    api.late_bodies = LATE
    events = kube.KubeEvents(NODE, api_client=client(api, tmp_path))
    api.fail(500, 1, method="POST")
    with pytest.raises(KubeError) as raised:
        events.create_event(kube.Involved.node(NODE), "Warning", "Test", "refused")
    assert str(raised.value) == f"cannot create event on node {NODE}: HTTP 500 injected failure 500"
    events.create_event(kube.Involved.node(NODE), "Warning", "Test", "next")
    assert [e["message"] for e in api.created] == ["next"]


def test_node_feature_writes_in_a_row(api: KubeApiStandin, tmp_path: Path) -> None:
    """gfd's NodeFeature output: GET (404), POST, then GET + PUT per change, on one connection."""
    api.late_bodies = LATE
    api_client = client(api, tmp_path)
    outcomes = [
        kube.apply_node_feature(api_client, "ns", "nvdp-node-a", NODE, {"nvidia.com/gpu.count": str(n)})
        for n in (1, 2, 2, 3)
    ]
    assert outcomes == ["created", "updated", "unchanged", "updated"]
    group = f"/apis/{kube.NODE_FEATURE_GROUP}/{kube.NODE_FEATURE_VERSION}"
    path = f"{group}/namespaces/ns/nodefeatures/nvdp-node-a"
    assert api.objects[path]["spec"]["labels"] == {"nvidia.com/gpu.count": "3"}


def test_node_annotations_patched_in_a_row(api: KubeApiStandin, tmp_path: Path) -> None:
    api.late_bodies = LATE
    api_client = client(api, tmp_path)
    for entry in ("a", "b", "c"):
        kube.patch_node_annotations(api_client, NODE, {"example.com/x": entry})
        node = kube.node_metadata(api_client, NODE)
        assert node is not None and node.annotations == {"example.com/x": entry}
    kube.patch_node_annotations(api_client, NODE, {"example.com/x": None})
    assert kube.node_metadata(api_client, NODE) == kube.NodeMeta({}, {})
    with pytest.raises(KubeError) as raised:
        kube.patch_node_annotations(api_client, "node-b", {"example.com/x": "a"})
    assert str(raised.value) == "cannot annotate node node-b: HTTP 404 /api/v1/nodes/node-b not found"


# ---- the Node watch ------------------------------------------------------------------------------


class Seen:
    def __init__(self) -> None:
        self.nodes: list[kube.NodeMeta | None] = []
        self.failures: list[tuple[str, float]] = []

    def labels(self) -> dict[str, str] | None:
        last = self.nodes[-1] if self.nodes else None
        return None if last is None else last.labels


def run_watch(watch: object_watch.NodeWatch) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), name="node-watch", daemon=True)
    thread.start()
    return stop, thread


def test_a_watch_answered_by_410_every_time_backs_off_its_relists(
    api: KubeApiStandin, tmp_path: Path
) -> None:
    """It used to list again at once, ~45 times a second. Now the waits between lists follow
    client-go's reflector (0.8 s doubling, stretched by up to 2x): at most 3 lists in 3 s; run here at
    a quarter of those times (0.2 s doubling, 0.75 s). The stream left after the ERROR event (its end
    comes late) is closed, so the list after it reads a clean answer: no failure at all."""
    api.late_bodies = 0.05
    api.gone_every_watch = True
    seen = Seen()
    watch = object_watch.NodeWatch(
        client(api, tmp_path),
        NODE,
        seen.nodes.append,
        on_failure=lambda m, f: seen.failures.append((m, f)),
        timers=WatchTimers(backoff_initial_s=DEFAULT_TIMERS.backoff_initial_s / 4),
    )
    stop, thread = run_watch(watch)
    api.wait_for(lambda: watch.lists >= 1, 10, "first list")
    started = time.monotonic()
    api.patch_labels(NODE_PATH, {LABEL: "b"})
    api.wait_for(lambda: seen.labels() == {LABEL: "b"}, 10, "label seen through a re-list")
    time.sleep(max(0.0, 0.75 - (time.monotonic() - started)))
    lists = watch.lists
    stop.set()
    thread.join(5)
    assert 2 <= lists <= 4, lists  # 1 + at most 3 in the window
    # every list the server answered was counted (one in flight at the end finishes before the join)
    assert api.count("GET", "/api/v1/nodes", watch=False) == watch.lists
    assert seen.failures == []
    assert not thread.is_alive()


def test_relist_waits_grow_cap_and_start_over_after_two_quiet_minutes() -> None:
    now = [0.0]
    backoff = relist_backoff(clock=lambda: now[0], uniform=lambda: 0.5)  # stretched by 1.5
    waits = []
    for _ in range(8):
        waits.append(backoff.next())
        now[0] += waits[-1]
    assert waits == pytest.approx([1.2, 2.4, 4.8, 9.6, 19.2, 38.4, 45.0, 45.0])
    now[0] += DEFAULT_TIMERS.backoff_reset_s + 1
    assert backoff.next() == pytest.approx(1.2)
    assert relist_backoff(uniform=lambda: 0.0).next() == pytest.approx(DEFAULT_TIMERS.backoff_initial_s)
    assert (DEFAULT_TIMERS.backoff_initial_s, DEFAULT_TIMERS.backoff_max_s) == (0.8, 30.0)


def test_the_default_watch_asks_the_server_to_end_it_before_it_counts_as_silent(
    api: KubeApiStandin, tmp_path: Path
) -> None:
    assert object_watch.WATCH_TIMEOUT_S == 45 and object_watch.WATCH_SILENCE_S == 60.0
    watch = object_watch.NodeWatch(client(api, tmp_path), NODE, lambda node: None)
    stop, thread = run_watch(watch)
    api.wait_for(lambda: api.count("GET", "/api/v1/nodes", watch=True) >= 1, 10, "a watch")
    api.stop_watch(stop, thread)
    (query,) = [q for m, p, q in api.requests if p == "/api/v1/nodes" and q.get("watch") == "true"]
    assert 45 <= int(query["timeoutSeconds"]) < 90 and query["allowWatchBookmarks"] == "true"
    with pytest.raises(ValueError, match="silence_s must exceed timeout_s"):
        WatchTimers(timeout_s=60, silence_s=60)


def test_a_watch_stalled_after_its_headers_is_dropped_and_readyz_fails(
    api: KubeApiStandin, tmp_path: Path
) -> None:
    """A half-open connection left the config-manager deaf for 330 s with /readyz 200. With a
    silence bound (60 s by default; 2 s here, with watches the server ends every second) the stream
    is dropped within the bound, the watch counts as failing since it last heard anything, and
    /readyz fails until a watch delivers again."""
    silence = 2.0
    seen = Seen()
    watch = object_watch.NodeWatch(
        client(api, tmp_path),
        NODE,
        seen.nodes.append,
        on_failure=lambda m, f: seen.failures.append((m, f)),
        timers=WatchTimers(
            timeout_s=1,
            silence_s=silence,
            backoff_initial_s=0.05,
            backoff_max_s=0.2,
            alarm_after_s=silence,
            short_watch_s=0.0,  # end_watches() may end a watch just begun: no "ended at once" here
        ),
    )
    status = StatusServer(
        "127.0.0.1:0", lambda: Snapshot(True, 1, 0, 0, failing_for(watch.failing_since)), alarm_after=silence
    ).start()
    readyz = f"http://127.0.0.1:{status.port}/readyz"
    stop, thread = run_watch(watch)
    try:
        api.wait_for(lambda: seen.nodes, 10, "first list")
        api.wait_for(lambda: api.count("GET", "/api/v1/nodes", watch=True) >= 2, 10, "healthy watches end")
        assert seen.failures == []  # watches the server ends within the bound are not silence
        assert _status_code(readyz) == 200

        api.stall_watches = True
        stalled = time.monotonic()
        api.end_watches()  # the current watch ends; the next one gets its headers and then nothing
        api.wait_for(lambda: seen.failures, silence + 8, "the silent watch dropped")
        detected = time.monotonic() - stalled
        message, failing = seen.failures[0]
        assert message.startswith("watch silent for 2s") and failing >= silence - 0.1
        assert silence - 0.1 <= detected < silence + 4, detected
        assert _status_code(readyz) == 503

        api.stall_watches = False
        api.end_watches()  # the stalled streams end; the next watch is answered
        api.patch_labels(NODE_PATH, {LABEL: "a"})
        api.wait_for(lambda: seen.labels() == {LABEL: "a"}, silence + 8, "label after recovery")
        assert watch.failing_since is None and _status_code(readyz) == 200
    finally:
        api.stop_watch(stop, thread)
        status.stop()
    assert not thread.is_alive()


def _status_code(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
