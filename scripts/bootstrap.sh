#!/usr/bin/env bash
# Creates .venv (once) and installs reagent-lite with its test/lint/gym extras into it
# (REAGENT_LITE_EXTRAS, default "dev"; CI adds "spark").
# torch is pinned to the CPU build first so that pip does not pull several GB of CUDA
# wheels; pyproject.toml keeps a range so users can bring their own CUDA build instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${REAGENT_LITE_EXTRAS:-dev}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=".venv/.reagent-lite-installed-${EXTRAS//,/-}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==${REAGENT_LITE_TORCH_VERSION:-2.13.0}"
  .venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
  touch "$stamp"
fi
