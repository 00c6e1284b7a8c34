"""The node's GPUs and what runs on them.

- `nvml`: NVML behind a typed facade; the real library or the simulated node (`nvml.sim`).
- `gpus`: the GPUs as nvdp's commands offer them: devices, resources, the inventory (pure).
- `health`: device health: XID policy, the health state machine, the node's GPU condition.
- `cdi`: CDI specs for the devices handed out, and the node's spec directory.
- `mps`: MPS sharing: the `nvdp mps-control-daemon` command and the plugin's MPS parts.
"""
