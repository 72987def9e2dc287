"""Three workers sharing one PostgreSQL store against one worker with the SQLite store.

Usage: python -m bench.workers [--tables 60] [--rows 1000] [--runs 1] [--keep DIR]

Starts a managed server with the default pool over ``bench_one`` and a pool ``w`` over
``bench_w``, a throwaway PostgreSQL cluster (tests/postgres_cluster.py: Debian's
``postgresql``), and one SQLite source of ``tables`` tables of ``rows`` mixed rows.
After a first run of each that creates the targets, it measures in the same run:

- one worker, the SQLite store, ``refresh --all --jobs 4`` (the baseline);
- three workers (processes with their own work directories) sharing the PostgreSQL
  store, a third of the tables each, ``--jobs 2`` each, all at once.

Every run must publish every table. Medians of ``runs``. On a 2-core machine the point
is that sharing costs little, not that three workers are faster than one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.postgres_cluster import postgres_cluster

from bench import compile_bytecode
from bench.projects import generate_tables, in_work_dir, many_tables_project
from bench.refresh import dpone

WORKERS = 3


def _run(argvs: list[list[str]], tables: int) -> float:
    """Run every argv at once; the wall time until all ended, each publishing its tables."""
    started = time.monotonic()
    running = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for argv in argvs
    ]
    outputs = [p.communicate() for p in running]
    took = time.monotonic() - started
    published = 0
    for process, (out, _) in zip(running, outputs, strict=True):
        document: dict[str, Any] = json.loads(out.decode().splitlines()[-1])
        published += sum(1 for t in document["tables"] if t["outcome"] == "published")
        if process.returncode != 0:
            sys.exit(f"a run failed: {out[-2000:]!r}")
    if published != tables:
        sys.exit(f"{published} of {tables} tables were published")
    return took


def measure(work: Path, args: argparse.Namespace) -> None:
    """Start the servers, create the targets, time each run; print the table."""
    tables = args.tables
    source = work / "many.db"
    generate_tables(source, tables, args.rows)
    data_dir = work / "ch"
    started = subprocess.run(
        dpone(
            "server",
            "start",
            "--data-dir",
            str(data_dir),
            "--protect",
            "bench_one",
            "--pool",
            "w:bench_w",
            "--json",
        ),
        capture_output=True,
        check=True,
    )
    json.loads(started.stdout)
    try:
        with postgres_cluster() as cluster:
            os.environ.update(cluster.env())
            one = many_tables_project(
                work / "one", data_dir, tables, source=source, database="bench_one"
            )
            shared = [
                many_tables_project(
                    work / f"worker{n}",
                    data_dir,
                    tables,
                    source=source,
                    database="bench_w",
                    store=cluster.url,
                    pool="w",
                )
                for n in range(WORKERS)
            ]
            names = [f"t{n:02d}" for n in range(tables)]
            share = -(-tables // WORKERS)
            alone = [[*dpone("refresh", "--config", str(one), "--all", "--jobs", "4", "--json")]]
            workers = [
                [
                    *dpone("refresh", "--config", str(config), *names[n * share : (n + 1) * share]),
                    *("--jobs", "2", "--json"),
                ]
                for n, config in enumerate(shared)
            ]
            _run(alone, tables)  # creates the targets
            _run(workers, tables)
            baseline, together = [], []
            for _ in range(args.runs):  # alternating, so both see the same machine
                baseline.append(_run(alone, tables))
                together.append(_run(workers, tables))
    finally:
        subprocess.run(dpone("server", "stop", "--data-dir", str(data_dir)), check=False)
    base, both = statistics.median(baseline), statistics.median(together)
    print(f"{tables} tables of {args.rows:,} rows, medians of {args.runs} (each run publishes all)")
    print("| run | wall | vs one worker |\n|---|---|---|")
    print(f"| one worker, SQLite store, --jobs 4 | {base:.2f} s | 1x |")
    print(
        f"| {WORKERS} workers, one PostgreSQL store, --jobs 2 each | {both:.2f} s "
        f"| {both / base:.2f}x |"
    )


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments (``argv``, default the command line's) and measure."""
    compile_bytecode()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=60)
    parser.add_argument("--rows", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="Work here and keep it (default: a temp dir).")
    args = parser.parse_args(argv)
    in_work_dir(measure, args, "dpone-bench-workers-")


if __name__ == "__main__":
    main()
