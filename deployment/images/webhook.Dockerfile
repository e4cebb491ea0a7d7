# syntax=docker/dockerfile:1
# The admission webhooks (and, with `python -m webhook.certbootstrap`, the self-signed certificate bootstrap).
# Build from the repository root: docker build -f deployment/images/webhook.Dockerfile -t ghcr.io/gpu-timekeeper/webhook:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpuaccounting ./gpuaccounting
COPY httpguard ./httpguard
COPY webhook ./webhook
# Only this deployable's extra: the image carries no other part's dependencies.
RUN /opt/venv/bin/pip install ".[webhook]"

FROM ${PYTHON_IMAGE}
# No .pyc writes at run time (pip compiled them at build): the root filesystem can be read-only.
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Each TLS connection's 256 KiB buffer always in its own mapping, given back when the connection closes:
# glibc's sliding threshold would keep them in the heap after a burst (docs/security.md, "Hostile clients").
ENV MALLOC_MMAP_THRESHOLD_=131072
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# Owned by the runtime user so that a volume mounted here (docker compose: the certificate bootstrap's
# --output-dir) is writable by it; in Kubernetes the certificates come from a Secret volume instead.
RUN install -d -o 65532 -g 65532 /var/lib/gpu-timekeeper
USER 65532:65532
EXPOSE 8443
CMD ["python", "-m", "webhook", "--port", "8443"]
