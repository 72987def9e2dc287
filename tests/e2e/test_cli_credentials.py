"""Credentials a transport cannot carry are refused by the CLI without showing them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SECRET = "hunter2-\r\nX-Evil: 1-s3cr3t"


@pytest.mark.parametrize("as_json", [False, True])
def test_a_password_with_cr_lf_is_a_coded_refusal(tmp_path: Path, as_json: bool) -> None:
    data, receipt = tmp_path / "t.tsv", tmp_path / "t.receipt.json"
    data.write_bytes(b"")
    receipt.write_bytes(b"{}")
    env = {**os.environ, "DPONE_CLICKHOUSE_PASSWORD": SECRET}
    env.pop("DPONE_DATA_DIR", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpone",
            "stage",
            str(data),
            "--receipt",
            str(receipt),
            "--work-dir",
            str(tmp_path / "work"),
            "--database",
            "stg",
            "--host",
            "127.0.0.1",
            "--http-port",
            "1",
            "--tcp-port",
            "2",
            *(["--json"] if as_json else []),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "invalid_credentials" in output and "Traceback" not in output
    for piece in ("hunter2", "s3cr3t", "X-Evil"):
        assert piece not in output
