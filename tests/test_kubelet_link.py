"""The supervisor's registrations (nvdp.plugins.deviceplugin.kubelet_link) through their seams: a fake
registrar, fake servers and a recording observer; no sockets, no threads."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nvdp.base.dir_watch import FileId
from nvdp.base.errors import RegistrationError
from nvdp.plugins.deviceplugin.kubelet_link import (
    RETRY_MAX_S,
    RETRY_MIN_S,
    STREAM_LOST_DELAY_S,
    STREAM_STABLE_S,
    KubeletLink,
)
from tests.builders import resource
from tests.fakes import FakeServer

KUBELET = Path("/kubelet/kubelet.sock")
FIRST_KUBELET: FileId = (1, 100)
RESTARTED_KUBELET: FileId = (1, 101)


@dataclass
class FakeRegistrar:
    """Answers with `kubelet_id`, or refuses every resource in `refuse`; records every call."""

    kubelet_id: FileId = FIRST_KUBELET
    refuse: set[str] = field(default_factory=set)
    calls: list[tuple[Path, str, str, bool]] = field(default_factory=list)

    def __call__(
        self,
        kubelet_socket: Path,
        resource_name: str,
        endpoint: str,
        *,
        preferred_allocation: bool = True,
        timeout: float = 10.0,
    ) -> FileId:
        self.calls.append((kubelet_socket, resource_name, endpoint, preferred_allocation))
        if resource_name in self.refuse:
            raise RegistrationError(f"kubelet refused {resource_name}")
        return self.kubelet_id


@dataclass
class RecordingObserver:
    events: list[str] = field(default_factory=list)

    def registered(self, resource: str, first: bool) -> None:
        self.events.append(f"registered {resource} first={first}")

    def kubelet_lost(self) -> None:
        self.events.append("kubelet lost")


class LinkRig:
    def __init__(self, *names: str) -> None:
        self.registrar = FakeRegistrar()
        self.observer = RecordingObserver()
        self.ready = threading.Event()
        self.now = 1000.0
        self.wakes = 0
        self.link = KubeletLink(
            KUBELET,
            self.registrar,
            ready=self.ready,
            observer=self.observer,
            wake=self.wake,
            clock=lambda: self.now,
        )
        self.servers = {
            name: FakeServer(resource(name), Path(f"/kubelet/{name.replace('/', '-')}.sock"))
            for name in names
        }
        for name in names:
            self.link.expect(name)

    def wake(self) -> None:
        self.wakes += 1

    def kubelet_drops_stream(self, name: str) -> None:
        """The kubelet's stream of `name` (from its latest registration) ends."""
        lost = self.servers[name].kubelet_stream_lost
        assert lost is not None
        lost()

    def register(self, kubelet_id: FileId = FIRST_KUBELET, previous: float | None = None) -> float | None:
        self.registrar.kubelet_id = kubelet_id
        return self.link.register_pending(self.servers, kubelet_id, previous)


def test_registers_each_server_once_per_kubelet_and_then_is_ready() -> None:
    rig = LinkRig("nvidia.com/gpu", "nvidia.com/mig-1g.5gb")
    rig.servers["nvidia.com/gpu"].allocator = object()  # type: ignore[assignment]
    assert rig.link.registrations() == {"nvidia.com/gpu": False, "nvidia.com/mig-1g.5gb": False}

    assert rig.register() is None
    assert rig.registrar.calls == [
        (KUBELET, "nvidia.com/gpu", "nvidia.com-gpu.sock", True),
        (KUBELET, "nvidia.com/mig-1g.5gb", "nvidia.com-mig-1g.5gb.sock", False),
    ]
    assert rig.ready.is_set()
    assert rig.link.registrations() == {"nvidia.com/gpu": True, "nvidia.com/mig-1g.5gb": True}
    assert rig.observer.events == [
        "registered nvidia.com/gpu first=True",
        "registered nvidia.com/mig-1g.5gb first=True",
    ]

    assert rig.register() is None  # the same kubelet socket: nothing to do
    assert len(rig.registrar.calls) == 2


