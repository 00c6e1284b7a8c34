"""API requests per node of every command, as a DaemonSet on 5,000 nodes makes them: each command a real
process with production's timers, each with an API stand-in of its own (testkit.kube_api_standin) that
logs every request.

- Idle: requests per node per hour. A watch asks the server to end it after its `timeoutSeconds` and
  is opened again, so each open watch costs 3600 / timeoutSeconds requests an hour (read from its
  request); any other request seen in the idle window counts at its rate (`--idle-seconds`: gfd's
  NodeFeature write every 60 s needs a window of 60 s). A GET that is no watch in the idle window is a
  poll that a watch could have answered (budget: none).
- One fleet-wide ConfigMap edit: the entry in use edited in the ConfigMap of the config-manager's
  API stand-in (`--configmap-name`, the chart's default), and what reaches the other commands after
  it (their config file rewritten and a SIGHUP, as the config-manager sends the device plugin, and a
  ConfigMap volume update brings the DRA plugin with its reload): the requests each made in the
  window after it, and how long after the edit the config-manager's first write came. That write
  waits a random delay of up to `--configmap-spread` (10 s), so that 5,000 nodes spread theirs over
  that long (about 500 a second) rather than hitting the server in the same second; the downstream
  reloads follow the config-manager's apply, so they are spread with it.

Run alone: `python -m bench.api_cost [--idle-seconds S]`; `python -m bench` includes it (full run).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # `python bench/api_cost.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.budgets import API_EDIT_REQUESTS_BUDGET, API_IDLE_BUDGET_PER_HOUR, API_SPREAD_MIN_S
from nvdp.sim.kubelet import Kubelet
from testkit import Process, clean_env, start_plugin, wait_until
from testkit.dra import dra_cluster, slices_of
from testkit.kube_api_standin import KubeApiStandin
from testkit.mps_control import Standin

NODE = "node-a"
NAMESPACE = "gpu-system"
CONFIGMAP = "plugin-configs"
LABEL = "nvidia.com/device-plugin.config"
NODEFEATURES = f"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{NAMESPACE}/nodefeatures"
FLEET = 5000
SPREAD_S = 10.0  # the config-manager's --configmap-spread default
WRITES = ("POST", "PUT", "PATCH", "DELETE")
Request = tuple[str, str, dict[str, str]]


def _entry(replicas: int) -> str:
    resources = f"[{{name: nvidia.com/gpu, replicas: {replicas}}}]"
    return f"version: v1\nsharing: {{timeSlicing: {{resources: {resources}}}}}\n"


DRA_CONFIG = (
    "version: v1\ndra:\n  devices: all\n",
    "version: v1\ndra:\n  devices: all\n  consumableCapacity: all\n",
)


@dataclass
class Command:
    """One command's process, its API stand-in and what a fleet-wide edit does to it."""

    name: str
    api: KubeApiStandin
    process: Process
    edit: Callable[[], None] = lambda: None
    idle: list[Request] = field(default_factory=list)
    watches: dict[tuple[str, str], float] = field(default_factory=dict)  # (path, selector) -> timeout
    idle_s: float = 0.0
    after_edit: list[Request] = field(default_factory=list)
    first_write_s: float | None = None

    def per_hour(self) -> float:
        others = [r for r in self.idle if r[2].get("watch") != "true"]
        return len(others) * 3600 / self.idle_s + sum(3600 / t for t in self.watches.values())

    def polls(self) -> int:
        return sum(1 for method, _, query in self.idle if method == "GET" and query.get("watch") != "true")


def _open_watches(requests: list[Request]) -> dict[tuple[str, str], float]:
    """The watch streams a command keeps open, each with the timeoutSeconds it asks for (the API
    server's shortest default, 1800 s, where it asks for none)."""
    found: dict[tuple[str, str], float] = {}
    for _, path, query in requests:
        if query.get("watch") == "true":
            found[(path, query.get("fieldSelector", ""))] = float(query.get("timeoutSeconds") or 1800)
    return found


def _kubeconfig(api: KubeApiStandin, where: Path) -> dict[str, str]:
    where.mkdir(parents=True, exist_ok=True)
    return {"KUBECONFIG": str(api.write_kubeconfig(where / "kubeconfig")), "NODE_NAME": NODE}


