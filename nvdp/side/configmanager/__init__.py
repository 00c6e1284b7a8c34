"""`nvdp config-manager`: point the plugin's config file at the ConfigMap entry that the node label
`nvidia.com/device-plugin.config` selects, as NVIDIA's config-manager does.

- `settings`: NVIDIA's flags and env vars as a frozen `Settings`; `selection` (pure): label to entry,
  default, fallbacks; `files`: a candidate checked with the plugin's loader, the atomic link swap.
- `process`: the plugin process found in /proc and signalled; `manager`: the reconcile loop;
  `sources`: the API's or the mounted ConfigMap copy; `object_watch`: list+watch of Node and ConfigMap.
- `command`: the process (client, watches, applied record, --oneshot); `status`: /metrics,
  /healthz, /readyz; `check`: `nvdp config check FILE...`.
"""
