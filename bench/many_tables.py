"""Many small tables: `dpone refresh --all --jobs N` against one table's refresh, and dlt.

Usage: python -m bench.many_tables [--tables 20] [--rows 2000] [--jobs 8] [--runs 3]
                                   [--sequential] [--peer dlt] [--peer-venv DIR]
                                   [--keep DIR]

Generates one SQLite source of ``tables`` tables of ``rows`` mixed rows each (the rows
of :mod:`bench.refresh`), starts a managed server of its own and measures, in the same
run, each as a user runs it (a child process, ``--json``) after a first refresh that
created the targets:

- one such table alone (``dpone refresh t00``): the baseline;
- all of them with ``--all --jobs N``;
- with ``--sequential``, all of them in one process (``--jobs 1``) too;
- with ``--peer dlt``, dlt's fastest full replace of the same tables in one pipeline
  run (:mod:`bench.peer_dlt`: ``sql_database``, pyarrow, parquet, ``staging-optimized``),
  alternating with dpone's ``--all`` runs.

Medians of ``runs``; every run must publish every table. The machine may be shared:
the figures are one run's, not a controlled measurement.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from bench import compile_bytecode
from bench.projects import generate_tables, in_work_dir, many_tables_project
from bench.refresh import DATABASE, _post, dpone
from dpone.localserver.credentials import admin_credentials
from dpone.ports.clickhouse_request import Credentials


def _project(work: Path, data_dir: Path, tables: int, rows: int) -> Path:
    generate_tables(work / "many.db", tables, rows)
    return many_tables_project(
        work, data_dir, tables, source=work / "many.db", database=DATABASE, target="many_"
    )


def _server_query(port: int, query: str, credentials: Credentials) -> list[dict[str, Any]]:
    """The JSON rows ``query`` answers, as the managed server's administrator."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"X-ClickHouse-User": credentials.user, "X-ClickHouse-Key": credentials.password}
    conn.request("POST", "/?" + urllib.parse.urlencode({"query": query}), b"", headers)
    response = conn.getresponse()
    body = response.read().decode()
    conn.close()
    if response.status != 200:
        sys.exit(f"the server refused a bench query: {body[:300]}")
    return [json.loads(line) for line in body.splitlines() if line]


# dpone's own principals: the administrator is left out (dlt and the bench use it too).
_CPU_BY_ROLE = """
SELECT multiIf(user = 'dpone_catalog', 'catalog', user = 'dpone_closer', 'closer',
               'pool principals') AS role,
       sum(ProfileEvents['UserTimeMicroseconds'] + ProfileEvents['SystemTimeMicroseconds'])
           AS cpu_us,
       count() AS queries
FROM system.query_log
WHERE event_time_microseconds >= toDateTime64({since}, 6) AND type != 'QueryStart'
  AND (user IN ('dpone_catalog', 'dpone_closer') OR startsWith(user, 'dpone_ingest_')
       OR startsWith(user, 'dpone_publisher_'))
GROUP BY role ORDER BY role FORMAT JSONEachRow
"""


def _server_cpu(port: int, credentials: Credentials, since: str, tables: int) -> None:
    """Print the server's CPU (user + system) and queries per table, by dpone's role,
    from its query log since ``since`` (dpone's ``--all`` runs only)."""
    _server_query(port, "SYSTEM FLUSH LOGS", credentials)
    rows = _server_query(port, _CPU_BY_ROLE.format(since=since), credentials)
    print(f"server CPU per table in the --all runs ({tables} table refreshes in all):")
    for row in rows:
        cpu_ms = int(row["cpu_us"]) / 1000 / tables
        print(f"  {row['role']}: {cpu_ms:.0f} ms, {int(row['queries']) / tables:.1f} queries")


def _timed(argv: list[str], tables: int) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, check=False)
    took = time.monotonic() - started
    document: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    published = [t for t in document["tables"] if t["outcome"] == "published"]
    if done.returncode != 0 or len(published) != tables:
        sys.exit(f"a run did not publish every table: {done.stdout[-2000:]!r}")
    return took


