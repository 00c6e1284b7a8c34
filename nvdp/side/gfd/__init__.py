"""GPU feature discovery: `nvdp gfd`, NVIDIA's node labels from the plugin's own resource model.

- `labels`: the label set (pure), from NVML facts and the plugin's `Resource` list.
- `discover`: one labelling pass over an NVML backend and a resolved config.
- `output`: the NFD feature file (atomic, rewritten on change) and the NodeFeature object.
- `options`: `nvdp gfd` flags and env vars (NVIDIA's), resolved with the config file's `flags.gfd`.
- `run`: the loop (sleep interval, SIGHUP reload, stop); misfits reported once each (a WARNING line,
  a Node event), a failed write retried each pass with the last labels kept: no node fact ends it.
"""
