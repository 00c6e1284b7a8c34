"""The option groups several commands share, declared once and appended to each command's own (as
NVIDIA's `internal/flags` groups are): logging, the NVML backend, the Kubernetes client, the node name,
and `PLUGIN_OPTIONS`: NVIDIA's plugin flags (cmd/nvidia-device-plugin: names, env vars, defaults) plus
nvdp's own, whose targets are fields of `nvdp.config.runtime.PluginOptions`.
"""

from __future__ import annotations

from collections.abc import Callable

from nvdp.base.errors import UnreadableFile
from nvdp.base.files import read_bounded
from nvdp.base.logs import LOG_FORMATS, LOG_LEVELS
from nvdp.config import values as v
from nvdp.config.model import (
    CDI_FEATURE_FLAGS,
    DEVICE_DISCOVERY_STRATEGIES,
    DEVICE_ID_STRATEGIES,
    DEVICE_LIST_STRATEGIES,
    MIG_STRATEGIES,
    RESOURCE_NAME_PREFIX,
    SHARED_DEVICES_ALLOCATION_POLICIES,
    imex_channel_ids,
)
from nvdp.config.options import Option, flag, under
from nvdp.config.runtime import (
    CDI_HOOKS,
    CDI_KINDS,
    POD_DETAILS,
    listen_address,
    nvml_spec,
    rescan_interval,
)


def _alts(choices: tuple[str, ...]) -> str:
    return " | ".join(choices)


def _listed(convert: Callable[[object], object]) -> Callable[[str], object]:
    return lambda text: convert(v.split_list(text))


def _channel_ids(text: str) -> object:
    return imex_channel_ids([int(i) if i.isascii() and i.isdigit() else i for i in v.split_list(text)])


def _resource_name_prefix(text: str) -> str:
    """NVIDIA's --resource-name-prefix: accepted with its default value, refused with any other
    (nvdp's resource names, CDI kinds and labels are built on nvidia.com)."""
    if text != RESOURCE_NAME_PREFIX:
        raise v.InvalidValue(f"{v.show(text)} is not supported by nvdp (only {RESOURCE_NAME_PREFIX})")
    return text


