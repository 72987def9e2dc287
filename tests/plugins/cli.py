"""Running the ``dpone`` command in a subprocess, and reading its JSON answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def dpone(
    *args: str, cwd: Path | None = None, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"} | (extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "dpone", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env=env,
    )


def as_json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    payload = json.loads(lines[0])
    assert isinstance(payload, dict)
    return payload
