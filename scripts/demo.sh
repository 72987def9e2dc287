#!/usr/bin/env bash
# Set everything up and run the main job on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/dpone demo "$@"
