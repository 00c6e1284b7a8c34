"""`nvdp dra-kubelet-plugin`: the DRA kubelet plugin of the driver `gpu.nvidia.com`, built on the same
inventory, health and CDI code as the device plugin, and on the same kubelet-plugin shell
(`nvdp.kubeletplugin`: sockets, main-loop skeleton, registration, directory claim).

Pure parts: `names` (driver, device, socket and CDI names), `devices` (this node's devices with
NVIDIA's attributes and capacities), `slices` (the ResourceSlices that publish them), `claims` (what
of a ResourceClaim's allocation is this driver's on this node). I/O: `publisher` (keeps the slices
published), `checkpoint` and `claim_specs` (prepared claims and their CDI specs on disk), `prepare`
(NodePrepareResources / NodeUnprepareResources), `health` (device health to the slices and the
kubelet), `server` (the DRA gRPC services and the registration's info), `options`, `driver` (the command's
wiring) and `loop` (its main loop).
"""
