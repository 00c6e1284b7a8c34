"""`nvdp config-manager`: point the plugin's config file at the ConfigMap entry that the node label
`nvidia.com/device-plugin.config` selects, as NVIDIA's config-manager does.

- `settings`: NVIDIA's flags and env vars, validated into a frozen `Settings`.
- `selection` (pure): label -> entry; default config; fallbacks named / single / empty.
- `files`: a candidate checked with the plugin's loader and rules; the atomic symlink swap.
- `process`: finding the plugin process by name in /proc and signalling it.
- `manager`: the reconcile loop; problems as a log line plus a Node Event; retries with backoff.
- `sources`: which copy of the ConfigMap a pass reads, the API's or the mounted one.
- `object_watch`: list+watch of the own Node and of the ConfigMap, resumed, never stopped.
- `command`: the process (client, watch threads, applied record, --oneshot); `status`: optional
  /metrics, /healthz, /readyz; `check`: `nvdp config check FILE...`.
"""
