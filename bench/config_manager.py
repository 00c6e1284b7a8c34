"""Memory of `nvdp config-manager` while it watches: `python -m bench.config_manager [--flips N]`.

Runs the config-manager as a process against the Kubernetes API stand-in (testkit/kube_api_standin)
on 127.0.0.1 through the real `kubernetes` client, flips the node label N times between two entries
(each flip re-links the config file; no plugin runs, so nothing is signalled), edits the ConfigMap
once, and reads the process's peak RSS (VmHWM) and current RSS. Budget: 80 MB (80e6 bytes) peak.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # `python bench/config_manager.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.budgets import SIDE_RSS_BUDGET_MB
from testkit import Process, ProcStats, clean_env, wait_until
from testkit.kube_api_standin import KubeApiStandin

BUDGET_BYTES = SIDE_RSS_BUDGET_MB * 1e6
NODE = "bench-node"
NODE_PATH = f"/api/v1/nodes/{NODE}"
LABEL = "nvidia.com/device-plugin.config"


def _entry(replicas: int) -> str:
    resources = f"[{{name: nvidia.com/gpu, replicas: {replicas}}}]"
    return f"version: v1\nsharing: {{timeSlicing: {{resources: {resources}}}}}\n"


def measure(work: Path, flips: int = 20) -> dict[str, float]:
    src = work / "src"
    src.mkdir()
    (src / "a").write_text(_entry(2))
    (src / "b").write_text(_entry(4))
    dst = work / "dst" / "config.yaml"
    with KubeApiStandin() as api:
        api.put(
            NODE_PATH,
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {LABEL: "a"}}},
        )
        kubeconfig = api.write_kubeconfig(work / "kubeconfig")
        argv = [sys.executable, "-m", "nvdp.cli", "config-manager", "--kubeconfig", str(kubeconfig)]
        argv += ["--node-name", NODE, "--config-file-srcdir", str(src), "--config-file-dst", str(dst)]
        argv += ["--send-signal=false", "--poll-interval", "0.2"]
        started = time.monotonic()
        with Process(argv, work / "config-manager.log", clean_env()) as manager:
            wait_until(lambda: dst.is_symlink(), 60, "first link")
            first_link_s = time.monotonic() - started
            for i in range(flips):
                value = "b" if i % 2 == 0 else "a"
                api.patch_labels(NODE_PATH, {LABEL: value})
                wait_until(lambda v=value: os.readlink(dst).endswith("/" + v), 10, f"link to {value}")  # type: ignore[misc]
            (src / "a").write_text(_entry(3))  # an edit of the entry in use: re-applied
            wait_until(lambda: manager.log().count("config applied") >= flips + 2, 10, "edit applied")
            time.sleep(1.0)  # watching, idle
            stats = ProcStats.read(manager.pid)
    return {
        "peak_rss_mib": stats.peak_rss_mib,
        "rss_mib": stats.rss_mib,
        "threads": stats.threads,
        "first_link_s": first_link_s,
        "flips": flips,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.config_manager", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--flips", type=int, default=20, help="label changes to apply (default 20)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nvdp-bench-cm-") as work:
        result = measure(Path(work), args.flips)
    peak_bytes = result["peak_rss_mib"] * 1024 * 1024
    ok = peak_bytes < BUDGET_BYTES
    if args.json:
        print(json.dumps({**result, "budget_bytes": BUDGET_BYTES, "ok": ok}))
    else:
        verdict = "ok" if ok else "OVER"
        budget = f"budget {SIDE_RSS_BUDGET_MB:.0f} MB"
        print(f"config-manager peak RSS (VmHWM): {peak_bytes / 1e6:.1f} MB ({budget}) {verdict}")
        print(f"config-manager RSS now: {result['rss_mib'] * 1.048576:.1f} MB, threads {result['threads']}")
        print(f"start to first link: {result['first_link_s']:.2f} s; label flips applied: {result['flips']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