def _node(api: KubeApiStandin) -> None:
    api.put(f"/api/v1/nodes/{NODE}", {"kind": "Node", "metadata": {"name": NODE, "labels": {LABEL: "a"}}})


@contextlib.contextmanager
def _commands(work: Path) -> Iterator[list[Command]]:
    with contextlib.ExitStack() as stack:
        found: list[Command] = []

        def api() -> KubeApiStandin:
            standin = stack.enter_context(KubeApiStandin())
            _node(standin)
            return standin

        def started(name: str, standin: KubeApiStandin, process: Process, edit: Callable[[], None]) -> None:
            stack.callback(process.stop)
            found.append(Command(name, standin, process, edit))

        # the device plugin: its config file rewritten and a SIGHUP, as the config-manager does
        plugin_dir = work / "kubelet" / "device-plugins"
        plugin_dir.mkdir(parents=True)
        kubelet = stack.enter_context(Kubelet(plugin_dir))
        config = work / "plugin.yaml"
        config.write_text(_entry(2))
        standin = api()
        process = start_plugin(
            plugin_dir, "sim:dgx-a100", config_file=config, env=_kubeconfig(standin, work / "plugin")
        )

        def plugin_edit(process: Process = process) -> None:
            config.write_text(_entry(4))
            process.send(signal.SIGHUP)

        started("plugin", standin, process, plugin_edit)
        kubelet.wait_for_registration("nvidia.com/gpu", timeout=60)

        # gfd with the NodeFeature API (NVIDIA's default sleep interval, 60 s)
        standin = api()
        gfd_env = clean_env({**_kubeconfig(standin, work / "gfd"), "KUBERNETES_NAMESPACE": NAMESPACE})
        argv = [sys.executable, "-m", "nvdp.cli", "gfd", "--nvml", "sim:pcie-4", "--use-node-feature-api"]
        argv += ["--output-file", str(work / "gfd-unused")]
        started("gfd", standin, Process(argv, work / "gfd.log", gfd_env), lambda: None)
        feature = (
            f"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{NAMESPACE}/nodefeatures/nvidia-features-for-{NODE}"
        )
        wait_until(lambda s=standin: feature in s.objects, 60, "gfd's NodeFeature")

        # config-manager watching its Node and the ConfigMap through the API
        standin = api()
        src = work / "src"
        src.mkdir()
        (src / "a").write_text(_entry(2))
        path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{CONFIGMAP}"
        standin.put(path, {"kind": "ConfigMap", "metadata": {"name": CONFIGMAP, "namespace": NAMESPACE},
                           "data": {"a": _entry(2)}})  # fmt: skip
        argv = [sys.executable, "-m", "nvdp.cli", "config-manager", "--node-name", NODE]
        argv += ["--config-file-srcdir", str(src), "--config-file-dst", str(work / "dst" / "config.yaml")]
        argv += ["--configmap-name", CONFIGMAP, "--namespace", NAMESPACE, "--send-signal=false"]

        def configmap_edit(standin: KubeApiStandin = standin) -> None:
            standin.merge_patch(path, {"data": {"a": _entry(4)}})

        env = clean_env(_kubeconfig(standin, work / "cm"))
        started("config-manager", standin, Process(argv, work / "config-manager.log", env), configmap_edit)

        # the DRA kubelet plugin: its CONFIG_FILE updated (the ConfigMap volume) and its reload
        cluster = stack.enter_context(dra_cluster(work, "sim:dgx-a100-mig", config=DRA_CONFIG[0]))
        dra = cluster.start()

        def dra_edit(process: Process = dra) -> None:
            (cluster.node.root / "config.yaml").write_text(DRA_CONFIG[1])
            process.send(signal.SIGHUP)

        started("dra-kubelet-plugin", cluster.api, dra, dra_edit)
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 30, "the ResourceSlices")

        # mps-control-daemon (no API client: its count shows it)
        standin = api()
        mps = Standin(work / "mps-standin")
        mps_config = work / "mps.yaml"
        mps_config.write_text(
            "version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 4\n"
        )
        argv = [sys.executable, "-m", "nvdp.cli", "mps-control-daemon", "--nvml", "sim:pcie-4"]
        argv += ["--config-file", str(mps_config), "--mps-root", str(work / "mps")]
        env = mps.env(clean_env(_kubeconfig(standin, work / "mps-api")))
        started("mps-control-daemon", standin, Process(argv, work / "mps.log", env), lambda: None)
        yield found


