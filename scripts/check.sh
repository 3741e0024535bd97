#!/usr/bin/env bash
# The checks CI runs, in order: lint, formatting, types, then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" -m ruff check gq tests bench migrations
"$PYTHON" -m ruff format --check gq tests bench migrations
"$PYTHON" -m mypy
"$PYTHON" -m pytest -q "$@"
