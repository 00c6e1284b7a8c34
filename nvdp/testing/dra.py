"""The DRA kubelet plugin as a real process, for the tests and the benchmarks: one node's directories
(`DraNode`: the kubelet's plugins_registry and plugins directories, the CDI root, a driver root) and
`start_dra_plugin`, which runs `python -m nvdp.cli dra-kubelet-plugin` on them."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvdp.testing.processes import Process, clean_env

DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True)
class DraNode:
    """A node's directories under `root`; the driver root (`driver_root`) is the caller's to fill."""

    root: Path
    name: str = "node-a"

    @property
    def registry(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins(self) -> Path:
        return self.root / "plugins"

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    @property
    def driver_root(self) -> Path:
        return self.root / "driver"

    @property
    def checkpoint(self) -> Path:
        return self.plugins / DRIVER / "checkpoint.json"

    def argv(
        self, nvml: str, kubeconfig: Path, extra: Sequence[str] = (), metrics_address: str = ""
    ) -> list[str]:
        """The command line; without `metrics_address`, no HTTP endpoint (the plugin's default port
        is the host's, not a test's)."""
        return [
            *(
                sys.executable,
                "-m",
                "nvdp.cli",
                "dra-kubelet-plugin",
                "--nvml",
                nvml,
                "--node-name",
                self.name,
            ),
            *("--kubeconfig", str(kubeconfig), "--cdi-root", str(self.cdi)),
            *("--kubelet-registrar-directory-path", str(self.registry)),
            *("--kubelet-plugins-directory-path", str(self.plugins)),
            *("--driver-root", str(self.driver_root), "--container-driver-root", str(self.root / "no-mount")),
            *("--metrics-address", metrics_address),
            *extra,
        ]


def start_dra_plugin(
    node: DraNode,
    nvml: str,
    kubeconfig: Path,
    *,
    env: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
    log_path: Path | None = None,
    metrics_address: str = "",
) -> Process:
    """`nvdp dra-kubelet-plugin` for `node`, its stderr in `node.root/dra.log` (appended across runs)."""
    argv = node.argv(nvml, kubeconfig, extra, metrics_address)
    return Process(argv, log_path or node.root / "dra.log", clean_env(env))
