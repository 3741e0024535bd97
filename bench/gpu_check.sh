#!/usr/bin/env bash
# The GPU check on a machine without network: install gq's missing dependencies from the
# wheels in .whl/ (fetched beforehand for CPython 3.12 manylinux x86_64), then gq itself
# (editable), into python3's own site-packages: gq's daemon starts its hosts with
# 'python3 -I', which ignores PYTHONPATH and user site-packages. Then print nvidia-smi and
# run bench/gpu_check.py, its results under $OUT (a new temporary folder when unset).
#
#   bash bench/gpu_check.sh [--quick] [--cpu]      # from the repository root
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# No network there: never ask an index; a python marked externally managed is still ours.
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1
OUT=${OUT:-$(mktemp -d -t gq-gpu-check.XXXXXX)}
mkdir -p "$OUT"
shopt -s nullglob
wheels=(.whl/*.whl)
if ((${#wheels[@]})); then
    "$PYTHON" -m pip install -q --no-index --no-deps "${wheels[@]}"
fi
if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation -e .; then
    # No setuptools to build with: the source tree on sys.path does as well (gq finds its
    # migrations beside its package).
    site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "editable install failed: adding $PWD to sys.path through $site/gq-source.pth"
    echo "$PWD" > "$site/gq-source.pth"
fi
"$PYTHON" -I -c 'import gq, sqlalchemy, alembic, typer, psutil; print("gq", gq.__version__, "from", gq.__file__)' \
    || { echo "gq or a dependency cannot be imported by '$PYTHON -I' (as gq starts its daemon)"; exit 1; }
nvidia-smi || echo "nvidia-smi failed (exit $?)"
PYTHONUNBUFFERED=1 exec "$PYTHON" bench/gpu_check.py --out "$OUT" "$@"
