"""Every watch (the config-manager's ConfigMap and Node, the DRA plugin's ResourceSlices) runs on one
list+watch loop (`nvdp.kube.reflector`) with client-go's policy, against the API stand-in with the
real client: a 410 storm and watches that end at once are backed off (they used to cost ~22
requests a second), malformed events and events about another object are skipped with one WARNING
per kind of problem and the watch goes on, and a watch failing for its alarm time shows in
`problem()` (the owner's /readyz) with why, until it works again."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nvdp import kube
from nvdp.base.backoff import Backoff
from nvdp.base.errors import KubeError, KubeGone
from nvdp.kube.configmaps import ConfigMapData, configmaps_path
from nvdp.kube.reflector import Reflector, WatchTimers
from nvdp.plugins.dra.cluster import KubeResourceApi
from nvdp.plugins.dra.devices import node_devices
from nvdp.plugins.dra.publisher import SlicePublisher
from nvdp.side.configmanager.object_watch import ConfigMapWatch, NodeWatch
from nvdp.side.configmanager.status import Snapshot, StatusServer, failing_for
from testkit import wait_until
from tests.builders import sim_gpus
from tests.dra_support import stop_publisher
from tests.kube_api_standin import KubeApiStandin
from tests.readings import http_get
from tests.test_dra_slices import FACTS
from tests.test_kube_dra import GROUP, discovery

NS, NAME = "gpu-system", "plugin-configs"
CONFIGMAPS = configmaps_path(NS)
SLICES = f"{GROUP}/v1/resourceslices"
FAST = WatchTimers(timeout_s=5, silence_s=10)  # production's backoff, short server timeouts
# The backoff tests run client-go's policy a quarter as long: waits of 0.2 s, 0.4 s, 0.8 s ... (production
# 0.8 s, 1.6 s, 3.2 s ...), each stretched by up to 2x, counted in a window of 0.75 s (a quarter of 3 s).
QUARTER = 0.25
BACKED_OFF = WatchTimers(timeout_s=5, silence_s=10, backoff_initial_s=0.8 * QUARTER)
WINDOW_S = 3.0 * QUARTER


def configmap_of(name: str, value: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS},
        "data": {"a": value},
    }


@dataclass
class SeenData:
    data: list[dict[str, bytes] | None] = field(default_factory=list)

    def add(self, data: ConfigMapData | None, listed: bool) -> None:
        self.data.append(None if data is None else dict(data.entries))

    def last(self) -> dict[str, bytes] | None:
        return self.data[-1] if self.data else None


@pytest.fixture
def api() -> Iterator[KubeApiStandin]:
    with KubeApiStandin() as standin:
        standin.put(GROUP, discovery("v1"))
        standin.put(f"{CONFIGMAPS}/{NAME}", configmap_of(NAME, "1"))
        yield standin


def api_client(api: KubeApiStandin) -> object:
    return kube.new_api_client(host=api.url, retries=0)


@dataclass
class RunningWatch:
    """One watch running on its thread; `watches()` counts its watch requests, `lists()` its lists."""

    reflector: Reflector
    path: str
    api: KubeApiStandin
    stop: Callable[[], None]
    publisher: SlicePublisher | None = None

    def watches(self) -> int:
        return self.api.count("GET", self.path, watch=True)

    def lists(self) -> int:
        return self.api.count("GET", self.path, watch=False)


@pytest.fixture
def running(
    api: KubeApiStandin, request: pytest.FixtureRequest
) -> Iterator[Callable[[str, WatchTimers], RunningWatch]]:
    stops: list[Callable[[], None]] = []

    def start(which: str, timers: WatchTimers) -> RunningWatch:
        if which == "configmap":
            watch = ConfigMapWatch(api_client(api), NS, NAME, SeenData().add, timers=timers)
            stop = threading.Event()
            thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
            thread.start()

            def stopped() -> None:
                api.stop_watch(stop, thread)

            stops.append(stopped)
            return RunningWatch(watch.reflector, CONFIGMAPS, api, stopped)
        publisher = SlicePublisher(
            KubeResourceApi(api_client(api)), "node-a", watch_timers=timers, backoff=Backoff(0.05, 0.2)
        )
        publisher.update(node_devices(sim_gpus("pcie-4"), FACTS), {})
        publisher.start()
        assert publisher.published.wait(5)

        def stopped_publisher() -> None:
            stop_publisher(publisher, api)

        stops.append(stopped_publisher)
        return RunningWatch(publisher.reflector, SLICES, api, stopped_publisher, publisher)

    yield start
    for stop in stops:
        stop()


def requests_in(run: RunningWatch, seconds: float, first: Callable[[], int]) -> tuple[int, int]:
    """(watches, lists) made in the `seconds` after the watch's first request of that kind."""
    wait_until(lambda: first() >= 1, 10, "the first request")
    start_watches, start_lists = run.watches(), run.lists()
    time.sleep(seconds)  # a window of time is what is measured here
    return run.watches() - start_watches, run.lists() - start_lists


