"""`nvdp plugin --nvml real` end to end on the C NVML stand-in (tests/nvml_standin): pynvml's ctypes
layer, versioned symbols and struct layouts are exercised for discovery, health by event and by probe,
a GPU lost at start, and the library lookup order; and `nvdp gfd --nvml real` for the NVLink fabric
structs. The library is built with the system C compiler."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.sim.kubelet import Kubelet
from testkit import REPO, Process, start_plugin, wait_until

SOURCE = Path(__file__).parent / "nvml_standin" / "libnvidia-ml.c"
LIBRARY = "libnvidia-ml.so.1"
GPU = "nvidia.com/gpu"
UUIDS = [f"GPU-{n}{n}{n}{n}{n}{n}{n}{n}-0000-4000-8000-00000000000{n}" for n in range(4)]
MIGS = [f"MIG-1111111{n}-0000-4000-8000-00000000000{n}" for n in range(2)]


def gpu_line(n: int, **fields: object) -> str:
    values = {"uuid": UUIDS[n], "minor": n, "memory_mib": 40960, "cc": "8.0", "numa": n // 2}
    values["bus"] = f"00000000:{0x07 + 8 * n:02X}:00.0"
    values.update(fields)
    return "gpu " + " ".join(f"{k}={v}" for k, v in values.items()) + " name=NVIDIA A100-SXM4-40GB\n"


@pytest.fixture(scope="session")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in built once per session; its directory holds libnvidia-ml.so.1."""
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler (cc) on PATH to build the NVML stand-in library")
    out = tmp_path_factory.mktemp("nvml-standin")
    build = [compiler, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(out / LIBRARY), str(SOURCE), "-lpthread"]
    subprocess.run(build, check=True, capture_output=True, timeout=120)
    return out


class StandinNode:
    """A stand-in node: its node file, its commands file and the plugin serving it."""

    def __init__(self, tmp_path: Path, lines: str) -> None:
        self.node = tmp_path / "node.txt"
        self.node.write_text("driver 550.54.15\ncuda 12040\n" + lines)
        self.commands = tmp_path / "commands.txt"
        self.commands.touch()

    def env(self, library_dir: Path | None) -> dict[str, str]:
        env = {"NVML_STANDIN_NODE": str(self.node), "NVML_STANDIN_COMMANDS": str(self.commands)}
        env["LD_LIBRARY_PATH"] = str(library_dir) if library_dir else ""
        return env

    def command(self, line: str) -> None:
        with self.commands.open("a") as f:
            f.write(line + "\n")


def start_standin_plugin(
    sock_dir: Path,
    tmp_path: Path,
    node: StandinNode,
    processes: list[Process],
    library_dir: Path | None,
    config: str = "version: v1\n",
    args: tuple[str, ...] = (),
) -> Process:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config)
    plugin = start_plugin(sock_dir, "real", config_file=config_file, env=node.env(library_dir), extra=args)
    processes.append(plugin)
    return plugin


def wait_unhealthy(kubelet: Kubelet, expected: set[str], resource: str = GPU) -> None:
    kubelet.wait_for_devices(
        resource, lambda d: {i for i, s in d.items() if s.health != "Healthy"} == expected, timeout=10
    )


