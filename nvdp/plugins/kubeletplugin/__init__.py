"""The kubelet-plugin shell, written once for the device plugin (`nvdp.plugins.deviceplugin`) and the DRA
plugin (`nvdp.plugins.dra`), as k8s.io/dynamic-resource-allocation/kubeletplugin is for Go drivers:

- `socket_server`: one gRPC server on one or more unix sockets (stale socket removed, a foreign one refused,
  0600 from bind, is-it-ours, bind errors that say why);
- `serve_loop`: the main loop's skeleton (named wakes, a stop, sockets kept served) and its liveness
  (`loop_watch`), with `listen_retry` for servers that cannot listen yet;
- `registration`: registering with the kubelet, as a device plugin and as a DRA plugin;
- `dir_lock`: one plugin per directory (`DirClaim`: the directory locked for the process's life);
- `rescan`: live GPU / MIG layout changes, which both plugins serve.
"""