def test_a_kubelet_restart_forgets_every_registration_and_re_registers() -> None:
    rig = LinkRig("nvidia.com/gpu")
    rig.register()

    rig.link.kubelet_gone()
    assert not rig.ready.is_set()
    assert rig.link.registrations() == {"nvidia.com/gpu": False}
    rig.link.kubelet_gone()  # still gone: reported once
    assert rig.observer.events == ["registered nvidia.com/gpu first=True", "kubelet lost"]

    assert rig.register(RESTARTED_KUBELET) is None
    assert rig.ready.is_set()
    assert rig.observer.events[-1] == "registered nvidia.com/gpu first=False"


def test_a_new_kubelet_socket_identity_is_registered_with_again() -> None:
    rig = LinkRig("nvidia.com/gpu")
    rig.register()
    rig.register(RESTARTED_KUBELET)  # replaced between two wake-ups, never seen missing
    assert [call[1] for call in rig.registrar.calls] == ["nvidia.com/gpu", "nvidia.com/gpu"]
    assert rig.observer.events[-1] == "registered nvidia.com/gpu first=False"


@pytest.mark.parametrize(
    ("previous", "expected"),
    [(None, RETRY_MIN_S * 2), (0.4, 0.8), (RETRY_MAX_S, RETRY_MAX_S)],
    ids=["first-failure", "doubles", "bounded"],
)
def test_a_refused_registration_is_retried_with_backoff(previous: float | None, expected: float) -> None:
    rig = LinkRig("nvidia.com/gpu", "nvidia.com/mig-1g.5gb")
    rig.registrar.refuse = {"nvidia.com/gpu"}
    assert rig.register(previous=previous) == pytest.approx(expected)
    assert not rig.ready.is_set()
    assert rig.link.registrations() == {"nvidia.com/gpu": False, "nvidia.com/mig-1g.5gb": True}

    rig.registrar.refuse = set()
    assert rig.register(previous=expected) is None
    assert rig.ready.is_set()
    assert rig.link.registrations() == {"nvidia.com/gpu": True, "nvidia.com/mig-1g.5gb": True}


def test_ready_with_nothing_to_serve_and_forgotten_servers_are_not_reported() -> None:
    rig = LinkRig("nvidia.com/gpu")
    rig.link.forget("nvidia.com/gpu")
    del rig.servers["nvidia.com/gpu"]
    assert rig.link.registrations() == {}

    rig.link.kubelet_gone()  # nothing was registered: no loss to report, and nothing to wait for
    assert rig.ready.is_set()
    assert rig.observer.events == []
    assert rig.register() is None
    assert rig.registrar.calls == []


# ---- the kubelet's ListAndWatch stream ends while the kubelet stays -----------------------------


def test_a_dropped_stream_unregisters_at_once_and_registers_again_after_a_delay() -> None:
    rig = LinkRig("nvidia.com/gpu", "nvidia.com/mig-1g.5gb")
    assert rig.register() is None
    rig.kubelet_drops_stream("nvidia.com/gpu")  # on a gRPC thread: wakes the loop
    assert rig.wakes == 1
    assert rig.link.registrations() == {"nvidia.com/gpu": False, "nvidia.com/mig-1g.5gb": True}

    assert rig.register() == pytest.approx(STREAM_LOST_DELAY_S)  # the kubelet finishes dropping it
    assert not rig.ready.is_set() and len(rig.registrar.calls) == 2
    rig.now += STREAM_LOST_DELAY_S / 2
    assert rig.register() == pytest.approx(STREAM_LOST_DELAY_S / 2)
    rig.now += STREAM_LOST_DELAY_S / 2
    assert rig.register() is None
    assert rig.ready.is_set()
    assert [call[1] for call in rig.registrar.calls] == [
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.5gb",
        "nvidia.com/gpu",
    ]
    assert rig.observer.events[-1] == "registered nvidia.com/gpu first=False"
    assert rig.link.registrations() == {"nvidia.com/gpu": True, "nvidia.com/mig-1g.5gb": True}


