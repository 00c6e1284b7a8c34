"""`nvdp dra-kubelet-plugin`: the DRA kubelet plugin of the driver `gpu.nvidia.com`, on the device
plugin's inventory, health and CDI code and the kubelet-plugin shell (`nvdp.plugins.kubeletplugin`).

- Pure: `names` (driver, device, socket, CDI names), `devices` (devices with NVIDIA's attributes
  and capacities), `slices` (the ResourceSlices), `claims` (this driver's part of an allocation).
- I/O: `publisher` (keeps slices published), `checkpoint` and `claim_specs` (prepared claims and
  their CDI specs), `prepare` (Node(Un)PrepareResources), `health` (to slices and kubelet),
  `server` (gRPC services, registration info).
- Wiring: `options`, `driver` (the command's parts) and `loop` (its main loop).
"""
