"""Defects found by the independent review (issues 11 and 12), each proven by a test."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

# A parent that dies at once after starting its engine (SIGKILL of `dpone stage` or
# `dpone validate` while the engine still loads): the engine's "ready" answer then
# meets a closed pipe.
_KILLED_PARENT = """
import os, signal, sys
from pathlib import Path
from dpone.preparation.engine_conversion import EngineSession
session = EngineSession(Path(sys.argv[1]))
print(session._process.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie left for an init that does not reap is not running)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_an_engine_whose_parent_dies_before_it_is_ready_ends(tmp_path: Path) -> None:
    parent = subprocess.run(
        [sys.executable, "-c", _KILLED_PARENT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert parent.returncode == -9, parent.stderr
    engine_pid = int(parent.stdout.split()[0])
    # Not a speed check: the engine loads in about a second; a stuck one never ends.
    deadline = time.monotonic() + 90
    while _alive(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    still_running = _alive(engine_pid)
    if still_running:
        subprocess.run(["kill", "-9", str(engine_pid)], check=False)
    assert not still_running, f"engine {engine_pid} outlived its dead parent"
