"""The device-plugin daemon: gRPC servers, kubelet registration, and the supervisor."""
