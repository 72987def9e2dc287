"""Two projects on one managed server, each with its own pool, refreshing at the same time.

Usage: python -m bench.shared_server [--tables 20] [--rows 1000] [--jobs 4] [--runs 3]
                                     [--keep DIR]

Starts a managed server with two named pools (``a`` over ``bench_a``, ``b`` over
``bench_b``), makes two projects (their own directory, store and source of ``tables``
tables of ``rows`` mixed rows) and, after a first refresh that creates the targets,
measures in the same run:

- project ``a`` alone (``refresh --all --jobs N``): the baseline;
- both projects at once, each ``refresh --all --jobs N``, as two teams' nightly jobs.

Every run must publish every table of both projects, and after the last one each
target's row count and content digest must equal its source's (read back through the
server). Medians of ``runs``; on a 2-core machine the point is that two projects can
share the server without a refusal, not that two are as fast as one.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import compile_bytecode
from bench.projects import generate_tables, in_work_dir, many_tables_project
from bench.refresh import dpone
from dpone.localserver.credentials import admin_credentials

POOLS = {"a": "bench_a", "b": "bench_b"}


def _project(work: Path, data_dir: Path, pool: str, tables: int, rows: int) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    generate_tables(work / "many.db", tables, rows)
    return many_tables_project(
        work, data_dir, tables, source=work / "many.db", database=POOLS[pool], pool=pool
    )


def _run_all(configs: list[Path], jobs: int, tables: int) -> float:
    """Refresh every table of each project, all projects at once; the wall time."""
    started = time.monotonic()
    running = [
        subprocess.Popen(
            dpone("refresh", "--config", str(c), "--all", "--jobs", str(jobs), "--json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for c in configs
    ]
    outputs = [p.communicate() for p in running]
    took = time.monotonic() - started
    for process, (out, _) in zip(running, outputs, strict=True):
        document: dict[str, Any] = json.loads(out.decode().splitlines()[-1])
        published = [t for t in document["tables"] if t["outcome"] == "published"]
        if process.returncode != 0 or len(published) != tables:
            sys.exit(f"a run did not publish every table: {out[-2000:]!r}")
    return took


def _exact(info: dict[str, Any], data_dir: Path, configs: list[Path], tables: int) -> None:
    """Each target's row count and id sum equal its source table's (a cross-check of
    what each refresh proved), read back through the server."""
    credentials = admin_credentials(data_dir)
    for config, database in zip(configs, POOLS.values(), strict=True):
        with sqlite3.connect(config.parent / "many.db") as conn:
            for n in range(tables):
                local = conn.execute(f"SELECT count(*), sum(id) FROM t{n:02d}").fetchone()
                sql = f"SELECT count(), sum(id) FROM {database}.t{n:02d} FORMAT TSV"
                link = http.client.HTTPConnection("127.0.0.1", info["http_port"], timeout=60)
                headers = {"X-ClickHouse-User": credentials.user}
                headers["X-ClickHouse-Key"] = credentials.password
                link.request("POST", "/", body=sql.encode(), headers=headers)
                remote = tuple(int(v) for v in link.getresponse().read().decode().split())
                link.close()
                if remote != tuple(local):
                    sys.exit(f"{database}.t{n:02d} has {remote}, its source {local}")
        conn.close()


def measure(work: Path, args: argparse.Namespace) -> None:
    """Start the server with both pools, create the targets, time each run; print."""
    data_dir = work / "ch"
    pools = [f"{pool}:{database}" for pool, database in POOLS.items()]
    started = subprocess.run(
        dpone(
            "server",
            "start",
            "--data-dir",
            str(data_dir),
            *(arg for p in pools for arg in ("--pool", p)),
            "--json",
        ),
        capture_output=True,
        check=True,
    )
    info: dict[str, Any] = json.loads(started.stdout)
    tables, jobs = args.tables, args.jobs
    try:
        configs = [_project(work / pool, data_dir, pool, tables, args.rows) for pool in POOLS]
        _run_all(configs, jobs, tables)  # creates the targets
        alone, both = [], []
        for _ in range(args.runs):  # alternating, so both see the same machine
            alone.append(_run_all(configs[:1], jobs, tables))
            both.append(_run_all(configs, jobs, tables))
        _exact(info, data_dir, configs, tables)
    finally:
        subprocess.run(dpone("server", "stop", "--data-dir", str(data_dir)), check=False)
    alone_s, both_s = statistics.median(alone), statistics.median(both)
    print(
        f"{tables} tables of {args.rows:,} rows per project, --jobs {jobs}, medians of "
        f"{args.runs} (each run publishes all; targets exact after the last)"
    )
    print("| run | wall | vs one project |\n|---|---|---|")
    print(f"| project a alone | {alone_s:.2f} s | 1x |")
    print(f"| projects a and b at once | {both_s:.2f} s | {both_s / alone_s:.2f}x |")


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments (``argv``, default the command line's) and measure."""
    compile_bytecode()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=20)
    parser.add_argument("--rows", type=int, default=1_000)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="Work here and keep it (default: a temp dir).")
    args = parser.parse_args(argv)
    in_work_dir(measure, args, "dpone-bench-shared-")


if __name__ == "__main__":
    main()
