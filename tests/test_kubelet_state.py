"""The stand-in's device state through its handler seams: hand-written fake endpoints, no gRPC."""

from __future__ import annotations

from typing import Any, cast

import grpc
import pytest

from nvdp.api import HEALTHY, UNHEALTHY, pb
from nvdp.sim.kubelet import (
    DeviceManagerState,
    DeviceState,
    PluginEndpoint,
    Registration,
    Rejection,
    StreamEnd,
)
from tests.fakes import FakePluginEndpoint

GPU = "nvidia.com/gpu"


def endpoint(resource: str = GPU, name: str = "a.sock") -> PluginEndpoint:
    return cast(PluginEndpoint, FakePluginEndpoint(resource, name))


def registration(resource: str = GPU, endpoint: str = "a.sock") -> Registration:
    return Registration(resource, endpoint, pb.DevicePluginOptions(), 1.0)


def response(**health: str) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=h) for i, h in health.items()])


def end(name: str, by_kubelet: bool = False) -> StreamEnd:
    return StreamEnd(2.0, name, grpc.StatusCode.OK, "", by_kubelet)


def test_plugin_connected_watches_it_and_returns_the_plugin_it_replaces() -> None:
    state = DeviceManagerState()
    first, second = endpoint(name="a.sock"), endpoint(name="b.sock")
    assert state.plugin_connected(first, registration()) is None
    assert cast(Any, first).watching and state.resources() == [GPU]
    assert state.plugin_connected(second, registration(endpoint="b.sock")) is first
    assert state.endpoint(GPU) is second
    assert [r.endpoint for r in state.registrations] == ["a.sock", "b.sock"]


def test_updates_of_a_replaced_plugin_are_ignored() -> None:
    state = DeviceManagerState()
    old, new = endpoint(name="a.sock"), endpoint(name="b.sock")
    state.plugin_connected(old, registration())
    state.list_and_watch_received(old, response(g0=HEALTHY), 5.0)
    state.plugin_connected(new, registration())
    state.list_and_watch_received(old, response(g0=UNHEALTHY), 6.0)
    assert state.devices(GPU) == {"g0": DeviceState(HEALTHY, ())}
    state.list_and_watch_received(new, response(g1=HEALTHY), 7.0)
    assert state.devices(GPU) == {"g1": DeviceState(HEALTHY, ())}
    assert [u.time for u in state.updates(GPU)] == [5.0, 7.0]


@pytest.mark.parametrize(
    ("ended", "still_connected"), [("current", False), ("replaced", True)], ids=["current", "replaced"]
)
def test_plugin_disconnected_drops_only_the_current_plugin(ended: str, still_connected: bool) -> None:
    state = DeviceManagerState()
    old, new = endpoint(name="a.sock"), endpoint(name="b.sock")
    state.plugin_connected(old, registration())
    state.plugin_connected(new, registration())
    state.plugin_disconnected(new if ended == "current" else old, end("x.sock"))
    assert (not state.stream_closed(GPU)) == still_connected
    assert [e.endpoint for e in state.stream_ends(GPU)] == ["x.sock"]


def test_a_restart_forgets_plugins_and_devices_but_keeps_observations() -> None:
    state = DeviceManagerState()
    plugin = endpoint()
    state.plugin_connected(plugin, registration())
    state.list_and_watch_received(plugin, response(g0=HEALTHY), 5.0)
    state.registration_refused(Rejection("bad", "c.sock", "v1beta1", "no", 3.0))
    assert state.disconnect_all() == [plugin]
    state.forget_devices()
    assert state.resources() == [] and state.devices(GPU) == {}
    assert len(state.registrations) == 1 and len(state.updates(GPU)) == 1 and len(state.rejections) == 1


def test_socket_state_wakes_waiters_and_stamps_serving_since() -> None:
    state = DeviceManagerState()
    assert state.socket_state == "stopped" and state.serving_since is None
    state.socket_state_changed("serving")
    assert state.wait_for(lambda: state.socket_state == "serving", 1, "serving")
    assert state.serving_since is not None
    with pytest.raises(
        TimeoutError, match=r"^kubelet stand-in: no registration #1 of nvidia.com/gpu within 0.01s$"
    ):
        state.wait_for_registration(GPU, timeout=0.01)
