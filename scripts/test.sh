#!/usr/bin/env bash
# Sets up .venv if needed and runs the whole test suite (GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# The benchmarks' --quick runs (about 4 minutes on 2 cores) are left out to keep CI well
# under 30 minutes; run them with: bash scripts/test.sh -m bench_smoke
exec .venv/bin/python -m pytest -q -m "not bench_smoke" "$@"
