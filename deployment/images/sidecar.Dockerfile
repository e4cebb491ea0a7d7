# syntax=docker/dockerfile:1
# The reporting sidecar the webhook injects into GPU pods: the standard library, pynvml and gpuaccounting only.
# Build from the repository root: docker build -f deployment/images/sidecar.Dockerfile -t ghcr.io/gpu-timekeeper/sidecar:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpuaccounting ./gpuaccounting
COPY gpunvml ./gpunvml
COPY sidecar ./sidecar
# Only this deployable's extra: the image carries no other part's dependencies.
RUN /opt/venv/bin/pip install ".[sidecar]"

FROM ${PYTHON_IMAGE}
# No .pyc writes at run time (pip compiled them at build): the root filesystem can be read-only.
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
USER 65532:65532
CMD ["python", "-m", "sidecar"]
