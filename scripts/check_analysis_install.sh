#!/usr/bin/env bash
# Check the analysis-only install: traceml-otel with only its statistics dependencies (numpy, scipy,
# ruptures; no torch, grpc, prometheus-client or OTel SDK) in a fresh venv must analyze and compare a
# stored run.
#   bash scripts/check_analysis_install.sh
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
PYTHON=${PYTHON:-python3}

py="$work/venv/bin/python"
pip() { "$PYTHON" -m pip -q --disable-pip-version-check "$@"; }
# The wheel is built from the repository as `pip install` builds it, with the caller's setuptools when
# it is recent enough (no isolated build environment to set up: about 25 s less), else in isolation.
pip wheel --no-deps --no-build-isolation -w "$work/wheel" "$repo" >/dev/null 2>&1 \
  || pip wheel --no-deps -w "$work/wheel" "$repo" >/dev/null
# The venv gets no pip of its own (ensurepip takes longer than the rest); the caller's pip installs
# into it (pip >= 22.3), or, with an older pip, the venv's own.
if pip --python "$PYTHON" --version >/dev/null 2>&1; then
  "$PYTHON" -m venv --without-pip "$work/venv"
  pip --python "$py" install --no-deps "$work"/wheel/*.whl
  pip --python "$py" install numpy scipy ruptures
else
  "$PYTHON" -m venv "$work/venv"
  "$py" -m pip install -q --disable-pip-version-check --no-deps "$work"/wheel/*.whl
  "$py" -m pip install -q --disable-pip-version-check numpy scipy ruptures
fi
"$py" -c "import traceml_otel" || { echo "traceml-otel did not install" >&2; exit 1; }
for module in torch grpc prometheus_client opentelemetry; do
  if "$py" -c "import $module" 2>/dev/null; then
    echo "analysis-only venv unexpectedly has $module" >&2
    exit 1
  fi
done

cp -r "$repo/tests/data/stored-run" "$work/run"
cd "$work"
"$work/venv/bin/traceml" analyze run > text.txt
"$work/venv/bin/traceml" analyze run --format json -o report.json
"$work/venv/bin/traceml" compare report.json run > compare.txt
"$py" - <<'PY'
import json
report = json.load(open("report.json"))
kind = report["primary_diagnosis"]["kind"]
text = open("text.txt").read()
assert kind == "INPUT_BOUND", kind
assert "INPUT BOUND" in text, text
assert "EQUIVALENT" in open("compare.txt").read().upper()
print(f"analysis-only install: traceml analyze and compare ran without torch, grpc, prometheus-client"
      f" or the OTel SDK; primary diagnosis {kind}")
PY
