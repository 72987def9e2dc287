#!/usr/bin/env bash
# Create (or reuse) the project virtual environment in .venv and install dpone into it.
# Needs Python 3.11+, a C compiler and OpenSSL's headers (Debian: gcc, libssl-dev) on the
# machine; set PYTHON to choose the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"dpone needs Python 3.11 or newer, found {sys.version.split()[0]}")
PY
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# The editable install builds dpone's compiled parts in the tree, where it loads them: the
# build hook (hatch_build.py) runs scripts/build_native.sh, so this stops if that fails.
# The postgres extra (psycopg 3) is for the shared PostgreSQL store and its tests.
.venv/bin/python -m pip install --quiet -e ".[dev,embedded,postgres]"
# Compile dpone's bytecode now: where PYTHONDONTWRITEBYTECODE is set, every command
# would otherwise compile each module it imports, every run (0.3 s a command, measured).
.venv/bin/python -m compileall -q src/dpone
