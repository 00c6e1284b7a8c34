"""The allocation ledger: which pod's container holds which device, from the kubelet's PodResources
API. `podresources`: the client; `checkpoint`: the pods' UIDs from the kubelet's device checkpoint;
`ledger`: when to read, what was read; `locate`: which GPU a device ID stands for; `types`: the record;
`document`: the record as the /allocations page; `report`: that page as text (`nvdp status`,
`nvdp simulate`). Nothing is imported here: `nvdp status` reads the page without gRPC."""
