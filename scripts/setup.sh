#!/usr/bin/env bash
# Install gq and its test tools into the current Python (3.11+).
# Torch: keep the one that is installed (a GPU build, say); else take the 2.13.0 CPU wheel,
# since an unpinned torch would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    "$PYTHON" -m pip install --quiet torch==2.13.0 \
        || "$PYTHON" -m pip install --quiet torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
fi
"$PYTHON" -m pip install --quiet -e ".[test,plot]"
# Every command and every job imports gq: compile it once here, since an environment may ask
# Python not to write bytecode (PYTHONDONTWRITEBYTECODE), and each process would compile it.
"$PYTHON" -m compileall -q gq migrations
