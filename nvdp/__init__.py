"""nvdp: a Kubernetes NVIDIA GPU device plugin, drop-in compatible with NVIDIA/k8s-device-plugin."""

__version__ = "0.1.0"
