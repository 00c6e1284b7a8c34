"""The simulation around nvdp's plugins, for `nvdp simulate`, the tests and the benchmarks.

- `kubelet/`: the kubelet's side of the device-plugin and DRA APIs.
- `dra/`: the scheduler's allocation of claims and an in-memory resource.k8s.io.
- `simulate`, `simulate_dra`, `simulate_shares`: the `nvdp simulate` command.

The simulated GPUs are an NVML backend, `nvdp.node.nvml.sim`. No production command imports this package.
"""
