"""What every nvdp process stands on; nothing here knows GPUs.

- Files and directories: `files`, `dirs`, `dir_watch`, `lock_file`; parsing bounded in size: `bounded`.
- Processes: `logs`, `signals`, `backoff`, `ssl_block`, the timers tests shorten (`timers`).
- Units: `units`; the HTTP endpoint and its Prometheus text: `http_endpoint`, `promtext`.
- The one error tree, every NvdpError class: `errors`.
"""