def measure(idle_seconds: float, work: Path) -> list[Command]:
    with _commands(work) as commands:
        time.sleep(5.0)  # start-up done: first lists, the node condition's settle (3 s), gfd's first write
        marks = {c.name: len(c.api.requests) for c in commands}
        t0 = time.monotonic()
        time.sleep(idle_seconds)
        for c in commands:
            c.idle_s = time.monotonic() - t0
            c.idle = list(c.api.requests[marks[c.name] :])
            c.watches = _open_watches(c.api.requests)
        marks = {c.name: len(c.api.requests) for c in commands}
        edited = time.monotonic()
        for c in commands:
            c.edit()
        window = SPREAD_S + 10.0
        while time.monotonic() - edited < window:
            for c in commands:
                new = c.api.requests[marks[c.name] :]
                if c.first_write_s is None and any(r[0] in WRITES for r in new):
                    c.first_write_s = time.monotonic() - edited
            time.sleep(0.01)
        for c in commands:
            c.after_edit = [r for r in c.api.requests[marks[c.name] :] if r[2].get("watch") != "true"]
        return commands


def rows(commands: list[Command]) -> list[object]:
    from bench.table import Row

    out: list[Row] = []
    for c in commands:
        per_hour = c.per_hour()
        watches = ", ".join(
            f"{p.rsplit('/', 1)[-1]} every {t:.0f} s" for (p, _), t in sorted(c.watches.items())
        )
        fleet = per_hour * FLEET / 3600
        out.append(
            Row(
                f"{c.name}: idle API requests per node per hour",
                "nvdp",
                f"{c.idle_s:.0f} s",
                value=f"{per_hour:.1f}/h ({fleet:.1f}/s for {FLEET} nodes); polls {c.polls()}; "
                f"watches: {watches or 'none'}",
                budget=f"{API_IDLE_BUDGET_PER_HOUR[c.name]:g}/h; no poll",
                ok=per_hour <= API_IDLE_BUDGET_PER_HOUR[c.name] and c.polls() == 0,
            )
        )
        writes = sum(1 for r in c.after_edit if r[0] in WRITES)
        first = "none" if c.first_write_s is None else f"{c.first_write_s:.1f} s after the edit"
        spread_ok = c.name != "config-manager" or SPREAD_S >= API_SPREAD_MIN_S
        out.append(
            Row(
                f"{c.name}: one fleet-wide ConfigMap edit",
                "nvdp",
                f"{SPREAD_S + 10:.0f} s",
                value=f"{len(c.after_edit)} requests ({writes} writes); first write {first}",
                budget=f"<= {API_EDIT_REQUESTS_BUDGET} requests"
                + (f"; spread >= {API_SPREAD_MIN_S:g} s" if c.name == "config-manager" else ""),
                ok=len(c.after_edit) <= API_EDIT_REQUESTS_BUDGET and spread_ok,
            )
        )
    return out


def section(s: object) -> None:
    """`python -m bench`'s section (s: bench.session.Session; full run only)."""
    from bench.session import Session

    assert isinstance(s, Session)
    seconds = max(s.o.idle_seconds, 60.0)
    s.progress(f"API requests per node of every command, idle {seconds:g} s and one edit (bench/api_cost.py)")
    commands = measure(seconds, s.fresh_dir("api"))
    s.table.section(
        f"API requests per node (a DaemonSet on {FLEET} nodes), API stand-in per command (bench/api_cost.py)"
    ).extend(rows(commands))  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.api_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nvdp-bench-api-", dir="/tmp") as work:
        for row in rows(measure(args.idle_seconds, Path(work))):
            print(f"{row.measurement}: {row.value} [budget {row.budget}: {row.ok}]")  # type: ignore[attr-defined]


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
