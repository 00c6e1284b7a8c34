"""The built-in simulated nodes (`--nvml sim:NAME`), each a node description in the node file's schema
(docs/simulated-nodes.md), validated by the same parser as a node file (`nvdp.node.nvml.sim.spec`).

Python data rather than YAML files: loading a built-in node imports no YAML parser (yaml's import alone
was 13 ms of CPU, a tenth of what a simulated plugin's start-up costs above the floor's). Read only.
"""

from __future__ import annotations

from collections.abc import Mapping

_DRIVER = {"driver_version": "550.54.15", "cuda_driver_version": "12.4"}
_DGX_A100_BUS_IDS = [f"00000000:{bus}:00.0" for bus in ("07", "0F", "47", "4E", "87", "90", "B7", "BD")]
_DGX_A100_PCIE = [
    {"gpus": [0, 1], "level": "MULTIPLE"},
    {"gpus": [2, 3], "level": "MULTIPLE"},
    {"gpus": [4, 5], "level": "MULTIPLE"},
    {"gpus": [6, 7], "level": "MULTIPLE"},
]

PROFILES: Mapping[str, Mapping[str, object]] = {
    # DGX A100: 8 x A100-SXM4-40GB, every GPU with 12 NVLinks into the NVSwitch fabric, two CPU sockets.
    # GPUs 0-3 hang off CPU 0 (NUMA node 0), 4-7 off CPU 1; each pair (0-1, 2-3, ...) shares a PCIe
    # switch tree. MIG capable, MIG disabled.
    "dgx-a100": {
        **_DRIVER,
        "gpus": [
            {
                "name": "NVIDIA A100-SXM4-40GB",
                "count": 8,
                "memory_mib": 40960,
                "compute_capability": "8.0",
                "numa_nodes": 2,
                "mig_capable": True,
                "pci_bus_ids": _DGX_A100_BUS_IDS,
            }
        ],
        "nvswitch": 12,
        "pcie": _DGX_A100_PCIE,
    },
    # The dgx-a100 node (same GPU UUIDs) with MIG enabled on GPUs 0-3, each with another layout.
    # GPUs 4-7 stay whole.
    "dgx-a100-mig": {
        **_DRIVER,
        "uuid_seed": "dgx-a100",
        "gpus": [
            {
                "name": "NVIDIA A100-SXM4-40GB",
                "numa": 0,
                "pci_bus_ids": _DGX_A100_BUS_IDS[0:1],
                "mig": ["1g.5gb"] * 7,
            },
            {
                "name": "NVIDIA A100-SXM4-40GB",
                "numa": 0,
                "pci_bus_ids": _DGX_A100_BUS_IDS[1:2],
                "mig": ["2g.10gb"] * 3,
            },
            {
                "name": "NVIDIA A100-SXM4-40GB",
                "numa": 0,
                "pci_bus_ids": _DGX_A100_BUS_IDS[2:3],
                "mig": ["3g.20gb", "2g.10gb", "1g.5gb"],
            },
            {
                "name": "NVIDIA A100-SXM4-40GB",
                "numa": 0,
                "pci_bus_ids": _DGX_A100_BUS_IDS[3:4],
                "mig": ["7g.40gb"],
            },
            {
                "name": "NVIDIA A100-SXM4-40GB",
                "count": 4,
                "numa": 1,
                "pci_bus_ids": _DGX_A100_BUS_IDS[4:],
            },
        ],
        "nvswitch": 12,
        "pcie": _DGX_A100_PCIE,
    },
    # The dgx-a100 node (same GPU UUIDs) with MIG mode on for every GPU and no MIG device yet: the
    # state a node starts in whose MIG devices are made per claim (`dra.dynamicMig`).
    "dgx-a100-mig-empty": {
        **_DRIVER,
        "uuid_seed": "dgx-a100",
        "gpus": [
            {
                "name": "NVIDIA A100-SXM4-40GB",
                "count": 8,
                "numa_nodes": 2,
                "pci_bus_ids": _DGX_A100_BUS_IDS,
                "mig": [],
            }
        ],
        "nvswitch": 12,
        "pcie": _DGX_A100_PCIE,
    },
    # DGX H100: 8 x H100 80GB HBM3, every GPU with 18 NVLinks into the NVSwitch fabric, two CPU
    # sockets (GPUs 0-3 on NUMA node 0, 4-7 on NUMA node 1). MIG capable, MIG disabled.
    "dgx-h100": {
        **_DRIVER,
        "gpus": [
            {
                "name": "NVIDIA H100 80GB HBM3",
                "count": 8,
                "memory_mib": 81559,
                "compute_capability": "9.0",
                "numa_nodes": 2,
                "mig_capable": True,
                "pci_bus_ids": [
                    "00000000:18:00.0",
                    "00000000:2A:00.0",
                    "00000000:3A:00.0",
                    "00000000:5D:00.0",
                    "00000000:9A:00.0",
                    "00000000:AB:00.0",
                    "00000000:BA:00.0",
                    "00000000:DB:00.0",
                ],  # fmt: skip
            }
        ],
        "nvswitch": 18,
    },
    # One compute tray of a GB200 NVL72 rack: 2 Grace CPUs with 2 GB200 GPUs each (GPUs 0-1 on NUMA
    # node 0, 2-3 on NUMA node 1), every GPU with 18 NVLinks into the rack's NVSwitch trays and
    # registered with the rack's multi-node NVLink fabric: one NVLink domain (cluster UUID), one
    # clique, so the node is labelled nvidia.com/gpu.clique. MIG capable, MIG disabled.
    "gb200-nvl": {
        "driver_version": "570.133.20",
        "cuda_driver_version": "12.8",
        "gpus": [
            {
                "name": "NVIDIA GB200",
                "count": 4,
                "numa_nodes": 2,
                "mig_capable": True,
                "pci_bus_ids": [
                    "00000008:01:00.0",
                    "00000009:01:00.0",
                    "00000018:01:00.0",
                    "00000019:01:00.0",
                ],  # fmt: skip
            }
        ],
        "nvswitch": True,
        "fabric": {"cluster_uuid": "5ad4a1c2-3f0e-4b8d-9c61-7e2f40b1d9a3", "clique_id": 32766},
    },
    # A PCIe server: 4 x L40S, NVLink bridges between 0-1 and 2-3 only. GPUs 0-1 share a host bridge
    # on CPU 0 (NUMA node 0), 2-3 one on CPU 1 (NUMA node 1); the pairs talk across the CPUs.
    "pcie-4": {
        **_DRIVER,
        "gpus": [
            {
                "name": "NVIDIA L40S",
                "count": 4,
                "memory_mib": 46068,
                "compute_capability": "8.9",
                "numa": [0, 0, 1, 1],
                "pci_bus_ids": [
                    "00000000:17:00.0",
                    "00000000:31:00.0",
                    "00000000:98:00.0",
                    "00000000:B1:00.0",
                ],  # fmt: skip
            }
        ],
        "nvlinks": [{"gpus": [0, 1], "links": 4}, {"gpus": [2, 3], "links": 4}],
        "pcie": [{"gpus": [0, 1], "level": "HOSTBRIDGE"}, {"gpus": [2, 3], "level": "HOSTBRIDGE"}],
    },
}
