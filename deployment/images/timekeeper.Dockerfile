# syntax=docker/dockerfile:1
# The timekeeper API (and, with `alembic upgrade head` as the command, its migrations).
# Build from the repository root: docker build -f deployment/images/timekeeper.Dockerfile -t ghcr.io/gpu-timekeeper/timekeeper:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpuaccounting ./gpuaccounting
COPY httpguard ./httpguard
COPY timekeeper ./timekeeper
# Only this deployable's extra: the image carries no other part's dependencies.
RUN /opt/venv/bin/pip install ".[timekeeper]"

FROM ${PYTHON_IMAGE}
# No .pyc writes at run time (pip compiled them at build): the root filesystem can be read-only.
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# As the webhook's image: a large buffer (a connection's, a big body's) always in its own mapping, given
# back when freed; glibc's sliding threshold would keep them in the heap after a burst (docs/security.md,
# "Hostile clients").
ENV MALLOC_MMAP_THRESHOLD_=131072
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# The migration Job runs `alembic upgrade head` from this image.
COPY alembic.ini ./
COPY migrations ./migrations
USER 65532:65532
EXPOSE 8080
CMD ["python", "-m", "timekeeper", "--host", "0.0.0.0", "--port", "8080"]
