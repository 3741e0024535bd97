#!/usr/bin/env bash
# The checks CI runs, in order: lint, formatting, types, then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# Where Python is asked not to write bytecode (PYTHONDONTWRITEBYTECODE), pytest keeps none
# of the test modules it rewrites for its asserts, and each test worker rewrites them all
# again (about 3 s of CPU a worker): rewrite them once, on the core the type check leaves.
env -u PYTHONDONTWRITEBYTECODE "$PYTHON" -m pytest --collect-only -q -n 0 -p no:cacheprovider \
    > /dev/null 2>&1 &
rewriting=$!
"$PYTHON" -m ruff check gq tests bench migrations
"$PYTHON" -m ruff format --check gq tests bench migrations
"$PYTHON" -m mypy
wait "$rewriting" || true # a module that does not collect fails in the suite, saying why
"$PYTHON" -m pytest -q "$@"
