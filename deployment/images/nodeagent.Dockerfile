# syntax=docker/dockerfile:1
# The node agent (one per GPU node): pynvml, grpcio for the kubelet's PodResources API, gpuaccounting.
# Build from the repository root: docker build -f deployment/images/nodeagent.Dockerfile -t ghcr.io/gpu-timekeeper/nodeagent:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpuaccounting ./gpuaccounting
COPY gpunvml ./gpunvml
COPY nodeagent ./nodeagent
# Only this deployable's extra; the PodResources code is generated and committed, so no grpcio-tools.
RUN /opt/venv/bin/pip install ".[nodeagent]"

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# Root without capabilities: the kubelet's pod-resources socket is root's (deployment/nodeagent).
USER 0:0
CMD ["python", "-m", "nodeagent"]
