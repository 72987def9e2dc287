#!/usr/bin/env bash
# Set everything up and run the full test suite: ruff, mypy --strict, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
