"""The device plugin: `nvdp plugin`, NVIDIA's `nvidia-device-plugin`.

- `daemon` wires it (config, NVML, health, the ledger, metrics); `daemon_settings` maps the config.
- `supervisor` runs one gRPC server per resource and reloads.
- `allocation/` picks preferred devices; `responses` answers Allocate (both pure).
"""
