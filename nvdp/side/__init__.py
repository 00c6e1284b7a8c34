"""The side commands.

- `gfd`: GPU feature discovery's node labels, `nvdp gfd`.
- `configmanager`: the config entry a node label picks, `nvdp config-manager`.
"""
