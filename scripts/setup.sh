#!/usr/bin/env bash
# Set up a fresh machine for traceml-otel in ./.venv.
#   bash scripts/setup.sh          # the package, torch (CPU) if missing, and the examples' needs
#   bash scripts/setup.sh --test   # + test tools (pytest, ruff, mypy), the rotel collector, and Debian's prometheus/promtool/node-exporter
set -euo pipefail
cd "$(dirname "$0")/.."

want_tests=0
[ "${1:-}" = "--test" ] && want_tests=1

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }

# torch is the user's choice; for dev and CI take the CPU build 2.13.0 when none is installed
# (an unpinned torch would pull a multi-GB CUDA build).
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  pip install "torch==2.13.0"
fi

if [ "$want_tests" = 1 ]; then
  pip install -e ".[test]"
  if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1 \
      || ! command -v prometheus-node-exporter >/dev/null 2>&1 || ! command -v faketime >/dev/null 2>&1 \
      || ! command -v amtool >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq prometheus prometheus-node-exporter prometheus-alertmanager faketime >/dev/null
  fi
else
  pip install -e . accelerate
fi
echo "traceml-otel is set up in .venv ($(.venv/bin/python -c 'import torch, traceml_otel; print("torch", torch.__version__, "/ traceml-otel", traceml_otel.__version__)'))"
