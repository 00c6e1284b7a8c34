"""MPS sharing: the `nvdp mps-control-daemon` side command and the plugin's MPS parts.

- `layout`: where things live under the MPS root (pipe, log, ready marker, shm).
- `plan`: pure rules: which daemons a node needs, their default limits, per-container limits,
  the config and node refusals.
- `control`: one `nvidia-cuda-mps-control` invocation per command.
- `controller`: the control daemon's main loop (start, health check, restart, reload, teardown).
- `ready`: the plugin's view: an MPS resource is served only while its ready marker exists.
- `allocate`: what Allocate adds to a container's answer for an MPS resource.
- `command`: the `nvdp mps-control-daemon` command line.
"""
