"""`nvdp config-manager`: follow the node label `nvidia.com/device-plugin.config` and point the
plugin's config file at the selected ConfigMap entry, as NVIDIA's config-manager does.

- `settings`: NVIDIA's flags and env vars, validated into a frozen `Settings`.
- `selection`: the pure part: ConfigMap entries in a directory, label -> entry (default config, the
  fallback strategies named / single / empty).
- `files`: validating a candidate with the plugin's own loader and support rules, the atomic
  symlink swap, the copies of entries served by the API.
- `process`: finding the plugin process by name in /proc and signalling it.
- `manager`: the reconcile loop (label changes from the Node watch, ConfigMap content changes
  through inotify on the mounted directory or from the ConfigMap watch), problems as one log line
  plus an Event on the Node, failed applies retried with backoff, the applied entry recorded on the
  Node for restarted pods.
- `sources`: which copy of the ConfigMap a pass reads: the API's (--configmap-name) or the mounted
  one, without taking turns between them.
- `object_watch`: the list+watch of the own Node and of the ConfigMap (resumed, re-listed with
  client-go's backoff, dropped when silent, never stopped).
- `command`: the process: the Kubernetes client, the watch threads, the Node annotation record,
  --oneshot.
- `status`: optional /metrics, /healthz, /readyz (`--metrics-address`).
- `check`: `nvdp config check FILE...`, strict validation, the plugin's support rules, and the
  resources a file would produce.
"""
