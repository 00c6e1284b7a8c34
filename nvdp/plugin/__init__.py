"""The device plugin's daemon: its gRPC servers, its registrations with the kubelet, and the
supervisor (on the kubelet-plugin shell both plugins share: `nvdp.kubeletplugin`)."""