class _Peer:
    """dlt, run beside dpone over the same tables of the same server."""

    def __init__(self, work: Path, data_dir: Path, info: dict[str, Any], venv: Path | None):
        from bench import peer_dlt

        self.peer_dlt, self.work = peer_dlt, work
        self.python = peer_dlt.ensure_venv(venv or peer_dlt.default_venv())
        credentials = admin_credentials(data_dir)
        _post(
            info["http_port"],
            f"CREATE DATABASE IF NOT EXISTS {peer_dlt.PEER_DATABASE} ENGINE = Atomic",
            credentials,
        )
        self.env = peer_dlt.dlt_environment(info, credentials)

    def once(self, tables: int) -> float:
        names = [f"t{n:02d}" for n in range(tables)]
        return float(
            self.peer_dlt.dlt_once(self.python, self.work, self.env, "many.db", *names)["wall"]
        )


def measure(work: Path, args: argparse.Namespace) -> None:
    """Start the server, create the targets, time each run; print the table."""
    data_dir = work / "ch"
    started = subprocess.run(
        dpone("server", "start", "--protect", DATABASE, "--data-dir", str(data_dir), "--json"),
        capture_output=True,
        check=True,
    )
    info: dict[str, Any] = json.loads(started.stdout)
    tables, jobs = args.tables, args.jobs
    try:
        config = _project(work, data_dir, tables, args.rows)
        refresh = dpone("refresh", "--config", str(config), "--json")
        every = [*refresh, "--all", "--jobs", str(jobs)]
        _timed(every, tables)  # creates the targets
        peer = _Peer(work, data_dir, info, args.peer_venv) if args.peer == "dlt" else None
        if peer is not None:
            peer.once(tables)  # creates its targets
        one = [_timed([*refresh, "t00"], 1) for _ in range(args.runs)]
        credentials = admin_credentials(data_dir)
        now = "SELECT toString(toUnixTimestamp64Micro(now64(6)) / 1e6) AS t FORMAT JSONEachRow"
        since = _server_query(info["http_port"], now, credentials)[0]["t"]
        many, theirs = [], []
        for _ in range(args.runs):  # alternating, so both see the same machine
            many.append(_timed(every, tables))
            if peer is not None:
                theirs.append(peer.once(tables))
        _server_cpu(info["http_port"], credentials, since, tables * args.runs)
        serial = [_timed([*refresh, "--all", "--jobs", "1"], tables)] if args.sequential else []
    finally:
        subprocess.run(dpone("server", "stop", "--data-dir", str(data_dir)), check=False)
    one_s, many_s = statistics.median(one), statistics.median(many)
    print(f"{tables} tables of {args.rows:,} rows, medians of {args.runs} (each run publishes all)")
    print(f"| run | wall | vs one table |\n|---|---|---|\n| one table | {one_s:.2f} s | 1x |")
    print(f"| {tables} tables, --jobs {jobs} | {many_s:.2f} s | {many_s / one_s:.2f}x |")
    if serial:
        print(
            f"| {tables} tables, --jobs 1 (one run) | {serial[0]:.2f} s | {serial[0] / one_s:.2f}x |"
        )
    if theirs:
        dlt_s = statistics.median(theirs)
        print(f"| dlt, the same {tables} tables (one pipeline run) | {dlt_s:.2f} s | |")
        print(f"dpone --jobs {jobs} / dlt: {many_s / dlt_s:.2f}x")
    print(f"per table with --jobs {jobs}: {many_s / tables:.2f} s")


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments (``argv``, default the command line's), measure in a
    temporary (or kept) directory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=20)
    parser.add_argument("--rows", type=int, default=2_000)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sequential", action="store_true", help="Also --jobs 1, once.")
    parser.add_argument("--peer", choices=["dlt"], help="Run dlt beside dpone (bench.peer_dlt).")
    parser.add_argument("--peer-venv", type=Path, help="dlt's venv (default: bench.peer_dlt's).")
    parser.add_argument("--keep", type=Path, help="Work here and keep it (default: a temp dir).")
    args = parser.parse_args(argv)
    compile_bytecode()
    in_work_dir(measure, args, "dpone-bench-many-")


if __name__ == "__main__":
    main()
