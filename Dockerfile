# syntax=docker/dockerfile:1
#
# The nvdp device plugin image.
#
#   docker build -t REGISTRY/nvdp:0.1.0 .
#
# Two stages: `build` turns the project and every dependency into wheels (all of them ship
# manylinux wheels, so no compiler is needed even there); the final stage installs only those
# wheels, offline, into a clean slim image. The wheels reach the final stage through a build
# mount, so they never become a layer of the image.

# One Python version: the one CI tests with (.ci/run refuses another) and mypy/ruff target
# (pyproject.toml). Change all three together.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# Only what `pip wheel .` reads; .dockerignore keeps everything else out of the context.
COPY pyproject.toml README.md ./
COPY nvdp ./nvdp
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="nvdp" \
      org.opencontainers.image.description="Kubernetes NVIDIA GPU device plugin in Python, a drop-in for NVIDIA/k8s-device-plugin" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels nvdp

# NVIDIA's images hold their binaries in /usr/bin, and NVIDIA's manifests name them there
# (`command: ["/usr/bin/gpu-feature-discovery"]`, PROCESS_TO_SIGNAL=/usr/bin/mps-control-daemon, the
# DRA driver's /usr/bin/gpu-kubelet-plugin). pip puts the console scripts in /usr/local/bin: each one
# is linked from /usr/bin, so those paths run nvdp (the config-manager follows the links when it looks
# for the process to signal). The build fails here if a link leads nowhere.
RUN ln -s /usr/local/bin/nvidia-device-plugin /usr/bin/nvidia-device-plugin \
    && ln -s /usr/local/bin/gpu-feature-discovery /usr/bin/gpu-feature-discovery \
    && ln -s /usr/local/bin/config-manager /usr/bin/config-manager \
    && ln -s /usr/local/bin/mps-control-daemon /usr/bin/mps-control-daemon \
    && ln -s /usr/local/bin/gpu-kubelet-plugin /usr/bin/gpu-kubelet-plugin \
    && ln -s /usr/local/bin/nvdp /usr/bin/nvdp \
    && /usr/bin/nvidia-device-plugin --version \
    && /usr/bin/gpu-feature-discovery --version \
    && /usr/bin/config-manager --version \
    && /usr/bin/mps-control-daemon --version \
    && /usr/bin/gpu-kubelet-plugin --version \
    && /usr/bin/nvdp --version

# Ask the NVIDIA container toolkit to inject the driver's user-space libraries (NVML is in
# `utility`) and every GPU's device nodes, as NVIDIA's own plugin image does. The plugin only
# queries GPUs; it never runs CUDA work, so `compute` is not requested.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# The plugin runs as root, on purpose: it creates its gRPC sockets in the kubelet's
# /var/lib/kubelet/device-plugins directory, which is owned by root on the host and is not
# writable by any other user. The DaemonSet drops every capability it does not need instead
# (see the chart's securityContext).
USER 0:0

# /metrics, /healthz and /readyz (METRICS_ADDRESS, default ":2112").
EXPOSE 2112

ENTRYPOINT ["nvidia-device-plugin"]
