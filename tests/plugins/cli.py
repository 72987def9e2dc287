"""Running the ``dpone`` command in a subprocess (on a pipe or a terminal), and reading
its JSON answer."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

# The database ``attempts_command`` names unless told otherwise.
ATTEMPTS_DATABASE = "stg"


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


def run_on_terminal(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """Run dpone with stderr on a pseudo-terminal; return (exit code, stdout, stderr)."""
    master, slave = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-m", "dpone", *args], stdout=subprocess.PIPE, stderr=slave, cwd=cwd
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert child.stdout is not None
    out = child.stdout.read().decode()
    child.stdout.close()
    return child.wait(), out, b"".join(chunks).decode().replace("\r\n", "\n")


def attempts_command(
    verb: str,
    attempt: str,
    work: Path,
    data_dir: Path,
    *more: str,
    database: str = ATTEMPTS_DATABASE,
) -> subprocess.CompletedProcess[str]:
    """``dpone attempts VERB ATTEMPT`` on the managed server of ``data_dir`` (its own admin)."""
    store = ["--store", str(work.parent / "store.sqlite")]
    return dpone(
        "attempts",
        verb,
        attempt,
        "--work-dir",
        str(work),
        "--database",
        database,
        "--data-dir",
        str(data_dir),
        *store,
        *more,
    )
