"""What `nvdp plugin` accepts: its rules across settings, MPS's limits that the config alone shows, and
what this version supports.

One list, checked once on the resolved config (`nvdp.config.options.resolve`), every problem one line
naming the setting; the chart's guards (charts/nvidia-device-plugin/templates/validation.yml) refuse
the same values with the same words. These are rules on the config's form; what a node *is* never
makes a config wrong here (`nvdp.node.gpus.misfits`). Commands that only read part of the config check only
that part's settings: `gfd_problems` asks for no MPS root, which gfd never uses.
"""

from __future__ import annotations

from nvdp.config.model import CDI_FEATURE_FLAGS, COHERENT_ANNOTATIONS_FLAG, DRA_ALL, DRA_NONE, Config

# Replicas per shared device: far above any real time-slicing use, and low enough that a node's
# ListAndWatch list stays small (the exact bound, from the IDs, is checked where resources are built:
# nvdp.node.gpus.list_size.MAX_LIST_AND_WATCH_BYTES).
MAX_REPLICAS_PER_DEVICE = 1024
MAX_MPS_CLIENTS = 48  # MPS clients per GPU from compute capability 7.5 (Turing) on

TEGRA_UNSUPPORTED = (
    "--device-discovery-strategy / DEVICE_DISCOVERY_STRATEGY: tegra is not supported by nvdp "
    "(accepted here: auto, nvml)"
)
# NVIDIA's plugin refuses vfio too (only its gfd takes it); nvdp's gfd takes it (nvdp.side.gfd.options).
VFIO_PLUGIN = (
    "--device-discovery-strategy / DEVICE_DISCOVERY_STRATEGY: vfio is for gpu-feature-discovery only; "
    "the device plugin accepts auto, nvml"
)
COHERENT_ANNOTATIONS_UNSUPPORTED = (
    f"--cdi-feature-flags / CDI_FEATURE_FLAGS / flags.plugin.cdiFeatureFlags: {COHERENT_ANNOTATIONS_FLAG} "
    "is not supported by nvdp (nvdp does not read a GPU's memory coherence; accepted here: "
    f"{', '.join(f for f in CDI_FEATURE_FLAGS if f != COHERENT_ANNOTATIONS_FLAG)})"
)


def plugin_problems(config: Config, *, runs_the_plugin: bool = True) -> list[str]:
    """Every reason the plugin refuses `config` (NVIDIA's validateFlags plus nvdp's support limits).
    `runs_the_plugin=False` leaves out the settings only the running plugin needs (an MPS root, CDI
    feature flags) and those only it refuses (vfio discovery, which gfd takes). An empty kubelet
    socket is no problem: the plugin then serves without registering, as NVIDIA's."""
    flags = config.flags
    problems = []
    if flags.device_discovery_strategy == "tegra":
        problems.append(TEGRA_UNSUPPORTED)
    if runs_the_plugin and flags.device_discovery_strategy == "vfio":
        problems.append(VFIO_PLUGIN)
    if runs_the_plugin and COHERENT_ANNOTATIONS_FLAG in flags.plugin.cdi_feature_flags:
        problems.append(COHERENT_ANNOTATIONS_UNSUPPORTED)
    replicated = config.sharing.replicated
    if replicated is not None:
        section = "timeSlicing" if config.sharing.strategy == "time-slicing" else "mps"
        for n, entry in enumerate(replicated.resources):
            if entry.replicas > MAX_REPLICAS_PER_DEVICE:
                problems.append(
                    f"sharing.{section}.resources[{n}].replicas: {entry.replicas} is over nvdp's limit "
                    f"of {MAX_REPLICAS_PER_DEVICE} replicas per device (the kubelet could not receive "
                    "the device list)"
                )
    if config.sharing.strategy == "mps":
        if flags.mig_strategy == "mixed":
            problems.append(
                'sharing.mps: MPS sharing is not supported with MIG strategy "mixed" '
                "(--mig-strategy / MIG_STRATEGY / flags.migStrategy)"
            )
        if runs_the_plugin and not flags.mps_root:
            problems.append(
                "sharing.mps: MPS sharing needs an MPS root (--mps-root / MPS_ROOT / flags.mpsRoot)"
            )
    return problems + mps_problems(config) + dra_problems(config)


_ONE_WAY = "a GPU is shared by capacity or partitioned by MIG, not both"


def dra_problems(config: Config) -> list[str]:
    """A GPU that `dra.consumableCapacity` and `dra.dynamicMig` both name (as written: an index and
    the same GPU's UUID only meet on the node, `nvdp.node.gpus.inventory.dra_sharing`)."""
    capacity, dynamic = config.dra.consumable_capacity, config.dra.dynamic_mig
    if DRA_NONE in (capacity, dynamic):
        return []
    if capacity == DRA_ALL and dynamic == DRA_ALL:
        return [f'dra: consumableCapacity and dynamicMig are both "all"; {_ONE_WAY}']
    if capacity == DRA_ALL or dynamic == DRA_ALL:
        listed, other = (
            ("dynamicMig", "consumableCapacity")
            if capacity == DRA_ALL
            else ("consumableCapacity", "dynamicMig")
        )
        return [f'dra.{listed}: names GPUs while dra.{other} is "all"; {_ONE_WAY}']
    both = [ref for ref in dynamic if ref in capacity]
    return [f"dra.dynamicMig: GPU {ref} is also in dra.consumableCapacity; {_ONE_WAY}" for ref in both]


def mps_problems(config: Config) -> list[str]:
    """MPS refusals that the config alone shows (what a node's GPUs refuse: `nvdp.node.gpus.inventory`)."""
    mps = config.sharing.mps
    if mps is None:
        return []
    problems = []
    for n, entry in enumerate(mps.resources):
        where = f"sharing.mps.resources[{n}]"
        if entry.replicas > MAX_MPS_CLIENTS:
            problems.append(
                f"{where}.replicas: {entry.replicas} is more than MPS supports "
                f"({MAX_MPS_CLIENTS} clients per GPU)"
            )
        if isinstance(entry.devices, tuple):
            for ref in entry.devices:
                if ":" in ref or ref.startswith("MIG-"):
                    problems.append(f"{where}.devices: {ref!r} is a MIG device; MPS shares whole GPUs only")
    return problems


def gfd_problems(config: Config) -> list[str]:
    """Every reason `nvdp gfd` refuses `config`: the plugin's rules on what the labels describe (sharing,
    MIG strategy, discovery). gfd only describes the node, so it needs no MPS root (NVIDIA's gfd labels
    an MPS config without one; the chart's GFD pod sets none)."""
    return plugin_problems(config, runs_the_plugin=False)


# What flags or env vars may supply when a file leaves it out, so a file alone is not refused for it.
FILE_ASSUMED_MPS_ROOT = "/run/nvidia/mps"


def file_problems(config: Config) -> list[str]:
    """`plugin_problems` of a config file on its own (`nvdp config check`, the config-manager's
    candidates): every rule on what the file states; none that asks for a setting the plugin's
    flags or env vars may supply instead (an MPS root: --mps-root / MPS_ROOT)."""
    from dataclasses import replace

    flags = replace(config.flags, mps_root=config.flags.mps_root or FILE_ASSUMED_MPS_ROOT)
    return plugin_problems(replace(config, flags=flags))