@pytest.mark.parametrize("which", ["configmap", "resourceslices"])
def test_a_410_storm_is_backed_off_with_client_gos_waits(
    api: KubeApiStandin, running: Callable[[str, WatchTimers], RunningWatch], which: str
) -> None:
    """Every watch answered by 410 Gone: a list then a watch, then waits of 0.8 s, 1.6 s, 3.2 s...
    each stretched by up to 2x. In the 3 s after the first watch: the re-lists at >= 0.8 s and
    >= 2.4 s at most, each with its watch (the DRA watcher used to re-list with no wait: ~22
    requests a second). Run at a quarter of those times (QUARTER)."""
    api.gone_every_watch = True
    run = running(which, BACKED_OFF)
    watches, lists = requests_in(run, WINDOW_S, run.watches)
    assert watches <= 2 and lists <= 2, (watches, lists)
    assert run.reflector.failing_since is None  # each list succeeds: not dead, only backed off


@pytest.mark.parametrize("which", ["configmap", "resourceslices"])
def test_watches_that_end_at_once_are_backed_off_and_show_as_failing(
    api: KubeApiStandin, running: Callable[[str, WatchTimers], RunningWatch], which: str
) -> None:
    """Every watch answered and ended at once: re-watched from the last resourceVersion (no list)
    after 0.8 s, 1.6 s, 3.2 s... stretched by up to 2x, so at most 2 more in 3 s (they used to be
    re-made at once, hundreds a second). Ending at once is a failure: past the alarm time
    `problem()` says so, and a watch that runs again clears it. Run at a quarter of those times."""
    api.end_every_watch = True
    timers = WatchTimers(
        timeout_s=2,
        silence_s=5,
        short_watch_s=0.5,
        alarm_after_s=0.5,
        backoff_initial_s=0.2,
        backoff_max_s=0.8,
    )  # waits of at most 0.8 s: back to work soon after the watches stop ending
    run = running(which, timers)
    watches, lists = requests_in(run, WINDOW_S, run.watches)
    assert watches <= 2 and lists == 0, (watches, lists)
    wait_until(run.reflector.problem, 10, "the watch counted as dead")
    assert f"{run.reflector.kind} watch failing for " in str(run.reflector.problem())
    assert str(run.reflector.problem()).endswith(": watch ended at once (no event within 0.5s)")
    api.end_every_watch = False
    wait_until(lambda: run.reflector.problem() is None, 15, "the watch working again")


MALFORMED: list[tuple[str, object, str]] = [
    ("not-an-object", [1, 2], "not an object"),
    ("a-string", "text", "not an object"),
    ("no-json", b"{not json", "no JSON"),
    ("unknown-type", {"type": "SOMETHING", "object": {}}, "unknown event type"),
    ("no-object", {"type": "MODIFIED", "object": "x"}, "no object"),
    ("no-metadata", {"type": "MODIFIED", "object": {"kind": "ConfigMap"}}, "no metadata.resourceVersion"),
    (
        "no-version",
        {"type": "MODIFIED", "object": {"metadata": {"name": NAME}}},
        "no metadata.resourceVersion",
    ),
    (
        "wrong-kind",
        {
            "type": "MODIFIED",
            "object": {"kind": "Secret", "metadata": {"name": NAME, "resourceVersion": "1"}},
        },
        "event of kind Secret",
    ),
    (
        "undecodable",
        {
            "type": "MODIFIED",
            "object": {
                "kind": "ConfigMap",
                "metadata": {"name": NAME, "resourceVersion": "1"},
                "binaryData": {"k": "%"},
            },
        },
        "undecodable object",
    ),
]


