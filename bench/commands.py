"""Peak RSS, idle CPU and heavy imports of the plugin's newer modes and of the side commands.

Run alone: `python -m bench.commands [--idle-seconds S]` prints the rows; `python -m bench` includes them.

Each process runs as a real process, as in a pod:

- `nvdp plugin` with `--device-list-strategy=cdi-cri` (the CDI spec written into a temp dir for a
  simulated dgx-a100 driver root), after 400 Allocate calls;
- `nvdp plugin` with an MPS config (sim:pcie-4, 4 replicas per GPU), served once the
  `nvdp mps-control-daemon` next to it (over the stand-in `nvidia-cuda-mps-control`,
  testkit/mps_control.py) has written its ready marker, after 400 Allocate calls;
- `nvdp mps-control-daemon` itself (its health query runs `nvidia-cuda-mps-control` every 5 s by
  default; the CPU of those children, here the Python stand-in, is shown apart from the daemon's own);
- `nvdp gfd` in loop mode writing a labels file, and with `--use-node-feature-api` against the
  Kubernetes API stand-in (testkit/kube_api_standin) through the real `kubernetes` client;
- `nvdp config-manager` watching a node label (bench/config_manager.py).

The heavy modules a process imported are read from its `sys.modules` when it exits: a
`sitecustomize` on its PYTHONPATH writes the names to a file from an atexit hook (costs nothing
while it runs). The plugin must import none of `kubernetes`, `ssl`, `http.client`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # `python bench/commands.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.budgets import PLUGIN_RSS_BUDGET_MB, SIDE_RSS_BUDGET_MB
from nvdp.api import pb
from nvdp.sim.kubelet import Kubelet
from testkit import REPO, Process, ProcStats, clean_env, start_plugin, wait_until

GPU = "nvidia.com/gpu"
HEAVY = ("kubernetes", "ssl", "http.client")
ALLOCATES = 400
MPS4 = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 4\n"
PRODUCT_NAME = "NVIDIA DGX A100 920-23687-2530-000\n"  # what a DGX's DMI product_name says
NODE_FEATURE = "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/gpu-ns/nodefeatures/nvidia-features-for-node-a"

SITECUSTOMIZE = '''"""bench/commands.py: write the names in sys.modules to $NVDP_BENCH_MODULES at exit."""
import atexit, os, sys
_path = os.environ.pop("NVDP_BENCH_MODULES", None)  # this process's, not its children's
if _path:
    def _dump(path=_path):
        with open(path, "w") as f:
            f.write("\\n".join(sorted(k for k, v in sys.modules.items() if v is not None)) + "\\n")
    atexit.register(_dump)
'''


@dataclass
class Measured:
    """One process: its peak RSS, its idle CPU (own + waited-for children) and wake-ups, its heavy
    imports (None: not read)."""

    what: str
    kind: str  # "plugin" or "side"
    peak_mb: float = 0.0
    idle_cpu_ms: float | None = None  # the process's own
    idle_children_ms: float = 0.0  # children it waited for during the idle period
    idle_s: float = 0.0
    wakeups: float = 0.0
    heavy: list[str] | None = None
    note: str = ""


def _cpu(pid: int) -> tuple[float, float]:
    """(own, waited-for children) CPU seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks, (int(fields[13]) + int(fields[14])) / ticks


class Watched:
    """A started process, with the env that dumps its modules at exit."""

    def __init__(self, measured: Measured, process: Process, modules: Path) -> None:
        self.m = measured
        self.process = process
        self.modules = modules
        self._cpu = (0.0, 0.0)
        self._switches = 0
        self._t0 = 0.0

    def idle_start(self) -> None:
        self._cpu = _cpu(self.process.pid)
        self._switches = ProcStats.read(self.process.pid).switches
        self._t0 = time.monotonic()

    def idle_end(self) -> None:
        elapsed = time.monotonic() - self._t0
        self.m.idle_s = elapsed
        own, children = _cpu(self.process.pid)
        self.m.idle_cpu_ms = (own - self._cpu[0]) * 1e3
        self.m.idle_children_ms = (children - self._cpu[1]) * 1e3
        self.m.wakeups = (ProcStats.read(self.process.pid).switches - self._switches) / elapsed

    def peak(self) -> None:
        self.m.peak_mb = ProcStats.read(self.process.pid).peak_rss_mib * 1024 * 1024 / 1e6

    def stop(self) -> None:
        self.process.stop()
        if self.modules.exists():
            names = set(self.modules.read_text().split())
            self.m.heavy = [h for h in HEAVY if h in names]


