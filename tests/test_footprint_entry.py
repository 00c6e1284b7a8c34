"""The plugin process stays small. `nvdp plugin` as a process keeps ssl out: the block comes before
any subcommand's parser imports grpc (the mps-control-daemon's flags pull in nvdp.api), which cost
4.5 MB of the 45 MB budget; difflib waits for a config with an unknown key."""

from __future__ import annotations

from pathlib import Path

from nvdp.sim.kubelet import Kubelet
from testkit import start_plugin, wait_until
from testkit.dra import dra_cluster, slices_of
from tests.test_footprint import run_python


def test_nvdp_plugin_process_maps_no_openssl(sock_dir: Path, kubelet: Kubelet) -> None:
    plugin = start_plugin(sock_dir, "sim:dgx-a100")
    try:
        kubelet.wait_for_registration("nvidia.com/gpu", timeout=60)
        maps = Path(f"/proc/{plugin.pid}/maps").read_text()
    finally:
        plugin.stop()
    loaded = sorted(
        {line.rsplit("/", 1)[-1] for line in maps.splitlines() if "ssl" in line.rsplit("/", 1)[-1]}
    )
    assert loaded == []


def test_the_device_plugin_loads_neither_the_dra_wire_nor_decimal(sock_dir: Path, kubelet: Kubelet) -> None:
    """The DRA and plugin-watcher protos (1 MB) are the DRA plugin's; decimal is for quantities."""
    plugin = start_plugin(sock_dir, "sim:dgx-a100", env={"PYTHONPROFILEIMPORTTIME": "1"})
    try:
        kubelet.wait_for_registration("nvidia.com/gpu", timeout=60)
    finally:
        plugin.stop()
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in plugin.log().splitlines()
        if line.startswith("import time:")
    }
    assert "nvdp.plugins.kubeletplugin.registration" in imported
    assert sorted(m for m in imported if m.startswith("nvdp.api.dra") or m == "decimal") == []


def test_plugin_modules_leave_difflib_out() -> None:
    """difflib (0.24 MiB) is only for the hint of an unknown config key."""
    out = run_python(
        """
        import sys
        import nvdp.cli, nvdp.plugins.deviceplugin.daemon
        from nvdp.config import parse_text
        parse_text("version: v1\\nflags: {migStrategy: none}\\n")
        print("difflib" in sys.modules)
        """
    )
    assert out.split() == ["False"]


def test_dra_plugin_process_imports_no_kubernetes_client(tmp_path: Path) -> None:
    """The `kubernetes` package (its __init__ imports the whole client: about 17 MiB) is left out of
    the DRA plugin serving a token kubeconfig: nvdp.kube's own transport talks to the API server."""
    with dra_cluster(tmp_path, env={"PYTHONPROFILEIMPORTTIME": "1"}) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 30, "the ResourceSlices")
        log = cluster.log().splitlines()
    imported = {line.split("|")[-1].strip() for line in log if "import time:" in line}
    assert "nvdp.kube.transport" in imported
    client = sorted(m for m in imported if m.partition(".")[0] in ("kubernetes", "pydantic", "requests"))
    assert client == []
