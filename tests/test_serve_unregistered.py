"""An empty --kubelet-socket / KUBELET_SOCKET: NVIDIA's "serve without registering". The plugin serves
its gRPC servers on the sockets in the kubelet's default directory and registers nothing; it is ready
once every server listens (nothing to register with). The supervisor runs here with real gRPC servers
on a socket directory of the test's own (the default directory is the host's)."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nvdp.api import pb, pb_grpc
from nvdp.base.errors import RegistrationError
from nvdp.config import add_plugin_flags, resolve
from nvdp.node.nvml import open_nvml
from nvdp.plugins.deviceplugin.daemon import GrpcServers
from nvdp.plugins.deviceplugin.daemon_settings import daemon_settings
from nvdp.plugins.deviceplugin.host_facts import RealHostFacts
from nvdp.plugins.deviceplugin.probe import rpc_problem
from nvdp.plugins.deviceplugin.server import DevicePluginServer
from nvdp.plugins.deviceplugin.supervisor import DaemonSettings, Supervisor
from nvdp.plugins.metrics import Probes
from testkit import wait_until


def plugin_settings_of(argv: list[str], environ: dict[str, str]) -> DaemonSettings:
    parser = argparse.ArgumentParser()
    add_plugin_flags(parser)
    return daemon_settings(resolve(parser.parse_args(argv), environ).config)


@pytest.mark.parametrize(
    ("argv", "environ"),
    [(["--kubelet-socket", ""], {}), ([], {"KUBELET_SOCKET": ""})],
    ids=["flag", "env"],
)
def test_an_empty_kubelet_socket_is_accepted(argv: list[str], environ: dict[str, str]) -> None:
    settings = plugin_settings_of(argv, environ)
    assert settings.register_with_kubelet is False
    assert settings.kubelet_socket.parent == Path("/var/lib/kubelet/device-plugins")  # NVIDIA's sockets' dir
    default = plugin_settings_of([], {})
    assert (
        default.register_with_kubelet is True
        and default.kubelet_socket.parent == settings.kubelet_socket.parent
    )


def refuse_registration(
    kubelet_socket: Path, resource_name: str, endpoint: str, **_: object
) -> tuple[int, int]:
    raise RegistrationError(f"{resource_name}: no registration expected")


class UnregisteredPlugin:
    """A supervisor with real gRPC servers on sock_dir, on a thread, and the probes reading it."""

    def __init__(self, sock_dir: Path) -> None:
        settings = DaemonSettings(kubelet_socket=sock_dir / "kubelet.sock", register_with_kubelet=False)
        self.servers = GrpcServers(None)
        self.supervisor: Supervisor[DevicePluginServer] = Supervisor(
            open_nvml("sim:pcie-4"),
            settings,
            reload=lambda: settings,
            make_server=self.servers,
            host_facts=RealHostFacts(),
            register=refuse_registration,
        )
        self.probes = Probes(
            self.supervisor,
            rpc_probe=rpc_problem,
            registration_problems=self.supervisor.registration_problems,
        )
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.supervisor.run()
        except BaseException as error:  # the test reports it
            self.error = error

    def stop(self) -> None:
        self.supervisor.request_stop()
        self._thread.join(10)
        self.servers.shutdown()
        assert not self._thread.is_alive() and self.error is None


@pytest.fixture
def running(sock_dir: Path) -> Iterator[UnregisteredPlugin]:
    running = UnregisteredPlugin(sock_dir)
    yield running
    running.stop()


def test_serves_without_a_kubelet_and_is_ready(running: UnregisteredPlugin, sock_dir: Path) -> None:
    assert running.supervisor.ready.wait(10)
    assert not (sock_dir / "kubelet.sock").exists()  # no kubelet at all
    socket = sock_dir / "nvidia-gpu.sock"
    assert running.supervisor.registrations() == {"nvidia.com/gpu": True}
    assert running.probes.readiness_problem() is None and running.probes.liveness_problem() is None
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=5)
        first = next(iter(stream))
        stream.cancel()
    assert len(first.devices) == 4


def test_a_wiped_socket_is_served_again(running: UnregisteredPlugin, sock_dir: Path) -> None:
    """As after a kubelet restart: the server is started again on its socket (nothing to register)."""
    assert running.supervisor.ready.wait(10)
    socket = sock_dir / "nvidia-gpu.sock"
    old = running.supervisor.servers["nvidia.com/gpu"]
    socket.unlink()
    wait_until(lambda: running.supervisor.servers["nvidia.com/gpu"] is not old, 10, "the server restarted")
    wait_until(lambda: rpc_problem(socket) is None, 10, "the new server answering")
    wait_until(lambda: running.probes.readiness_problem() is None, 10, "ready again")