class Runner:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.site = work / "site"
        self.site.mkdir()
        (self.site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self._n = 0

    def env(self, name: str, base: dict[str, str] | None = None) -> tuple[dict[str, str], Path]:
        modules = self.work / f"{name}.modules"
        env = dict(clean_env() if base is None else base)
        env["PYTHONPATH"] = os.pathsep.join((str(self.site), str(REPO)))
        env["NVDP_BENCH_MODULES"] = str(modules)
        return env, modules

    def dir(self, name: str) -> Path:
        self._n += 1
        path = Path(tempfile.mkdtemp(prefix=f"nvdp-{self._n}-", dir="/tmp"))  # short: unix sockets
        return path


def _allocate(kubelet: Kubelet, calls: int) -> None:
    ids = list(kubelet.devices(GPU))
    stub = kubelet.stub(GPU)
    for i in range(calls):
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=[ids[i % len(ids)]])]
        )
        stub.Allocate(request, timeout=10)


def measure(idle_seconds: float, keep: bool = False) -> list[Measured]:
    from testkit import sim_gpus
    from testkit.driver_root import make_node
    from testkit.kube_api_standin import KubeApiStandin
    from testkit.mps_control import Standin

    work = Path(tempfile.mkdtemp(prefix="nvdp-bench-cmd-", dir="/tmp"))
    r = Runner(work)
    watched: list[Watched] = []
    dirs: list[Path] = []
    try:
        with contextlib.ExitStack() as stack:

            def start(
                m: Measured, argv: list[str] | None, env: dict[str, str], modules: Path, log: Path
            ) -> Watched:
                assert argv is not None
                w = Watched(m, Process(argv, log, env), modules)
                stack.callback(w.stop)
                watched.append(w)
                return w

            # plugin, CDI
            sock = r.dir("cdi")
            dirs.append(sock)
            root = sock / "root"
            make_node(root, sim_gpus("dgx-a100"))
            kubelet = stack.enter_context(Kubelet(sock))
            env, modules = r.env("plugin-cdi")
            cdi_flags = [
                "--device-list-strategy=cdi-cri",
                f"--cdi-spec-dir={sock / 'cdi'}",
                f"--driver-root={root}",
                f"--container-driver-root={sock / 'no-mount'}",
            ]
            process = start_plugin(sock, "sim:dgx-a100", env=env, extra=cdi_flags)
            w = Watched(
                Measured("plugin, --device-list-strategy=cdi-cri (dgx-a100)", "plugin"), process, modules
            )
            stack.callback(w.stop)
            watched.append(w)
            kubelet.wait_for_registration(GPU, timeout=60)
            kubelet.wait_for_devices(GPU, timeout=30)
            specs = list((sock / "cdi").glob("*"))
            w.m.note = f"{len(specs)} CDI spec file(s) written"
            _allocate(kubelet, ALLOCATES)

            # plugin + mps-control-daemon, MPS config
            sock = r.dir("mps")
            dirs.append(sock)
            config = sock / "config.yaml"
            config.write_text(MPS4)
            standin = Standin(sock / "standin")
            kubelet = stack.enter_context(Kubelet(sock))
            env, modules = r.env("plugin-mps")
            process = start_plugin(
                sock, "sim:pcie-4", config_file=config, extra=["--mps-root", str(sock / "mps")], env=env
            )
            mps_plugin = Watched(
                Measured("plugin, MPS config (pcie-4, 4 replicas each)", "plugin"), process, modules
            )
            stack.callback(mps_plugin.stop)
            watched.append(mps_plugin)
            env, modules = r.env("mps-daemon", standin.env(clean_env()))
            argv = [sys.executable, "-m", "nvdp.cli", "mps-control-daemon", "--nvml", "sim:pcie-4"]
            argv += ["--config-file", str(config), "--mps-root", str(sock / "mps")]
            start(
                Measured("mps-control-daemon (stand-in nvidia-cuda-mps-control)", "side"),
                argv,
                env,
                modules,
                sock / "daemon.log",
            )
            kubelet.wait_for_registration(GPU, timeout=60)
            kubelet.wait_for_devices(GPU, lambda d: len(d) == 16, timeout=30)
            _allocate(kubelet, ALLOCATES)

            # gfd, loop mode, labels file
            gdir = r.dir("gfd")
            dirs.append(gdir)
            product_name = gdir / "product_name"
            product_name.write_text(PRODUCT_NAME)
            gfd = [sys.executable, "-m", "nvdp.cli", "gfd", "--nvml", "sim:pcie-4"]
            gfd += ["--machine-type-file", str(product_name)]
            base = clean_env()
            for name in list(base):
                if name.startswith("GFD_") or name in ("KUBECONFIG", "KUBERNETES_NAMESPACE", "POD_NAMESPACE"):
                    del base[name]
            env, modules = r.env("gfd-file", base)
            out = gdir / "gfd"
            start(
                Measured("gfd, loop mode, labels file (sleep 60 s)", "side"),
                [*gfd, "--output-file", str(out)],
                env,
                modules,
                gdir / "gfd.log",
            )
            wait_until(lambda: out.exists(), 60, "gfd labels file")

            # gfd --use-node-feature-api
            api = stack.enter_context(KubeApiStandin())
            kubeconfig = api.write_kubeconfig(gdir / "kubeconfig")
            nf_env = {**base, "KUBECONFIG": str(kubeconfig), "NODE_NAME": "node-a"}
            nf_env["KUBERNETES_NAMESPACE"] = "gpu-ns"
            env, modules = r.env("gfd-nf", nf_env)
            start(
                Measured("gfd, --use-node-feature-api (kubernetes client)", "side"),
                [*gfd, "--use-node-feature-api", "--output-file", str(gdir / "unused")],
                env,
                modules,
                gdir / "gfd-nf.log",
            )
            wait_until(lambda: NODE_FEATURE in api.objects, 60, "NodeFeature created")

            time.sleep(1.0)  # start-up work done
            for w in watched:
                w.idle_start()
            time.sleep(idle_seconds)
            for w in watched:
                w.idle_end()
                w.peak()
        # stopped here (the ExitStack): the modules files are written
        for w in watched:
            if w.m.heavy is None and w.modules.exists():
                names = set(w.modules.read_text().split())
                w.m.heavy = [h for h in HEAVY if h in names]
        with tempfile.TemporaryDirectory(prefix="nvdp-bench-cm-") as cm_work:
            from bench import config_manager

            result = config_manager.measure(Path(cm_work))
        cm = Measured("config-manager, watching (20 label flips, 1 edit)", "side")
        cm.peak_mb = result["peak_rss_mib"] * 1024 * 1024 / 1e6
        return [w.m for w in watched] + [cm]
    finally:
        if not keep:
            import shutil

            for d in [work, *dirs]:
                shutil.rmtree(d, ignore_errors=True)


def budget_mb(m: Measured) -> float:
    return PLUGIN_RSS_BUDGET_MB if m.kind == "plugin" else SIDE_RSS_BUDGET_MB


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.commands", description=__doc__.splitlines()[0])
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    for m in measure(args.idle_seconds, args.keep):
        idle = (
            ""
            if m.idle_cpu_ms is None
            else f", idle {m.idle_cpu_ms:.0f} ms CPU (children {m.idle_children_ms:.0f} ms)"
            f" / {m.idle_s:.0f} s, {m.wakeups:.0f} wake-ups/s"
        )
        heavy = "" if m.heavy is None else f", heavy modules: {', '.join(m.heavy) or 'none'}"
        print(f"{m.what}: peak {m.peak_mb:.1f} MB (budget {budget_mb(m):.0f}){idle}{heavy} {m.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
