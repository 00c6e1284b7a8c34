"""The node's GPUs as nvdp's commands offer them.

- `devices`: device records from NVML facts; `resources`: MIG strategy, names, replicas (pure).
- `inventory`: config + GPUs -> resources and misfits, every command's one builder (pure).
- `misfits`, `misfit_report`: node facts that keep part of a config from applying, and their report.
- `unusable`: devices left out; `list_size`: the kubelet's limit on a resource's list (pure).
"""
