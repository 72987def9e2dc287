"""A small table's refresh with a store that holds a long history, against an empty one.

Usage: python -m bench.store_history [--history 5000] [--rows 1000] [--runs 3] [--keep DIR]

A nightly run of 20 tables adds 7,300 intents to its store in a year. This starts a
managed server of its own and a project of one table, refreshes it once (the store
then holds its first intent), and times ``dpone refresh t00 --json`` (a child
process, as a user runs it): ``runs`` times as it is (the baseline), then ``runs``
times more after ``history`` intents of other slots of the same database were added
to the store beside it (each a copy of the table's own intent under another target,
attempt, leases and UUIDs, written as the store writes them). Medians; the ratio is
what the history costs a table. The machine may be shared: the figures are one
run's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench import compile_bytecode
from bench.projects import generate_tables, in_work_dir, many_tables_project
from bench.refresh import DATABASE, dpone
from dpone.contracts import canonical_json


def _timed(argv: list[str]) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, check=False)
    took = time.monotonic() - started
    document: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    if done.returncode != 0 or not document.get("ok"):
        sys.exit(f"a refresh did not publish: {done.stdout[-2000:]!r}")
    return took


def seed_history(store: Path, count: int) -> None:
    """Add ``count`` published intents of other slots of the database to ``store``."""
    with sqlite3.connect(store) as conn:
        base_bytes, record = conn.execute(
            "SELECT i.intent_bytes, r.record_bytes FROM intents i JOIN records r "
            "USING (intent_sha256) LIMIT 1"
        ).fetchone()
        base: Any = canonical_json.loads(bytes(base_bytes))
        rows = []
        for n in range(count):
            document = json.loads(json.dumps(base))
            document["attempt"]["attempt_id"] = f"history-{n:06d}"
            document["parent_request"]["request_id"] = uuid.uuid4().hex
            document["protected"]["target_table"] = f"history_{n % 200:03d}"
            document["protected"]["target_uuid"] = str(uuid.uuid4())
            document["generation"]["table_uuid"] = str(uuid.uuid4())
            for role in ("ingest", "publisher"):
                document["principals"][role]["lease_id"] = uuid.uuid4().hex
            data = canonical_json.dumps(document)
            sha = hashlib.sha256(data).hexdigest()
            at = f"2025-01-01T00:00:{n % 60:02d}.{n:06d}Z"
            rows.append((sha, data, at, document, bytes(record)))
        conn.executemany(
            "INSERT INTO intents VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    sha,
                    data,
                    at,
                    doc["parent_request"]["request_id"],
                    DATABASE,
                    doc["protected"]["target_table"],
                )
                for sha, data, at, doc, _ in rows
            ],
        )
        conn.executemany(
            "INSERT INTO records VALUES (?, ?, 3, 'published')",
            [(sha, record_bytes) for sha, _, _, _, record_bytes in rows],
        )
    conn.close()


def measure(work: Path, args: argparse.Namespace) -> None:
    """Start the server, refresh once, time the refreshes before and after the history."""
    data_dir = work / "ch"
    subprocess.run(
        dpone("server", "start", "--protect", DATABASE, "--data-dir", str(data_dir), "--json"),
        capture_output=True,
        check=True,
    )
    try:
        generate_tables(work / "many.db", 1, args.rows)
        config = many_tables_project(
            work, data_dir, 1, source=work / "many.db", database=DATABASE, target="hist_"
        )
        refresh = dpone("refresh", "t00", "--config", str(config), "--json")
        _timed(refresh)  # creates the target and the store
        empty = [_timed(refresh) for _ in range(args.runs)]
        seed_history(work / "store.sqlite", args.history)
        full = [_timed(refresh) for _ in range(args.runs)]
    finally:
        subprocess.run(dpone("server", "stop", "--data-dir", str(data_dir)), check=False)
    before, after = statistics.median(empty), statistics.median(full)
    print(f"one table of {args.rows:,} rows, medians of {args.runs}")
    print("| store | refresh | vs baseline |\n|---|---:|---:|")
    print(f"| its own few intents (baseline) | {before:.2f} s | 1.00x |")
    print(f"| {args.history:,} intents more | {after:.2f} s | {after / before:.2f}x |")


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments (``argv``, default the command line's) and measure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=5_000)
    parser.add_argument("--rows", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="Work here and keep it (default: a temp dir).")
    args = parser.parse_args(argv)
    compile_bytecode()
    in_work_dir(measure, args, "dpone-bench-history-")


if __name__ == "__main__":
    main()
