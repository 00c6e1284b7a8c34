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
    pip install --no-cache-dir --no-index --find-links=/wheels nvdp \
    && nvidia-device-plugin --version \
    && gpu-feature-discovery --version \
    && gpu-kubelet-plugin --version \
    && config-manager --version

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