@pytest.mark.parametrize(
    ("event", "problem"), [(e, p) for _, e, p in MALFORMED], ids=[i for i, _, _ in MALFORMED]
)
def test_a_malformed_event_is_skipped_with_one_warning_and_the_watch_goes_on(
    api: KubeApiStandin, caplog: pytest.LogCaptureFixture, event: object, problem: str
) -> None:
    """One malformed event used to end the config-manager's watch for good (its thread died) with
    /readyz 200. Now it is skipped, said once (the same problem again within `warn_every_s` only
    counted), and the next good event on the same stream is applied."""
    caplog.set_level(logging.WARNING)
    seen = SeenData()
    watch = ConfigMapWatch(api_client(api), NS, NAME, seen.add, timers=FAST)
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: api.count("GET", CONFIGMAPS, watch=True) == 1, 10, "the watch")
        api.inject(CONFIGMAPS, event)
        api.inject(CONFIGMAPS, event)
        api.put(f"{CONFIGMAPS}/{NAME}", configmap_of(NAME, "2"))
        wait_until(lambda: seen.last() == {"a": b"2"}, 10, "the next good event applied")
        assert api.count("GET", CONFIGMAPS, watch=True) == 1  # the same stream went on
        assert thread.is_alive() and watch.failing_since is None
    finally:
        api.stop_watch(stop, thread)
    skipped = [r.getMessage() for r in caplog.records if "watch event skipped" in r.getMessage()]
    assert len(skipped) == 1, skipped
    assert skipped[0].startswith(f"configmap watch event skipped configmap={NS}/{NAME} problem={problem!r}")
    assert watch.reflector.skipped == 2


def test_an_event_for_another_configmap_is_ignored(
    api: KubeApiStandin, caplog: pytest.LogCaptureFixture
) -> None:
    """A proxy that drops the field selector streams every ConfigMap of the namespace: another's
    content used to be applied as the watched one's. Now it is skipped (said once), the list's other
    items too, and the watched one's changes still apply."""
    caplog.set_level(logging.WARNING)
    api.ignore_name_selector = True
    api.put(f"{CONFIGMAPS}/aaa-first", configmap_of("aaa-first", "listed first"))
    seen = SeenData()
    watch = ConfigMapWatch(api_client(api), NS, NAME, seen.add, timers=FAST)
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: api.count("GET", CONFIGMAPS, watch=True) == 1, 10, "the watch")
        assert seen.data == [{"a": b"1"}]  # the list's other item skipped
        api.put(f"{CONFIGMAPS}/other", configmap_of("other", "not ours"))
        api.put(f"{CONFIGMAPS}/{NAME}", configmap_of(NAME, "2"))
        wait_until(lambda: seen.last() == {"a": b"2"}, 10, "the watched one's change")
    finally:
        api.stop_watch(stop, thread)
    assert seen.data == [{"a": b"1"}, {"a": b"2"}]
    skipped = [r.getMessage() for r in caplog.records if "watch event skipped" in r.getMessage()]
    assert len(skipped) == 1 and "problem='another object'" in skipped[0], skipped


def test_readyz_is_503_with_why_while_the_configmap_watch_is_dead_and_200_after(
    api: KubeApiStandin, tmp_path: Path
) -> None:
    """The config-manager's /readyz: watches ending at once for the alarm time (a dead watch that
    used to look healthy) are a 503 naming the watch; a watch that runs again is 200."""
    timers = WatchTimers(
        timeout_s=2,
        silence_s=5,
        short_watch_s=0.5,
        alarm_after_s=0.5,
        backoff_initial_s=0.1,
        backoff_max_s=0.2,
    )
    watch = ConfigMapWatch(api_client(api), NS, NAME, SeenData().add, timers=timers)
    status = StatusServer(
        "127.0.0.1:0",
        lambda: Snapshot(
            True,
            1,
            0,
            0,
            0.0,
            configmap_watch_failing_for=failing_for(watch.failing_since),
            configmap_watch_error=watch.last_error,
        ),
        alarm_after=timers.alarm_after_s,
    ).start()
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    try:
        api.end_every_watch = True
        thread.start()
        wait_until(lambda: http_get(status.port, "/readyz")[0] == 503, 10, "503")
        reason = http_get(status.port, "/readyz")[1].strip()
        assert reason.startswith("configmap watch failing for ")
        assert reason.endswith("s: watch ended at once (no event within 0.5s)")
        api.end_every_watch = False
        wait_until(lambda: http_get(status.port, "/readyz")[0] == 200, 10, "200 again")
    finally:
        api.stop_watch(stop, thread)
        status.stop()


class Registered:
    def problem(self) -> str | None:
        return None


