"""Many small tables: `dpone refresh --all --jobs 4` against one table's refresh.

Usage: python -m bench.many_tables [--tables 20] [--rows 1000] [--jobs 4] [--runs 3]
                                   [--sequential] [--keep DIR]

Generates ``tables`` SQLite sources of ``rows`` mixed rows each (the source of
:mod:`bench.refresh`), starts a managed server of its own and measures, in the same
run, each as a user runs it (a child process, ``--json``) after a first refresh that
created the targets:

- one such table alone (``dpone refresh t00``): the baseline;
- all of them with ``--jobs N``;
- with ``--sequential``, all of them one after another (``--jobs 1``) too.

Medians of ``runs``; every run must publish every table. The machine may be shared:
the figures are one run's, not a controlled measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import compile_bytecode
from bench.refresh import DATABASE, dpone, generate


def _project(work: Path, data_dir: Path, tables: int, rows: int) -> Path:
    text = (
        '[project]\nwork_dir = "work"\nstore = "store.sqlite"\n'
        f'[clickhouse]\ndata_dir = "{data_dir}"\n'
    )
    for n in range(tables):
        generate(work / f"t{n:02d}.db", rows, seed=n)
        text += f'[sources.s{n:02d}]\nkind = "sqlite"\npath = "t{n:02d}.db"\n'
        text += (
            f'[tables.t{n:02d}]\nsource = "s{n:02d}"\ntable = "items"\n'
            f'target = "{DATABASE}.many_{n:02d}"\norder_by = "id"\n'
        )
    config = work / "dpone.toml"
    config.write_text(text)
    return config


def _timed(argv: list[str], tables: int) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, check=False)
    took = time.monotonic() - started
    document: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    published = [t for t in document["tables"] if t["outcome"] == "published"]
    if done.returncode != 0 or len(published) != tables:
        sys.exit(f"a run did not publish every table: {done.stdout[-2000:]!r}")
    return took


def measure(work: Path, tables: int, rows: int, jobs: int, runs: int, sequential: bool) -> None:
    data_dir = work / "ch"
    started = subprocess.run(
        dpone("server", "start", "--protect", DATABASE, "--data-dir", str(data_dir), "--json"),
        capture_output=True,
        check=True,
    )
    del started
    try:
        config = _project(work, data_dir, tables, rows)
        refresh = dpone("refresh", "--config", str(config), "--json")
        _timed([*refresh, "--all", "--jobs", str(jobs)], tables)  # creates the targets
        one = [_timed([*refresh, "t00"], 1) for _ in range(runs)]
        many = [_timed([*refresh, "--all", "--jobs", str(jobs)], tables) for _ in range(runs)]
        serial = [_timed([*refresh, "--all", "--jobs", "1"], tables)] if sequential else []
    finally:
        subprocess.run(dpone("server", "stop", "--data-dir", str(data_dir)), check=False)
    one_s, many_s = statistics.median(one), statistics.median(many)
    print(f"{tables} tables of {rows:,} rows, medians of {runs} (each run publishes all)")
    print(f"| run | wall | vs one table |\n|---|---|---|\n| one table | {one_s:.2f} s | 1x |")
    print(f"| {tables} tables, --jobs {jobs} | {many_s:.2f} s | {many_s / one_s:.2f}x |")
    if serial:
        print(
            f"| {tables} tables, --jobs 1 (one run) | {serial[0]:.2f} s | {serial[0] / one_s:.2f}x |"
        )
    print(f"per table with --jobs {jobs}: {many_s / tables:.2f} s")


def main() -> None:
    """Parse the arguments, measure in a temporary (or kept) directory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=20)
    parser.add_argument("--rows", type=int, default=1_000)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sequential", action="store_true", help="Also --jobs 1, once.")
    parser.add_argument("--keep", type=Path, help="Work here and keep it (default: a temp dir).")
    args = parser.parse_args()
    compile_bytecode()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        measure(args.keep, args.tables, args.rows, args.jobs, args.runs, args.sequential)
        return
    with tempfile.TemporaryDirectory(prefix="dpone-bench-many-") as work:
        measure(Path(work), args.tables, args.rows, args.jobs, args.runs, args.sequential)


if __name__ == "__main__":
    main()
