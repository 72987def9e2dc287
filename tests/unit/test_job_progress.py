"""The progress a table's process writes for ``refresh --jobs``, and how it is shown."""

from __future__ import annotations

import json
from pathlib import Path

from dpone.cli.refresh import describe_progress
from dpone.project.jobs import JobProgress


def test_the_file_says_the_phase_counts_and_seconds(tmp_path: Path) -> None:
    path = tmp_path / "0.json"
    progress = JobProgress(path)
    progress("export", 10_000, 2**20)
    first = json.loads(path.read_text())
    assert (first["phase"], first["rows"], first["bytes"]) == ("export", 10_000, 2**20)
    progress("export", 20_000, 2**21)  # within 0.2 s of the last write: not rewritten
    assert json.loads(path.read_text())["rows"] == 10_000
    progress("stage", 0, 0)  # a new phase is written at once
    assert json.loads(path.read_text())["phase"] == "stage"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.json"]  # no partial left


def test_a_running_table_is_described_with_a_rate_only_after_half_a_second() -> None:
    assert describe_progress("t00", None) == "t00: starting"
    early = {"phase": "export", "rows": 5_000, "bytes": 1, "seconds": 0.01}
    assert describe_progress("t00", early) == "t00: export, 5,000 rows"
    later = {"phase": "stage", "rows": 300_000, "bytes": 1, "seconds": 2.0}
    assert describe_progress("t01", later) == "t01: stage, 300,000 rows, 150,000 rows/s"
    waiting = {"phase": "prepare", "rows": 0, "bytes": 0, "seconds": 3.0}
    assert describe_progress("t02", waiting) == "t02: prepare"