@dataclass
class DraParts:
    """What the DRA plugin's /readyz reads (`nvdp.plugins.dra.status.DraSources`): registered, its sockets
    served, NVML still starting, and a real publisher."""

    publisher: SlicePublisher
    registration: Registered = field(default_factory=Registered)
    preparer: None = None
    nvml_failure: None = None
    sockets: tuple[()] = ()


def test_the_dra_readyz_names_a_dead_slice_watch_and_clears(
    api: KubeApiStandin, running: Callable[[str, WatchTimers], RunningWatch]
) -> None:
    """The DRA plugin's /readyz: the slice watch failing (500s) for its alarm time is a 503 naming the
    watch and the error; a list that succeeds clears it."""
    from nvdp.plugins.dra.status import DraCounters, DraStatus

    timers = WatchTimers(
        timeout_s=5, silence_s=10, alarm_after_s=1.0, backoff_initial_s=0.1, backoff_max_s=0.2
    )
    run = running("resourceslices", timers)
    wait_until(lambda: run.watches() >= 1, 10, "the watch")
    publisher = run.publisher
    assert publisher is not None
    status = DraStatus("127.0.0.1:0", DraCounters(), DraParts(publisher)).start()  # type: ignore[arg-type]
    try:
        assert http_get(status.port, "/readyz")[1].splitlines() == ["starting"]
        api.fail(500, 10_000, path_prefix=SLICES, method="GET")
        api.end_watches()
        wait_until(lambda: len(http_get(status.port, "/readyz")[1].splitlines()) == 2, 10, "the watch dead")
        code, body = http_get(status.port, "/readyz")
        assert code == 503 and body.splitlines()[1].startswith("resourceslice watch failing for ")
        assert body.splitlines()[1].endswith("s: HTTP 500 injected failure 500")
        api.clear_failures()
        wait_until(lambda: http_get(status.port, "/readyz")[1].splitlines() == ["starting"], 10, "cleared")
    finally:
        status.stop()


def test_a_node_watch_skips_another_node(api: KubeApiStandin) -> None:
    api.ignore_name_selector = True
    api.put("/api/v1/nodes/node-a", {"kind": "Node", "metadata": {"name": "node-a", "labels": {"x": "a"}}})
    labels: list[dict[str, str] | None] = []
    watch = NodeWatch(
        api_client(api), "node-a", lambda node: labels.append(None if node is None else node.labels)
    )
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: api.count("GET", "/api/v1/nodes", watch=True) == 1, 10, "the watch")
        api.put(
            "/api/v1/nodes/node-b", {"kind": "Node", "metadata": {"name": "node-b", "labels": {"x": "b"}}}
        )
        api.patch_labels("/api/v1/nodes/node-a", {"x": "a2"})
        wait_until(lambda: labels and labels[-1] == {"x": "a2"}, 10, "node-a's change")
    finally:
        api.stop_watch(stop, thread)
    assert labels == [{"x": "a"}, {"x": "a2"}]


class EndsOnceStopped:
    """A collection whose watch sets `stop` and then ends as a stand-in going away ends it: at once,
    with no event (`error` None), or with the request failing (`error`)."""

    def __init__(self, stop: threading.Event, error: Exception | None) -> None:
        self.stop, self.error = stop, error

    def list(self) -> tuple[list[object], str]:
        return [], "1"

    def watch(self, since: str, *, timeout_seconds: int, silence: float) -> Iterator[object]:
        self.stop.set()
        if self.error is not None:
            raise self.error
        yield from ()


@pytest.mark.parametrize(
    "error",
    [None, KubeError("connection refused"), KubeGone(410, "too old", "Gone")],
    ids=["ended-at-once", "refused", "gone"],
)
def test_a_watch_the_stop_ends_is_no_failure(
    caplog: pytest.LogCaptureFixture, error: Exception | None
) -> None:
    """The owner stopped it and closed its streams: the watch returns, and says nothing of it."""
    stop = threading.Event()
    reflector = Reflector(
        EndsOnceStopped(stop, error),  # type: ignore[arg-type]
        kind="resourceslice",
        subject="node-a/gpu.nvidia.com",
        consequence="",
        ours=lambda obj: True,
        on_list=lambda items: None,
        on_event=lambda kind, obj: None,
    )
    caplog.set_level(logging.INFO)
    reflector.run(stop)
    assert reflector.failing_since is None
    assert [r.getMessage() for r in caplog.records if "watch" in r.getMessage()] == []
