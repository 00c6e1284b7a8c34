"""Stand-ins for the cluster side of DRA, for the tests, `nvdp simulate --api dra` and the benchmarks:
`scheduler` (the scheduler's allocation of a claim, with the selector forms NVIDIA's DeviceClasses
use) and `api` (an in-memory resource.k8s.io for the simulation). Not used by the plugin itself."""
