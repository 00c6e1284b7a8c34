"""`nvdp simulate`: the plugin on a simulated (or real) node against the in-process kubelet.

Prints what a kubelet would see: the advertised resources and devices, one pod admitted as the
kubelet admits it (a preferred allocation and the Allocate answer for it), and the allocation ledger
after it (what `nvdp status` prints on a node). With --serve it keeps running and prints every health
change.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TextIO

import grpc

from nvdp.api import HEALTHY, pb
from nvdp.base.errors import KubeletError, NvdpError
from nvdp.config import PluginOptions
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.deviceplugin.daemon import Daemon
from nvdp.plugins.ledger.report import describe_allocations
from nvdp.plugins.metrics.allocations import AllocationPages
from nvdp.side.gfd.discover import describe_labels
from nvdp.sim.kubelet import Kubelet

START_TIMEOUT_S = 20.0
DEMO_NAMESPACE, DEMO_POD, DEMO_CONTAINER = "default", "simulate-demo", "main"


class Simulation:
    def __init__(
        self, options: PluginOptions, environ: Mapping[str, str], reload_config: Callable[[], PluginOptions]
    ) -> None:
        self.config, self.runtime = options.config, options.runtime
        self.plugin_dir = Path(self.config.flags.plugin.kubelet_socket).parent
        self.kubelet = Kubelet(self.plugin_dir, pod_resources=True)
        self.daemon = Daemon(options, reload_config=reload_config, environ=environ)
        self._thread = threading.Thread(target=self._run, name="nvdp-daemon", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.daemon.run()
        except BaseException as error:  # reported by __enter__ / demo
            self._error = error
            self.daemon.ready.set()

    def __enter__(self) -> Simulation:
        self.kubelet.start()
        self._thread.start()
        if not self.daemon.ready.wait(START_TIMEOUT_S):
            self.__exit__(None, None, None)
            raise NvdpError(f"the plugin did not register with the kubelet within {START_TIMEOUT_S:.0f}s")
        if self._error is not None:
            error = self._error
            self.__exit__(None, None, None)
            if isinstance(error, NvdpError):
                raise error
            raise NvdpError(f"the plugin failed: {error}") from error
        for name in self.daemon.supervisor.servers:
            self.kubelet.wait_for_devices(name, timeout=START_TIMEOUT_S)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.daemon.request_stop()
        self._thread.join(5.0)
        self.kubelet.stop()

    # ---- output -------------------------------------------------------------------------------
    def demo(self, out: TextIO) -> None:
        nvml = self.daemon.nvml
        gpus = {g.uuid: g for g in self.daemon.supervisor.gpus}
        servers = self.daemon.supervisor.servers
        out.write(
            f"nvdp simulate: node {self.runtime.nvml}, driver {nvml.driver_version()}, "
            f"CUDA {nvml.cuda_driver_version()}, mig-strategy {self.config.flags.mig_strategy}\n"
            f"kubelet stand-in: {self.kubelet.socket_path}\n\n"
        )
        if not servers:
            out.write(self._why_nothing())
            return
        out.write("Advertised resources\n")
        for name, server in sorted(servers.items()):
            out.write(f"  {name:<28} {_devices(len(server.devices)):>12}  socket {server.socket_path.name}\n")
        for name, server in sorted(servers.items()):
            seen = self.kubelet.devices(name)
            out.write(f"\n{name}\n")
            out.write(f"  {'ID':<47} {'INDEX':<6} {'PRODUCT / PROFILE':<26} {'MEMORY':>10}  NUMA  HEALTH\n")
            for device in server.devices.values():
                state = seen.get(device.id)
                product = device.mig.profile if device.mig else gpus[device.gpu_uuid].name
                numa = ",".join(str(n) for n in state.numa_nodes) if state and state.numa_nodes else "-"
                out.write(
                    f"  {device.id:<47} {device.index:<6} {product:<26} "
                    f"{device.memory_bytes / 2**30:>6.1f} GiB  {numa:<4}  {state.health if state else '?'}\n"
                )
        out.write(
            f"\nNode labels (what `nvdp gfd` writes for this node)\n{describe_labels(nvml, self.config)}"
        )
        name = "nvidia.com/gpu" if "nvidia.com/gpu" in servers else sorted(servers)[0]
        available = [i for i, s in self.kubelet.devices(name).items() if s.health == HEALTHY]
        shared_one = servers[name].resource.fail_requests_greater_than_one
        size = 1 if shared_one else max(1, min(4, len(available) // 2))
        out.write(f"\nGetPreferredAllocation {name}: {size} of {len(available)} available\n")
        try:
            pod = self.kubelet.admit_pod(DEMO_NAMESPACE, DEMO_POD, {DEMO_CONTAINER: {name: size}})
        except grpc.RpcError as error:  # what the kubelet would get back: show it, not a traceback
            out.write(f"  refused: {error.code().name}: {error.details()}\n")
            return
        except KubeletError as error:
            out.write(f"  refused: {error}\n")
            return
        (assignment,) = pod.assignments
        chosen = list(assignment.device_ids)
        out.write(f"  -> {', '.join(chosen)}\n")
        out.write(f"     {self._explain(name, chosen, gpus)}\n")
        out.write(f"\nAllocate {name} ({_devices(len(chosen), 'those')}) -> container answer\n")
        _write_container(out, assignment.response)
        out.write(
            f"\nPod {DEMO_NAMESPACE}/{DEMO_POD} admitted; the allocation ledger after it (`nvdp status`):\n"
        )
        out.write(describe_allocations(self.allocations()))
        out.write(f"\nThat is what a kubelet sees from this node. {self._next_steps()}\n")

    def allocations(self) -> dict[str, object]:
        """The /allocations document of the simulated node, read from the kubelet stand-in now."""
        daemon = self.daemon
        pages = AllocationPages(
            daemon.ledger, daemon.supervisor, daemon.health, daemon.supervisor.served_gpus
        )
        return pages.document(max_age=0.0)

    def _why_nothing(self) -> str:
        found = len(self.daemon.supervisor.gpus)
        if not found:
            return "No resources advertised: the node has no GPUs.\n"
        text = f"No resources advertised for the {found} GPUs found: the warnings above say why.\n"
        if self.runtime.nvml.startswith("sim:") and any(
            s.startswith("cdi-") for s in self.config.flags.plugin.device_list_strategy
        ):
            text += (
                "A CDI strategy needs the GPUs' device nodes (/dev/nvidia0, ...) under --dev-root, and a"
                " simulated node has none: point --dev-root at a directory holding files of those names.\n"
            )
        return text

    def _next_steps(self) -> str:
        """What else to try, leaving out what this run already did."""
        tries = []
        if self.runtime.nvml != "sim:dgx-a100-mig":
            tries.append("--profile dgx-a100-mig --mig-strategy mixed")
        if self.runtime.nvml != "sim:pcie-4":
            tries.append("--profile pcie-4")
        if self.runtime.config_file is None:
            tries.append("--config-file FILE")
        tries.append("--serve with NVDP_SIM_EVENTS to inject GPU faults (see README)")
        return f"Try: {', '.join(tries[:-1])}, or {tries[-1]}." if len(tries) > 1 else f"Try: {tries[0]}."

    def _explain(self, name: str, ids: list[str], gpus: Mapping[str, GpuInfo]) -> str:
        devices = [self.daemon.supervisor.servers[name].devices[i] for i in ids]
        numa = sorted({d.numa_node for d in devices if d.numa_node is not None})
        parts = [
            f"GPU index {', '.join(d.index for d in devices)}",
            f"NUMA node {','.join(map(str, numa)) or 'unknown'}",
        ]
        parents = list(dict.fromkeys(d.gpu_uuid for d in devices))
        if len(parents) > 1 and all(p in gpus for p in parents):
            nvlinks = [
                self.daemon.nvml.link(a, b).nvlinks for i, a in enumerate(parents) for b in parents[i + 1 :]
            ]
            parts.append(
                f"NVLinks per pair {min(nvlinks)}-{max(nvlinks)}"
                if min(nvlinks) != max(nvlinks)
                else f"{nvlinks[0]} NVLinks between every pair"
            )
        return "; ".join(parts)

    def serve_until(self, stop: threading.Event, out: TextIO) -> None:
        out.write("\nServing; health changes are printed below (Ctrl-C to stop).\n")
        out.flush()
        last = {name: self.kubelet.devices(name) for name in self.daemon.supervisor.servers}
        counts = {name: len(self.kubelet.updates(name)) for name in last}
        while not stop.wait(0.2):
            for name in list(self.daemon.supervisor.servers):
                updates = self.kubelet.updates(name)
                if len(updates) == counts.get(name, 0):
                    continue
                counts[name] = len(updates)
                now = self.kubelet.devices(name)
                for device_id, state in now.items():
                    before = last.get(name, {}).get(device_id)
                    if before is None or before.health != state.health:
                        out.write(f"  {name} {device_id} -> {state.health}\n")
                last[name] = now
                out.flush()


def _write_container(out: TextIO, response: pb.ContainerAllocateResponse) -> None:
    for key, value in sorted(response.envs.items()):
        out.write(f"  env        {key}={value}\n")
    for mount in response.mounts:
        out.write(f"  mount      {mount.host_path} -> {mount.container_path}\n")
    for spec in response.devices:
        out.write(f"  device     {spec.host_path} -> {spec.container_path} ({spec.permissions})\n")
    for key, value in sorted(response.annotations.items()):
        out.write(f"  annotation {key}={value}\n")
    for cdi in response.cdi_devices:
        out.write(f"  cdi        {cdi.name}\n")


def _devices(count: int, article: str = "") -> str:
    if count == 1:
        return "that device" if article else "1 device"
    return f"{article} {count} devices".strip()