def _qps(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise v.InvalidValue(f"must be a number >= 0, got {v.show(text)}")
    return value


def _burst(text: str) -> int:
    return v.integer(0)(int(text) if text.isascii() and text.isdigit() else text)


LOGGING = (
    flag("--log-format $LOG_FORMAT", v.choice(*LOG_FORMATS), f"log line format: {_alts(LOG_FORMATS)}"),
    flag("--log-level $LOG_LEVEL", v.choice(*LOG_LEVELS), f"lowest level logged: {_alts(LOG_LEVELS)}"),
)
NVML = flag(
    "--nvml $NVDP_NVML",
    nvml_spec,
    "NVML backend: real, sim:NAME (dgx-a100, dgx-a100-mig, pcie-4, dgx-h100, gb200-nvl) or "
    "sim:/path/node.yaml",
)
KUBECONFIG = flag("--kubeconfig $KUBECONFIG", v.string, "kubeconfig file (in-cluster credentials when empty)")
# NVIDIA's client rate limits. Validated, not applied: nvdp's API clients make a few requests a pass
# (docs/gfd.md), far below any limit these could set.
KUBE_API_LIMITS = (
    flag("--kube-api-qps $KUBE_API_QPS", _qps, "API queries per second (not applied)"),
    flag("--kube-api-burst $KUBE_API_BURST", _burst, "API request burst (not applied)"),
)
NODE_NAME = flag("--node-name $NODE_NAME", v.string, "this node's name (its Node object)")
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def pod_namespace(path: str = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The pod's namespace as its service account says ("" when there is none: not in a pod)."""
    try:
        return read_bounded(path, 4096).decode("utf-8", errors="replace").strip()
    except UnreadableFile:
        return ""


PLUGIN_OPTIONS: tuple[Option, ...] = (
    flag(
        "--mig-strategy $MIG_STRATEGY",
        v.choice(*MIG_STRATEGIES),
        f"strategy for exposing MIG devices on GPUs that support it: {_alts(MIG_STRATEGIES)}",
        target="config.flags.mig_strategy",
    ),
    flag(
        "--fail-on-init-error $FAIL_ON_INIT_ERROR",
        v.parse_bool,
        "fail if an error occurs during initialization, otherwise block indefinitely",
        target="config.flags.fail_on_init_error",
    ),
    flag(
        "--driver-root --nvidia-driver-root $NVIDIA_DRIVER_ROOT",
        v.string,
        "root of the NVIDIA driver installation on the host (e.g. / or /run/nvidia/driver)",
        target="config.flags.nvidia_driver_root",
    ),
    flag(
        "--dev-root --nvidia-dev-root $NVIDIA_DEV_ROOT",
        v.string,
        "root path of the NVIDIA device nodes on the host (default: the driver root)",
        target="config.flags.nvidia_dev_root",
    ),
    flag(
        "--pass-device-specs $PASS_DEVICE_SPECS",
        v.parse_bool,
        "pass the list of DeviceSpecs to the kubelet on Allocate()",
        target="config.flags.plugin.pass_device_specs",
    ),
    flag(
        "--device-list-strategy $DEVICE_LIST_STRATEGY",
        _listed(v.list_of(v.choice(*DEVICE_LIST_STRATEGIES), min_items=1)),
        f"how the device list reaches the runtime, one or more of {_alts(DEVICE_LIST_STRATEGIES)}",
        "list",
        target="config.flags.plugin.device_list_strategy",
    ),
    flag(
        "--device-id-strategy $DEVICE_ID_STRATEGY",
        v.choice(*DEVICE_ID_STRATEGIES),
        f"how device IDs are passed to the runtime: {_alts(DEVICE_ID_STRATEGIES)}",
        target="config.flags.plugin.device_id_strategy",
    ),
    flag(
        "--gdrcopy-enabled $GDRCOPY_ENABLED",
        v.parse_bool,
        "start containers that get GPUs with GDRCopy support",
        target="config.flags.gdrcopy_enabled",
    ),
    flag(
        "--gds-enabled $GDS_ENABLED",
        v.parse_bool,
        "start containers that get GPUs with GPUDirect Storage support",
        target="config.flags.gds_enabled",
    ),
    flag(
        "--mofed-enabled $MOFED_ENABLED",
        v.parse_bool,
        "start containers that get GPUs with MOFED support",
        target="config.flags.mofed_enabled",
    ),
    flag(
        "--kubelet-socket $KUBELET_SOCKET",
        v.string,
        "the kubelet's registration socket; plugin sockets go in its directory; empty: serve"
        " without registering (sockets in /var/lib/kubelet/device-plugins)",
        target="config.flags.plugin.kubelet_socket",
        empty="value",
    ),
    flag(
        "--config-file $CONFIG_FILE",
        v.string,
        "path to a v1 config file (YAML or JSON); flags and env vars override it",
        target="runtime.config_file",
    ),
    flag(
        "--cdi-annotation-prefix $CDI_ANNOTATION_PREFIX",
        v.string,
        "prefix of CDI container annotation keys",
        target="config.flags.plugin.cdi_annotation_prefix",
    ),
    flag(
        "--nvidia-cdi-hook-path --nvidia-ctk-path $NVIDIA_CDI_HOOK_PATH $NVIDIA_CTK_PATH",
        v.string,
        "path of the NVIDIA CDI hook in generated CDI specs",
        target="config.flags.plugin.nvidia_ctk_path",
    ),
    flag(
        "--driver-root-ctr-path --container-driver-root $DRIVER_ROOT_CTR_PATH $CONTAINER_DRIVER_ROOT",
        v.string,
        "where the driver root is mounted in this container (for CDI specs and libnvidia-ml)",
        target="config.flags.plugin.container_driver_root",
    ),
    flag(
        "--mps-root $MPS_ROOT",
        v.string,
        "host path where the MPS control daemon creates its files (required for MPS sharing)",
        target="config.flags.mps_root",
    ),
    flag(
        "--device-discovery-strategy $DEVICE_DISCOVERY_STRATEGY",
        v.choice(*DEVICE_DISCOVERY_STRATEGIES),
        f"how devices are discovered: {_alts(DEVICE_DISCOVERY_STRATEGIES)}",
        target="config.flags.device_discovery_strategy",
    ),
    flag(
        "--imex-channel-ids $IMEX_CHANNEL_IDS",
        _channel_ids,
        "IMEX channels to inject ([] or 0)",
        "list",
        target="config.imex.channel_ids",
    ),
    flag(
        "--imex-required $IMEX_REQUIRED",
        v.parse_bool,
        "the IMEX channels must exist",
        target="config.imex.required",
    ),
    flag(
        "--cdi-feature-flags $CDI_FEATURE_FLAGS",
        _listed(v.list_of(v.choice(*CDI_FEATURE_FLAGS))),
        f"NVIDIA's CDI spec generation feature flags: {_alts(CDI_FEATURE_FLAGS)}",
        "list",
        target="config.flags.plugin.cdi_feature_flags",
    ),
    flag(
        "--shared-devices-allocation-policy $SHARED_DEVICES_ALLOCATION_POLICY",
        v.choice(*SHARED_DEVICES_ALLOCATION_POLICIES),
        "preferred allocation of replicas and MIG devices: "
        f"{_alts(SHARED_DEVICES_ALLOCATION_POLICIES)} (least-used or most-used parent first)",
        target="config.flags.plugin.shared_devices_allocation_policy",
    ),
    flag(
        "--cdi-disable-hooks $CDI_DISABLE_HOOKS",
        _listed(v.list_of(v.choice(*CDI_HOOKS))),
        f"createContainer hooks left out of generated CDI specs: {_alts(CDI_HOOKS)}",
        "list",
        target="runtime.cdi_disable_hooks",
    ),
    flag(
        "--resource-name-prefix $RESOURCE_NAME_PREFIX",
        _resource_name_prefix,
        f"prefix of the resource names; nvdp supports only {RESOURCE_NAME_PREFIX}",
        target="runtime.resource_name_prefix",
    ),
    # nvdp's own
    flag(
        "--cdi-spec-dir $CDI_SPEC_DIR",
        v.string,
        "directory the CDI specs are written to (with a cdi-annotations / cdi-cri strategy)",
        target="runtime.cdi_spec_dir",
    ),
    flag(
        "--cdi-kind $CDI_KIND",
        v.choice(*CDI_KINDS),
        f"kind of the GPU CDI devices in specs and answers: {_alts(CDI_KINDS)} (nvidia-ctk's names)",
        target="runtime.cdi_kind",
    ),
    *under("runtime", (NVML, *LOGGING)),
    # The Node this plugin reports on (events, the GPU health condition) and how it reaches the API.
    *under("runtime", (KUBECONFIG, NODE_NAME)),
    flag(
        "--metrics-address $METRICS_ADDRESS",
        listen_address,
        'listen address of /metrics, /healthz and /readyz ("" disables)',
        target="runtime.metrics_address",
        empty="value",
    ),
    flag(
        "--pod-detail $POD_DETAIL",
        v.choice(*POD_DETAILS),
        "who sees the pods holding devices (namespace, pod, container, UID) on /allocations and"
        f" nvdp_device_allocated: {_alts(POD_DETAILS)} (local: loopback clients only, as nvdp status)",
        target="runtime.pod_detail",
    ),
    flag(
        "--device-rescan-interval $DEVICE_RESCAN_INTERVAL",
        rescan_interval,
        'how often MIG layouts and GPUs are re-read to serve changes without a signal ("10s"; 0 disables)',
        "seconds",
        target="runtime.device_rescan_interval",
    ),
    flag(
        "--strict-config $STRICT_CONFIG",
        v.parse_bool,
        "refuse a config file with unknown keys (by default each one is a warning and is ignored)",
        target="runtime.strict_config",
    ),
)