def test_streams_that_keep_ending_back_off_and_a_stable_one_resets() -> None:
    rig = LinkRig("nvidia.com/gpu")
    rig.register()
    delays = []
    for _ in range(5):
        rig.now += 1.0  # each new stream ends a second after its registration
        rig.kubelet_drops_stream("nvidia.com/gpu")
        delay = rig.register()
        assert delay is not None
        delays.append(delay)
        rig.now += delay
        assert rig.register() is None
    assert delays == pytest.approx([STREAM_LOST_DELAY_S, 1.0, 2.0, 4.0, RETRY_MAX_S])
    rig.now += STREAM_STABLE_S  # a stream that lasted
    rig.kubelet_drops_stream("nvidia.com/gpu")
    assert rig.register() == pytest.approx(STREAM_LOST_DELAY_S)


def test_an_earlier_registrations_stream_or_a_restarted_kubelet_is_not_held_back() -> None:
    rig = LinkRig("nvidia.com/gpu")
    rig.register()
    earlier = rig.servers["nvidia.com/gpu"].kubelet_stream_lost
    assert earlier is not None
    rig.register(RESTARTED_KUBELET)  # registered again: the earlier stream is not the kubelet's now
    earlier()
    assert rig.link.registrations() == {"nvidia.com/gpu": True}
    assert rig.register(RESTARTED_KUBELET) is None and len(rig.registrar.calls) == 2

    rig.kubelet_drops_stream("nvidia.com/gpu")  # a kubelet restart ends the stream, then a new socket
    assert rig.register(FIRST_KUBELET) is None, "a new kubelet is registered with at once"
    assert len(rig.registrar.calls) == 3

    rig.kubelet_drops_stream("nvidia.com/gpu")
    rig.link.kubelet_gone()  # the kubelet's socket went: already forgotten, nothing more to do
    assert rig.observer.events[-1] == "kubelet lost"
    assert rig.register(RESTARTED_KUBELET) is None and len(rig.registrar.calls) == 4


def test_a_registration_that_failed_hands_the_next_attempt_a_new_stream_callback() -> None:
    rig = LinkRig("nvidia.com/gpu")
    rig.registrar.refuse = {"nvidia.com/gpu"}
    rig.register()
    failed = rig.servers["nvidia.com/gpu"].kubelet_stream_lost
    rig.registrar.refuse = set()
    assert rig.register(previous=RETRY_MIN_S) is None
    assert failed is not None and rig.servers["nvidia.com/gpu"].kubelet_stream_lost is not failed
    failed()  # a stream taken for the kubelet's while nothing was registered: ignored
    assert rig.link.registrations() == {"nvidia.com/gpu": True}
    assert rig.register() is None and len(rig.registrar.calls) == 2


def test_without_a_kubelet_socket_a_listening_server_is_done() -> None:
    """An empty --kubelet-socket (NVIDIA's "serve without registering"): nothing is registered; each
    resource counts once its server listens, and the link is ready once all of them do."""
    rig = LinkRig("nvidia.com/gpu", "nvidia.com/mig-1g.5gb")
    listening = {"nvidia.com/gpu": rig.servers["nvidia.com/gpu"]}
    rig.link.serve_unregistered(listening)
    assert not rig.ready.is_set()  # the MIG server does not listen yet
    assert rig.link.registrations() == {"nvidia.com/gpu": True, "nvidia.com/mig-1g.5gb": False}
    rig.link.serve_unregistered(rig.servers)
    assert rig.ready.is_set()
    assert rig.link.registrations() == {"nvidia.com/gpu": True, "nvidia.com/mig-1g.5gb": True}
    assert rig.registrar.calls == [] and rig.observer.events == []
    rig.link.expect("nvidia.com/gpu")  # its server restarted: done again once it listens
    assert rig.link.registrations()["nvidia.com/gpu"] is False
