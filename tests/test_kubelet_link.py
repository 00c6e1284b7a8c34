"""The supervisor's registrations (nvdp.plugin.kubelet_link) through their seams: a fake registrar,
fake servers and a recording observer; no sockets, no threads."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nvdp.errors import RegistrationError
from nvdp.plugin.kubelet_link import RETRY_MAX_S, RETRY_MIN_S, KubeletLink
from nvdp.plugin.server import PreferredAllocator
from nvdp.plugin.watch import FileId

KUBELET = Path("/kubelet/kubelet.sock")
FIRST_KUBELET: FileId = (1, 100)
RESTARTED_KUBELET: FileId = (1, 101)


@dataclass
class FakeServer:
    socket_path: Path
    allocator: PreferredAllocator | None = None


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
class Recorder:
    events: list[str] = field(default_factory=list)

    def registered(self, resource: str, first: bool) -> None:
        self.events.append(f"registered {resource} first={first}")

    def kubelet_lost(self) -> None:
        self.events.append("kubelet lost")


class Rig:
    def __init__(self, *names: str) -> None:
        self.registrar = FakeRegistrar()
        self.observer = Recorder()
        self.ready = threading.Event()
        self.link = KubeletLink(KUBELET, self.registrar, ready=self.ready, observer=self.observer)
        self.servers = {name: FakeServer(Path(f"/kubelet/{name.replace('/', '-')}.sock")) for name in names}
        for name in names:
            self.link.expect(name)

    def register(self, kubelet_id: FileId = FIRST_KUBELET, previous: float | None = None) -> float | None:
        self.registrar.kubelet_id = kubelet_id
        return self.link.register_pending(self.servers, kubelet_id, previous)


def test_registers_each_server_once_per_kubelet_and_then_is_ready() -> None:
    rig = Rig("nvidia.com/gpu", "nvidia.com/mig-1g.5gb")
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
    rig = Rig("nvidia.com/gpu")
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
    rig = Rig("nvidia.com/gpu")
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
    rig = Rig("nvidia.com/gpu", "nvidia.com/mig-1g.5gb")
    rig.registrar.refuse = {"nvidia.com/gpu"}
    assert rig.register(previous=previous) == pytest.approx(expected)
    assert not rig.ready.is_set()
    assert rig.link.registrations() == {"nvidia.com/gpu": False, "nvidia.com/mig-1g.5gb": True}

    rig.registrar.refuse = set()
    assert rig.register(previous=expected) is None
    assert rig.ready.is_set()
    assert rig.link.registrations() == {"nvidia.com/gpu": True, "nvidia.com/mig-1g.5gb": True}


def test_ready_with_nothing_to_serve_and_forgotten_servers_are_not_reported() -> None:
    rig = Rig("nvidia.com/gpu")
    rig.link.forget("nvidia.com/gpu")
    del rig.servers["nvidia.com/gpu"]
    assert rig.link.registrations() == {}

    rig.link.kubelet_gone()  # nothing was registered: no loss to report, and nothing to wait for
    assert rig.ready.is_set()
    assert rig.observer.events == []
    assert rig.register() is None
    assert rig.registrar.calls == []
