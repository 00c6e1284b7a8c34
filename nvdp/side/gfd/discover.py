"""One labelling pass: NVML facts and the plugin's resources to labels (a thin shell over `labels`).

- Resources come from the plugin's builder on the same config (`nvdp.node.gpus.inventory`), so the labels
  describe exactly what the plugin advertises.
- What of the config this node does not fit is left out of the labels, as of the resources, and
  returned as a misfit for the caller to report; the rest of the node is labelled.
- Under the single MIG strategy, a layout NVIDIA's gfd calls invalid gets NVIDIA's labels for it
  (`nvdp.side.gfd.labels.invalid_mig_labels`).
- `nvidia.com/gpu.clique` comes from `nvdp.side.gfd.clique`; a GPU whose fabric cannot be read costs the
  node that label alone (one warning), where NVIDIA's gfd fails the whole pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from nvdp.base.errors import NvdpError, NvmlError, UnreadableFile
from nvdp.base.files import read_bounded
from nvdp.base.logs import log_event
from nvdp.config import Config
from nvdp.node.gpus.inventory import ResourceRules
from nvdp.node.gpus.resources import NodeResources
from nvdp.node.nvml.types import GpuFabric, GpuInfo, Nvml
from nvdp.side.gfd.clique import CLIQUE_LABEL, clique_labels
from nvdp.side.gfd.labels import (
    GPU_RESOURCE,
    MACHINE_UNKNOWN,
    GpuRenames,
    LabelResult,
    NodeFacts,
    invalid_mig_labels,
    majority_model,
    node_labels,
    sanitise,
    single_strategy_problem,
)

log = logging.getLogger(__name__)

SYSFS_PCI = Path("/sys/bus/pci/devices")
# PCI class codes of NVIDIA GPUs: VGA controller (display enabled) and 3D controller (compute only).
_PCI_MODES = {"0x0300": "graphics", "0x0302": "compute"}
MACHINE_TYPE_MAX_BYTES = 4096
LABEL_VALUE_MAX = 63


def plugin_resources(gpus: Sequence[GpuInfo], config: Config) -> tuple[NodeResources, frozenset[str]]:
    """What the plugin would advertise for these GPUs and config (with the misfits: what of the config
    does not fit this node), and the renamed resource names. Raises ConfigError for a config the
    plugin refuses."""
    rules = ResourceRules.of(config)
    return rules.build(gpus), frozenset(r.rename for r in rules.sharing if r.rename)


def read_machine_type(path: str) -> str:
    """The DMI product name (e.g. /sys/class/dmi/id/product_name: one short line), "unknown" with
    one WARNING when the file cannot be read (as NVIDIA's gfd does) or does not hold a plausible
    product name: more than one line, binary, or longer than a label value once sanitised. Only a
    regular file of at most 4 KiB is read (a sysfs attribute is at most a page)."""
    if not path:
        return MACHINE_UNKNOWN
    try:
        content = read_bounded(path, MACHINE_TYPE_MAX_BYTES)
    except UnreadableFile as error:
        log_event(log, logging.WARNING, "cannot read the machine type", file=path, error=error.reason)
        return MACHINE_UNKNOWN
    try:
        text = content.decode("utf-8").strip()
        problem = _implausible_machine_type(text)
    except UnicodeDecodeError:
        text, problem = "", "not UTF-8 text"
    if problem:
        log_event(log, logging.WARNING, "not a machine type; labelled unknown", file=path, reason=problem)
        return MACHINE_UNKNOWN
    return text or MACHINE_UNKNOWN


def _implausible_machine_type(text: str) -> str | None:
    """Why stripped text is no DMI product name, in words; None when it may be one."""
    if "\n" in text or "\r" in text:
        return "more than one line"
    if not text.isprintable():
        return "holds characters that are not text"
    value = sanitise(text).strip("-_.")  # as `nvdp.side.gfd.labels.sanitise_machine` makes it a label value
    if len(value) > LABEL_VALUE_MAX:
        return f"longer than a label value ({LABEL_VALUE_MAX} characters)"
    if text and not value:
        return "holds no character a label value can carry"
    return None


def pci_mode(pci_bus_id: str, sysfs: Path = SYSFS_PCI) -> str:
    """`compute` / `graphics` from the GPU's PCI class in sysfs; `unknown` when unreadable."""
    domain, _, rest = pci_bus_id.lower().partition(":")
    address = f"{domain[-4:]}:{rest}"
    try:
        klass = (sysfs / address / "class").read_text().strip()
    except OSError:
        return "unknown"
    return _PCI_MODES.get(klass[:6], "unknown")


def discover(
    nvml: Nvml,
    config: Config,
    *,
    machine_type_file: str,
    mode_of: Callable[[GpuInfo], str] | None = None,
) -> LabelResult:
    """Labels for the node behind an initialised NVML. Raises NvdpError (bad config, NVML failure)."""
    gpus = nvml.gpus()
    facts = NodeFacts(
        gpus=tuple(gpus),
        driver_version=nvml.driver_version(),
        cuda_driver_version=nvml.cuda_driver_version(),
        machine=read_machine_type(machine_type_file),
        modes={g.uuid: mode_of(g) for g in gpus} if mode_of else None,
    )
    if not gpus:
        return LabelResult({}, ("no GPUs found on the node; no labels generated",))
    strategy = config.flags.mig_strategy
    built, renamed = plugin_resources(gpus, config)
    invalid = single_strategy_problem(gpus, config.sharing.strategy) if strategy == "single" else None
    try:
        if invalid is not None:
            result = invalid_mig_labels(facts, invalid, whole_gpu_sharing=whole_gpu_sharing(gpus, config))
        else:
            result = node_labels(
                facts,
                built.resources,
                mig_strategy=strategy,
                sharing_strategy=config.sharing.strategy,
                renamed=renamed,
                gpu_renames=gpu_renames(config),
            )
    except ValueError as error:
        raise NvdpError(f"cannot label the node: {error}") from error
    fabric, fabric_warnings = _clique(nvml, gpus)
    return replace(
        result,
        labels={**result.labels, **fabric},
        warnings=(*result.warnings, *fabric_warnings),
        misfits=built.misfits,
    )


def _clique(nvml: Nvml, gpus: Sequence[GpuInfo]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The clique label from every GPU's fabric registration (a GPU already failing, `fault`, has
    none); a GPU whose registration cannot be read leaves the node without the label."""
    fabrics: list[tuple[int, GpuFabric | None]] = []
    for gpu in gpus:
        if gpu.fault is not None:
            continue
        try:
            fabrics.append((gpu.index, nvml.gpu_fabric(gpu.uuid)))
        except NvmlError as error:
            return {}, (
                f"cannot read the NVLink fabric of GPU {gpu.index}: {error}; no {CLIQUE_LABEL} label",
            )
    return clique_labels(fabrics)


def gpu_renames(config: Config) -> GpuRenames:
    """Where the active sharing section advertises `nvidia.com/gpu`'s GPUs under other names."""
    replicated = config.sharing.replicated
    if replicated is None:
        return GpuRenames()
    targets = frozenset(r.rename for r in replicated.resources if r.name == GPU_RESOURCE and r.rename)
    return GpuRenames(targets, replicated.rename_by_default)


def whole_gpu_sharing(gpus: Sequence[GpuInfo], config: Config) -> str:
    """`gpu.sharing-strategy` as NVIDIA's whole-GPU labels give it: the config's strategy when its first
    entry for `nvidia.com/gpu` time-slices it (replicas > 1) and a MIG-disabled GPU of the labelled
    (majority) model exists; else `none`."""
    replicated = config.sharing.replicated
    if replicated is None or config.sharing.strategy != "time-slicing":
        return "none"
    entry = next((r for r in replicated.resources if r.name == GPU_RESOURCE), None)
    model = majority_model(gpus)
    whole = any(g.name == model and not g.mig_enabled for g in gpus)
    return config.sharing.strategy if entry is not None and entry.replicas > 1 and whole else "none"


def describe_labels(nvml: Nvml, config: Config) -> str:
    """The labels `nvdp gfd` would give this node, as an indented block (for `nvdp simulate`)."""
    from nvdp.side.gfd.labels import format_labels

    try:
        result = discover(nvml, config, machine_type_file="")
    except NvdpError as error:
        return f"  cannot label the node: {error}\n"
    lines = [f"  {line}\n" for line in format_labels(result.labels).splitlines()]
    return "".join(lines + [f"  warning: {w}\n" for w in result.warnings])