def test_discovery_whole_gpus_and_mig_devices(
    standin: Path, sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    node = StandinNode(
        tmp_path,
        gpu_line(0, mig=-1)
        + gpu_line(1, mig=1)
        + f"mig gpu=1 uuid={MIGS[0]} gi=1 ci=0 gi_slices=3 ci_slices=3 memory_mb=19968 profile=2\n"
        + f"mig gpu=1 uuid={MIGS[1]} gi=2 ci=0 gi_slices=1 ci_slices=1 memory_mb=4864 profile=0\n",
    )
    plugin = start_standin_plugin(
        sock_dir, tmp_path, node, processes, standin, args=("--mig-strategy", "mixed")
    )
    for resource, ids in (
        (GPU, {UUIDS[0]}),
        ("nvidia.com/mig-3g.20gb", {MIGS[0]}),
        ("nvidia.com/mig-1g.5gb", {MIGS[1]}),
    ):
        kubelet.wait_for_registration(resource, timeout=20)
        assert set(kubelet.wait_for_devices(resource, timeout=10)) == ids
    assert "NVML initialized driver=550.54.15 library=libnvidia-ml.so.1" in plugin.log()


def test_xid_through_event_set_wait_v2_reaches_list_and_watch(
    standin: Path, sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    node = StandinNode(tmp_path, gpu_line(0) + gpu_line(1) + gpu_line(2))
    plugin = start_standin_plugin(sock_dir, tmp_path, node, processes, standin)
    kubelet.wait_for_registration(GPU, timeout=20)
    kubelet.wait_for_devices(GPU, lambda d: len(d) == 3, timeout=10)
    wait_until(lambda: "health monitor starting" in plugin.log(), timeout=10, what="health monitor")
    node.command("xid 1 79")
    wait_unhealthy(kubelet, {UUIDS[1]})
    wait_until(lambda: "device unhealthy" in plugin.log(), timeout=5, what="transition line")
    line = next(li for li in plugin.log().splitlines() if "device unhealthy" in li)
    assert line.endswith(
        f"device unhealthy resource=nvidia.com/gpu device={UUIDS[1]} index=1 xid=79 "
        'reason="GPU has fallen off the bus" fatal=true'
    )


# A waiter in nvmlEventSetWait_v2 on the stand-in: it reports its own thread's voluntary context
# switches over one wait (the stand-in's old 5 ms poll made 200 a second), then waits for the event a
# command appended while it waits queues.
WAITER = """
import ctypes, sys, threading
lib = ctypes.CDLL(sys.argv[1])
assert lib.nvmlInit_v2() == 0
device, events, data = ctypes.c_void_p(), ctypes.c_void_p(), (ctypes.c_ulonglong * 8)()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(device)) == 0
assert lib.nvmlEventSetCreate(ctypes.byref(events)) == 0
assert lib.nvmlDeviceRegisterEvents(device, ctypes.c_ulonglong(8), events) == 0
def switches():
    status = open(f"/proc/self/task/{threading.get_native_id()}/status").read()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])
before = switches()
code = lib.nvmlEventSetWait_v2(events, data, 1000)
print(code, switches() - before)
with open(sys.argv[2], "a") as commands:
    threading.Timer(0.05, lambda: commands.write("xid 0 79\\n") and commands.flush()).start()
    print(lib.nvmlEventSetWait_v2(events, data, 2000), data[2])
"""


@pytest.mark.parametrize("commands", [False, True], ids=["no-commands-file", "commands-file"])
def test_event_set_wait_sleeps_until_an_event_instead_of_polling(
    standin: Path, tmp_path: Path, commands: bool
) -> None:
    node = StandinNode(tmp_path, gpu_line(0))
    env = {**node.env(None), "PATH": "/usr/bin:/bin"}
    if not commands:
        del env["NVML_STANDIN_COMMANDS"]
    args = [sys.executable, "-c", WAITER, str(standin / LIBRARY), str(node.commands)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=30, check=True)
    timed_out, idle = done.stdout.splitlines()
    code, switches = map(int, timed_out.split())
    assert code == 10  # NVML_ERROR_TIMEOUT after the 1 s wait
    assert switches <= (15 if commands else 3), "a 1 s wait: one command-file check per 100 ms, or none"
    assert idle == ("0 79" if commands else "10 0")  # the appended xid, read only with a commands file


def test_gpu_lost_at_run_time_is_found_by_the_probe(
    standin: Path, sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    node = StandinNode(tmp_path, gpu_line(0) + gpu_line(1))
    config = "version: v1\nhealth:\n  probeInterval: 200ms\n"
    plugin = start_standin_plugin(sock_dir, tmp_path, node, processes, standin, config=config)
    kubelet.wait_for_registration(GPU, timeout=20)
    kubelet.wait_for_devices(GPU, lambda d: len(d) == 2, timeout=10)
    node.command("lost 0")
    wait_unhealthy(kubelet, {UUIDS[0]})
    assert "NVML_ERROR_GPU_IS_LOST" in plugin.log()


def test_gpu_lost_at_start_is_advertised_unhealthy_and_the_others_served(
    standin: Path, sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    node = StandinNode(tmp_path, gpu_line(0) + gpu_line(1, lost=1) + gpu_line(2) + gpu_line(3))
    plugin = start_standin_plugin(sock_dir, tmp_path, node, processes, standin)  # fail-on-init-error: true
    kubelet.wait_for_registration(GPU, timeout=20)
    kubelet.wait_for_devices(GPU, lambda d: len(d) == 4, timeout=10)
    wait_unhealthy(kubelet, {UUIDS[1]})
    assert plugin.alive()
    assert (
        f"GPU enumeration failed; advertising it Unhealthy gpu={UUIDS[1]} index=1 "
        f"error='nvmlDeviceGetMemoryInfo failed: NVML_ERROR_GPU_IS_LOST device={UUIDS[1]}: GPU is lost'"
    ) in plugin.log()


@pytest.fixture
def roots(standin: Path, tmp_path: Path) -> Iterator[dict[str, Path]]:
    """ctr: a container driver root with the library; host: a driver root with it; empty: without."""
    made = {}
    for name, subdir in (("ctr", "lib64"), ("host", "usr/lib/x86_64-linux-gnu"), ("empty", None)):
        root = tmp_path / name
        root.mkdir()
        if subdir:
            (root / subdir).mkdir(parents=True)
            shutil.copy(standin / LIBRARY, root / subdir / LIBRARY)
        made[name] = root
    yield made


@pytest.mark.parametrize(
    ("ctr", "host", "default_search", "loaded"),
    [
        ("ctr", "host", False, "ctr/lib64"),
        ("empty", "host", False, "host/usr/lib/x86_64-linux-gnu"),
        ("empty", "empty", True, None),
    ],
    ids=["container-root-first", "then-driver-root", "then-default-search"],
)
def test_library_lookup_order(
    roots: dict[str, Path],
    standin: Path,
    sock_dir: Path,
    tmp_path: Path,
    processes: list[Process],
    ctr: str,
    host: str,
    default_search: bool,
    loaded: str | None,
) -> None:
    node = StandinNode(tmp_path, gpu_line(0))
    args = ("--driver-root-ctr-path", str(roots[ctr]), "--nvidia-driver-root", str(roots[host]))
    plugin = start_standin_plugin(
        sock_dir, tmp_path, node, processes, standin if default_search else None, args=args
    )
    wait_until(lambda: "NVML initialized" in plugin.log(), timeout=20, what="NVML initialized")
    path = "libnvidia-ml.so.1" if loaded is None else f"{tmp_path / loaded}/{LIBRARY}"
    assert f"library={path}" in plugin.log()


def test_library_not_found_names_every_path_tried(
    roots: dict[str, Path], sock_dir: Path, tmp_path: Path, processes: list[Process]
) -> None:
    try:
        ctypes.CDLL(LIBRARY)
    except OSError:
        pass
    else:
        pytest.skip(f"this machine has a {LIBRARY} in the default search: it would be found")
    node = StandinNode(tmp_path, gpu_line(0))
    args = ("--driver-root-ctr-path", str(roots["empty"]), "--nvidia-driver-root", str(tmp_path / "none"))
    plugin = start_standin_plugin(sock_dir, tmp_path, node, processes, None, args=args)
    assert plugin.wait(timeout=20) == 1
    last = plugin.log().strip().splitlines()[-1]
    assert (
        "failed to initialize NVML: load libnvidia-ml.so.1 failed: NVML_ERROR_LIBRARY_NOT_FOUND: tried "
        in last
    )
    assert f"{roots['empty']}/usr/lib64/{LIBRARY}, " in last
    assert (
        f"{tmp_path}/none/usr/lib/{LIBRARY}, {LIBRARY} (default search: LD_LIBRARY_PATH, ldconfig cache)"
        in last
    )
    assert "Traceback" not in plugin.log()


def test_rescan_serves_repartitioning_and_hot_plug_over_the_real_backend(
    standin: Path, sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    """The device rescan's layout query through pynvml: a MIG re-partition (`+me` and compute
    instance profiles) and a GPU unplugged and plugged back, served without a signal."""
    mig = "gi_slices=3 ci_slices=1 memory_mb=19968 profile=2"
    new = [f"MIG-2222222{n}-0000-4000-8000-00000000000{n}" for n in range(3)]
    node = StandinNode(
        tmp_path,
        gpu_line(0, mig=0)
        + gpu_line(1, mig=1)
        + gpu_line(2, mig=-1)
        + f"mig gpu=1 uuid={MIGS[0]} gi=1 ci=0 gi_slices=3 ci_slices=3 memory_mb=19968 profile=2\n"
        + f"mig gpu=1 uuid={MIGS[1]} gi=7 ci=0 gi_slices=1 ci_slices=1 memory_mb=4864 profile=0\n",
    )
    args = ("--mig-strategy", "mixed", "--device-rescan-interval", "300ms")
    plugin = start_standin_plugin(sock_dir, tmp_path, node, processes, standin, args=args)
    for resource in (GPU, "nvidia.com/mig-3g.20gb", "nvidia.com/mig-1g.5gb"):
        kubelet.wait_for_registration(resource, timeout=20)
    kubelet.wait_for_devices(GPU, lambda d: set(d) == {UUIDS[0], UUIDS[2]}, timeout=10)

    node.command(
        "mig-clear 1\n"
        f"mig gpu=1 uuid={new[0]} gi=1 ci=0 {mig}\n"
        f"mig gpu=1 uuid={new[1]} gi=1 ci=1 {mig}\n"
        f"mig gpu=1 uuid={new[2]} gi=9 ci=0 gi_slices=1 ci_slices=1 memory_mb=4864 profile=7"
    )
    kubelet.wait_for_registration("nvidia.com/mig-1c.3g.20gb", timeout=10)
    kubelet.wait_for_registration("nvidia.com/mig-1g.5gb.me", timeout=10)
    assert set(kubelet.wait_for_devices("nvidia.com/mig-1c.3g.20gb", lambda d: len(d) == 2)) == set(new[:2])
    gone = [sock_dir / "nvidia-mig-3g.20gb.sock", sock_dir / "nvidia-mig-1g.5gb.sock"]
    wait_until(lambda: not any(p.exists() for p in gone), timeout=5, what="vanished profiles' sockets gone")
    assert [r.resource for r in kubelet.registrations].count(GPU) == 1 and kubelet.stream_ends(GPU) == []
    assert (
        f"MIG layout changed gpu=1 uuid={UUIDS[1]} old=1x3g.20gb+1x1g.5gb new=2x1c.3g.20gb+1x1g.5gb+me"
        in plugin.log()
    )

    node.command("unplug 0")
    kubelet.wait_for_devices(GPU, lambda d: set(d) == {UUIDS[2]}, timeout=10)
    wait_until(lambda: "GPU index changed gpu=1" in plugin.log(), timeout=5, what="index line")
    log = plugin.log()
    assert f'GPU disappeared gpu=0 uuid={UUIDS[0]} old="MIG disabled"' in log
    assert f"GPU index changed gpu=0 uuid={UUIDS[1]} old=1" in log
    assert f"GPU index changed gpu=1 uuid={UUIDS[2]} old=2" in log
    node.command("plug 0")
    kubelet.wait_for_devices(GPU, lambda d: set(d) == {UUIDS[0], UUIDS[2]}, timeout=10)
    wait_until(lambda: f"GPU appeared gpu=0 uuid={UUIDS[0]}" in plugin.log(), timeout=5, what="appeared")
    assert plugin.alive() and "Traceback" not in plugin.log()


def test_a_gpu_plugged_back_is_a_new_device_and_starts_healthy(
    standin: Path, sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    """Lost, removed by the rescan, plugged back after a driver rebind: Healthy again; one plugged
    back still broken is marked again by the health monitor."""
    node = StandinNode(tmp_path, gpu_line(0) + gpu_line(1))
    config = "version: v1\nhealth:\n  probeInterval: 200ms\n"
    plugin = start_standin_plugin(
        sock_dir, tmp_path, node, processes, standin, config, ("--device-rescan-interval", "200ms")
    )
    kubelet.wait_for_registration(GPU, timeout=20)
    kubelet.wait_for_devices(GPU, lambda d: len(d) == 2, timeout=10)
    for still_broken in (False, True):
        node.command("lost 0")
        wait_unhealthy(kubelet, {UUIDS[0]})
        node.command("unplug 0")
        kubelet.wait_for_devices(GPU, lambda d: set(d) == {UUIDS[1]}, timeout=10)
        node.command("plug 0" if still_broken else "restored 0\nplug 0")
        kubelet.wait_for_devices(GPU, lambda d: set(d) == {UUIDS[0], UUIDS[1]}, timeout=10)
        wait_unhealthy(kubelet, {UUIDS[0]} if still_broken else set())
    assert f"forgot the health of devices gone from the node devices={UUIDS[0]}" in plugin.log()
    assert plugin.alive() and "Traceback" not in plugin.log()


FABRIC = "fabric cluster=5ad4a1c2-3f0e-4b8d-9c61-7e2f40b1d9a3 clique=32766"


@pytest.mark.parametrize("v1", [True, False], ids=["GetGpuFabricInfo", "GetGpuFabricInfoV"])
def test_gfd_labels_the_clique_through_nvmls_fabric_structs(standin: Path, tmp_path: Path, v1: bool) -> None:
    """nvmlGpuFabricInfo_t (unsigned char state) through pynvml's struct (c_uint state), or the v2
    struct with its version when the library has no unversioned function; GPU 2 without a fabric and
    GPU 3 still registering are left out, as NVIDIA's gfd leaves them."""
    lines = gpu_line(0) + gpu_line(1) + gpu_line(2) + gpu_line(3)
    lines += f"{FABRIC} gpu=0\n{FABRIC} gpu=1\n{FABRIC} gpu=3 state=2\n" + ("" if v1 else "fabric_v1 0\n")
    node = StandinNode(tmp_path, lines)
    out = tmp_path / "labels"
    result = subprocess.run(
        [sys.executable, "-m", "nvdp.cli", "gfd", "--nvml", "real", "--oneshot", "-o", str(out),
         "--machine-type-file", ""],
        env={"PATH": "/usr/bin:/bin", **node.env(standin)},
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    labels = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert labels["nvidia.com/gpu.clique"] == "5ad4a1c2-3f0e-4b8d-9c61-7e2f40b1d9a3.32766"
    assert labels["nvidia.com/gpu.count"] == "4" and "WARNING" not in result.stderr
