"""`export_table` against the same driver's bare fetch of the same rows.

Usage: python -m bench.export [--rows 1000000] [--runs 3] [--keep DIR] [--fetch-sizes]
       [--skip-python] [--source sqlite|postgres]

The source is ``bench/refresh.py``'s table (bigint, int, nvarchar with tabs and
newlines, decimal(18, 2), datetime2(7), uniqueidentifier, nullable varbinary). Each
measurement runs in a child process of its own, alternating, ``--runs`` times; the
medians are printed with their ratio to the bare fetch and each child's peak RSS:

- ``bare``: ``sqlite3`` ``fetchmany(10000)`` of the export's SELECT, nothing else;
- ``python``: the whole export (render, write, fsync, validation, receipt) with the
  Python renderer alone (``native=False``, the specification);
- ``rows``: the whole export with the compiled renderer fed the driver's row tuples
  (the path of every source: SQL Server's ``pymssql`` too);
- ``reader``: the whole export as ``dpone export`` runs it on SQLite: the compiled
  reader renders SQLite's values without a Python object per value.

With ``--source postgres``, the same rows in PostgreSQL's types (bigint, int, text,
numeric(18, 2), timestamp(6), uuid, bytea; :mod:`bench.postgres_source`) in a
throwaway cluster (``tests/postgres_cluster.py``, as the tests start it), and:

- ``pg-bare``: ``psycopg``'s server-side binary cursor, ``fetchmany(10000)`` of the
  export's SELECT into Python tuples, nothing else;
- ``pg-export``: the whole export as ``dpone export --source postgresql://...`` runs
  it (one ``REPEATABLE READ`` snapshot, exact loaders, compiled renderer on the
  tuples, validation, receipt).

``--fetch-sizes`` also times the bare fetch with other batch sizes and plain cursor
iteration. ``--keep`` keeps the SQLite source only. The machine may be shared: the
figures are one run's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.postgres_cluster import postgres_cluster

from bench import postgres_source
from bench.refresh import generate
from dpone.contracts.schema import SourceSchema
from dpone.exporters.export import export_table
from dpone.exporters.sources import SqliteSource, open_source

MODES = ("bare", "python", "rows", "reader")
POSTGRES_MODES = ("pg-bare", "pg-export")


class DriverRows:
    """A SQLite source seen only through its driver rows (as any other source is)."""

    def __init__(self, source: SqliteSource) -> None:
        self._source = source
        self.local_files = source.local_files

    def schema(self, table: str) -> SourceSchema:
        return self._source.schema(table)

    def rows(self, table: str, schema: SourceSchema) -> Iterator[tuple[Any, ...]]:
        return self._source.rows(table, schema)

    def batches(self, table: str, schema: SourceSchema) -> Iterator[list[tuple[Any, ...]]]:
        return self._source.batches(table, schema)


def bare_fetch(db: Path, size: int) -> int:
    source = SqliteSource(db)
    sql = source.select_sql("items", source.schema("items"))
    rows = 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        cursor = conn.execute(sql)
        if size == 0:
            for _ in cursor:
                rows += 1
        else:
            while batch := cursor.fetchmany(size):
                rows += len(batch)
    conn.close()
    return rows


def child(mode: str, db: str, out: Path, size: int) -> None:
    """One measurement (``db``: the SQLite file, or the PostgreSQL DSN for ``pg-*``):
    prints its seconds and peak RSS (MiB) as JSON."""
    started = time.perf_counter()
    if mode == "pg-bare":
        postgres_source.bare_fetch(db, size)
    elif mode == "pg-export":
        export_table(open_source(db), postgres_source.TABLE, out, force=True)
    elif mode == "bare":
        bare_fetch(Path(db), size)
    else:
        source = SqliteSource(Path(db))
        if mode == "python":
            export_table(source, "items", out, force=True, native=False)
        elif mode == "rows":
            export_table(DriverRows(source), "items", out, force=True)
        else:
            export_table(source, "items", out, force=True)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_mib": peak}))


def measure(mode: str, db: Path | str, out: Path, size: int = 10_000) -> dict[str, float]:
    argv = [sys.executable, "-m", "bench.export", "--child", mode, str(db), str(out), str(size)]
    done = subprocess.run(argv, capture_output=True, check=True)
    result: dict[str, float] = json.loads(done.stdout)
    return result


def compare(modes: list[str], db: Path | str, out: Path, args: argparse.Namespace) -> None:
    """Time each mode ``args.runs`` times, alternating; print medians against the first."""
    seen: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(args.runs):
        for mode in modes:  # alternating, so that a busy moment spreads over all
            seen[mode].append(measure(mode, db, out))
    bare = statistics.median(r["seconds"] for r in seen[modes[0]])
    print(f"{args.rows:,} rows, median of {args.runs} (each in its own process)")
    for mode in modes:
        wall = statistics.median(r["seconds"] for r in seen[mode])
        peak = max(r["peak_mib"] for r in seen[mode])
        runs = ", ".join(f"{r['seconds']:.2f}" for r in seen[mode])
        print(
            f"  {mode:9s} {wall:7.2f} s  {wall / bare:5.2f}x bare  peak {peak:6.0f} MiB  ({runs})"
        )
    if args.fetch_sizes:
        for size in (1_000, 10_000, 100_000, 0):
            wall = statistics.median(
                measure(modes[0], db, out, size)["seconds"] for _ in range(args.runs)
            )
            print(f"  bare fetch {'iterate' if size == 0 else f'fetchmany({size})'}: {wall:.2f} s")


def on_postgres(scratch: Path, args: argparse.Namespace) -> None:
    """The PostgreSQL modes, against a throwaway cluster holding the generated rows."""
    with postgres_cluster() as cluster:
        before = os.environ.get("PGPASSFILE")
        os.environ.update(cluster.env())  # for this process and the children (libpq's)
        try:
            postgres_source.generate(cluster.url, args.rows)
            compare(list(POSTGRES_MODES), cluster.url, scratch / "items.tsv", args)
        finally:
            if before is None:
                os.environ.pop("PGPASSFILE", None)
            else:
                os.environ["PGPASSFILE"] = before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="keep (and reuse) the SQLite source in DIR")
    parser.add_argument("--fetch-sizes", action="store_true")
    parser.add_argument("--skip-python", action="store_true", help="leave the slow path out")
    parser.add_argument("--source", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--child", nargs=4, metavar=("MODE", "DB", "OUT", "SIZE"))
    args = parser.parse_args()
    if args.child:
        mode, db, out, size = args.child
        child(mode, db, Path(out), int(size))
        return
    with tempfile.TemporaryDirectory(prefix="dpone-bench-export-") as scratch:
        if args.source == "postgres":
            on_postgres(Path(scratch), args)
            return
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        db = work / f"source-{args.rows}.db"
        if not db.exists():
            generate(db, args.rows)
        modes = [m for m in MODES if not (args.skip_python and m == "python")]
        compare(modes, db, Path(scratch) / "items.tsv", args)


if __name__ == "__main__":
    main()
