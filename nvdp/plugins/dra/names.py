"""The names a DRA driver is known by (pure), spelled as NVIDIA's k8s-dra-driver-gpu does: the driver,
its devices, sockets and files, and the CDI names of prepared claims.

- A GPU is `gpu-<minor>`; a MIG device adds its profile (lower case, dots dropped, other non
  `[a-z0-9-]` made `-`), GPU instance profile id and first memory slice: `gpu-0-mig-1g5gb-19-4`.
- nvdp's own: a compute instance sharing its GPU instance adds `-ci<id>` (`gpu-0-mig-1c2g10gb-ci1-14-0`);
  without a placement, GPU and compute instance ids end it (`gpu-0-mig-2g10gb-gi1-ci0`).
- The former form (`gpu-0-mig-19-4-1`, NVIDIA's up to v25.8) is still understood
  (`former_mig_device_name`).
- A prepared claim's devices are CDI devices `k8s.gpu.nvidia.com/claim=<claim uid>-<device>`.
"""

from __future__ import annotations

import re

from nvdp.node.nvml.types import GpuInfo, MigDeviceInfo

DRIVER_NAME = "gpu.nvidia.com"
GPU_TYPE = "gpu"
MIG_TYPE = "mig"
REGISTRATION_SOCKET = f"{DRIVER_NAME}-reg.sock"  # in the kubelet's plugins_registry directory
PLUGIN_SOCKET = "dra.sock"  # in <kubelet plugins directory>/gpu.nvidia.com
CHECKPOINT_FILE = "checkpoint.json"  # beside the plugin socket
PLUGIN_LOCK_FILE = "dra-kubelet-plugin.lock"  # beside the plugin socket: one DRA plugin per node
CDI_VENDOR = f"k8s.{DRIVER_NAME}"
CLAIM_CDI_KIND = f"{CDI_VENDOR}/claim"
_NOT_NAME_CHARACTERS = re.compile(r"[^a-z0-9-]")


def gpu_device_name(gpu: GpuInfo) -> str:
    return f"gpu-{gpu.minor}"


def mig_device_name(gpu: GpuInfo, mig: MigDeviceInfo) -> str:
    profile = _NOT_NAME_CHARACTERS.sub("-", mig.profile.replace(".", "").lower()).strip("-")
    if _shares_its_gpu_instance(mig):
        profile += f"-ci{mig.ci_id}"
    if mig.placement is None:
        return f"{gpu_device_name(gpu)}-mig-{profile}-gi{mig.gi_id}-ci{mig.ci_id}"
    return f"{gpu_device_name(gpu)}-mig-{profile}-{mig.placement.profile_id}-{mig.placement.start}"


def former_mig_device_name(gpu: GpuInfo, mig: MigDeviceInfo) -> str:
    """The name nvdp gave a MIG device before NVIDIA's v25.12 form: `gpu-0-mig-19-4-1` (GPU instance
    profile id, placement start and size), `-ci<id>` added for a compute instance sharing its GPU
    instance, `gpu-0-mig-gi7-ci0` without a placement."""
    if mig.placement is None:
        return f"{gpu_device_name(gpu)}-mig-gi{mig.gi_id}-ci{mig.ci_id}"
    where = mig.placement
    name = f"{gpu_device_name(gpu)}-mig-{where.profile_id}-{where.start}-{where.size}"
    return f"{name}-ci{mig.ci_id}" if _shares_its_gpu_instance(mig) else name


def _shares_its_gpu_instance(mig: MigDeviceInfo) -> bool:
    return mig.profile.split(".", 1)[0].endswith("c")  # "1c.2g.10gb"


def claim_cdi_device(claim_uid: str, device: str) -> str:
    """The CDI device name of one device of a prepared claim (unique across claims)."""
    return f"{claim_uid}-{device}"


def claim_spec_file(claim_uid: str) -> str:
    """The file name of a prepared claim's CDI spec: `k8s.gpu.nvidia.com-claim_<uid>.json`."""
    return f"{CLAIM_CDI_KIND.replace('/', '-')}_{claim_uid}.json"
