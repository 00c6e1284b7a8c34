"""What the kubelet talks to, and what the plugins publish.

- `kubeletplugin`: the kubelet-plugin shell both plugins stand on (socket, serve loop, registration).
- `deviceplugin`: the device plugin, `nvdp plugin`.
- `dra`: the DRA kubelet plugin, `nvdp dra-kubelet-plugin`.
- `handoff`: one GPU, one API: the hand-over between the two plugins.
- `ledger`: which pod holds which device.
- `metrics`: /metrics, /healthz, /readyz, /allocations.
- `uninstall`: what a stopping plugin leaves on its node at uninstall; `nvdp delete-daemonsets`.
"""
