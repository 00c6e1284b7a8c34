"""The names a DRA driver is known by (pure): the driver, its devices, its sockets and files, and the
CDI names of prepared claims, as NVIDIA's DRA driver (k8s-dra-driver-gpu) spells them.

Devices are named after the GPU's minor number: `gpu-0`; a MIG device after its GPU and its GPU
instance's profile id and placement: `gpu-0-mig-19-4-1` (a compute instance that shares its GPU
instance adds `-ci<id>`; where NVML gives no placement: `gpu-0-mig-gi7-ci0`). A prepared claim's
devices are CDI devices `k8s.gpu.nvidia.com/claim=<claim uid>-<device>`, in a spec file of that claim.
"""

from __future__ import annotations

from nvdp.nvml.types import GpuInfo, MigDeviceInfo

DRIVER_NAME = "gpu.nvidia.com"
GPU_TYPE = "gpu"
MIG_TYPE = "mig"
REGISTRATION_SOCKET = f"{DRIVER_NAME}-reg.sock"  # in the kubelet's plugins_registry directory
PLUGIN_SOCKET = "dra.sock"  # in <kubelet plugins directory>/gpu.nvidia.com
CHECKPOINT_FILE = "checkpoint.json"  # beside the plugin socket
CDI_VENDOR = f"k8s.{DRIVER_NAME}"
CLAIM_CDI_KIND = f"{CDI_VENDOR}/claim"


def gpu_device_name(gpu: GpuInfo) -> str:
    return f"gpu-{gpu.minor}"


def mig_device_name(gpu: GpuInfo, mig: MigDeviceInfo) -> str:
    if mig.placement is None:
        return f"{gpu_device_name(gpu)}-mig-gi{mig.gi_id}-ci{mig.ci_id}"
    where = mig.placement
    name = f"{gpu_device_name(gpu)}-mig-{where.profile_id}-{where.start}-{where.size}"
    compute_instance_profile = mig.profile.split(".", 1)[0].endswith("c")  # "1c.2g.10gb"
    return f"{name}-ci{mig.ci_id}" if compute_instance_profile else name


def claim_cdi_device(claim_uid: str, device: str) -> str:
    """The CDI device name of one device of a prepared claim (unique across claims)."""
    return f"{claim_uid}-{device}"


def claim_spec_file(claim_uid: str) -> str:
    """The file name of a prepared claim's CDI spec: `k8s.gpu.nvidia.com-claim_<uid>.json`."""
    return f"{CLAIM_CDI_KIND.replace('/', '-')}_{claim_uid}.json"
