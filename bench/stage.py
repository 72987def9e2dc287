"""End-to-end ``dpone stage`` against a raw ``INSERT ... FORMAT TabSeparated`` baseline.

Usage: python -m bench.stage [--rows 1000000] [--runs 3] [--steps ...]

Generates the mixed data of ``bench/bulk_text_read.py`` and, in one run against a
managed local server started here, times (median of ``--runs``):

- ``raw insert``: the same rows as ClickHouse's own TabSeparated (written by the
  server from a staged table), POSTed into a fresh table: the baseline;
- ``stage``: ``dpone stage`` as a user runs it, one process per run, in the default
  preparation mode (the compiled converter); ``stage-python`` with ``--preparation
  python-reference``;
- ``validate``: ``dpone validate`` of the file;
- ``export``: ``dpone export`` from a SQLite database holding the same rows.

Each step runs as a process tree of its own; its peak RSS is the largest sum of the
resident memory of every process of the tree, sampled from /proc every 50 ms.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import compile_bytecode
from bench.bulk_text_read import SCHEMA, generate
from dpone.connectors.bulk_text_codec import BulkTextReader
from dpone.localserver import LocalServer
from dpone.localserver.control import run_admin_sql
from dpone.localserver.credentials import admin_credentials
from dpone.ports.clickhouse_request import Credentials
from dpone.preparation.spool import MODE_PYTHON
from dpone.typepolicy import plan_columns

DPONE = str(Path(sys.executable).with_name("dpone"))
# The sampling costs CPU too: every 10 ms it took about a third of a core (measured),
# which the dpone steps paid and the raw insert (not sampled) did not.
SAMPLE_SECONDS = 0.05
STEPS = ("raw", "stage", "stage-python", "validate", "export")


@dataclass(frozen=True)
class Timed:
    seconds: float
    peak_mib: float


def _tree(root: int) -> list[int]:
    """``root`` and every descendant alive now."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return pids


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_tree(argv: Sequence[str]) -> tuple[Timed, str]:
    """Run ``argv``; its wall time, the peak summed RSS of its tree, and its stdout."""
    peak = 0
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, sum(_rss_kib(p) for p in _tree(process.pid)))
            time.sleep(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate()
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    if process.returncode != 0:
        raise RuntimeError(
            f"{argv[:3]} failed ({process.returncode}): {out.decode()[-1000:]} {err.decode()[-1000:]}"
        )
    return Timed(seconds, peak / 1024), out.decode()


def _auth(credentials: Credentials) -> dict[str, str]:
    return {"X-ClickHouse-User": credentials.user, "X-ClickHouse-Key": credentials.password}


def post_file(
    port: int, query: str, path: Path, credentials: Credentials, *, timeout: float = 3600
) -> float:
    """POST ``path`` as the body of ``query``; the seconds until the server answered."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    started = time.perf_counter()
    with open(path, "rb") as body:
        params = {"query": query, "async_insert": "0", "wait_end_of_query": "1"}
        conn.request(
            "POST",
            "/?" + urllib.parse.urlencode(params),
            body=body,
            headers={"Content-Length": str(path.stat().st_size), **_auth(credentials)},
        )
        response = conn.getresponse()
        answer = response.read()
    seconds = time.perf_counter() - started
    conn.close()
    if response.status != 200:
        raise RuntimeError(answer.decode(errors="replace")[:500])
    return seconds


def fetch_to_file(
    port: int, query: str, path: Path, credentials: Credentials, *, timeout: float = 3600
) -> None:
    """Stream the answer of ``query`` into ``path``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/", body=query.encode(), headers=_auth(credentials))
    response = conn.getresponse()
    with open(path, "wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}")


def make_sqlite(source: Path, db: Path) -> None:
    """A SQLite table with the rows of ``source``, declared with SCHEMA's SQL Server types.

    SQLite has no exact decimal storage (NUMERIC affinity turns decimal text into a
    binary float), so the decimal column is kept as text: the exported file is then
    byte-identical to ``source``.
    """
    plans = plan_columns(SCHEMA.columns)
    declared = {"decimal(18, 4)": "nvarchar(40)"}
    columns = ", ".join(
        f'{c.name} "{declared.get(c.source_type, c.source_type)}"{"" if c.nullable else " NOT NULL"}'
        for c in SCHEMA.columns
    )
    floats = {i for i, c in enumerate(SCHEMA.columns) if c.source_type == "float"}
    with sqlite3.connect(db) as conn, open(source, "rb") as stream:
        conn.execute(f"CREATE TABLE t ({columns})")
        rows = (
            tuple(float(v) if i in floats and v is not None else v for i, v in enumerate(record))
            for record in BulkTextReader(stream, [p.codec_column for p in plans])
        )
        conn.executemany(f"INSERT INTO t VALUES ({', '.join('?' * len(plans))})", rows)


def _same_bytes(a: Path, b: Path) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 24), fb.read(1 << 24)
            if x != y:
                return False
            if not x:
                return True


def median(label: str, runs: int, once: Callable[[int], Timed]) -> Timed:
    results = [once(i) for i in range(runs)]
    for i, r in enumerate(results):
        print(
            f"  {label} run {i + 1}: {r.seconds:.2f} s, peak RSS {r.peak_mib:.0f} MiB", flush=True
        )
    return Timed(statistics.median(r.seconds for r in results), max(r.peak_mib for r in results))


def main() -> None:
    compile_bytecode()
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", default=",".join(STEPS), help=f"subset of {','.join(STEPS)}")
    parser.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument(
        "--source",
        type=Path,
        help="an existing bulk text file under SCHEMA "
        "(e.g. generated rows repeated) instead of generating --rows",
    )
    args = parser.parse_args()
    steps = args.steps.split(",")
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        if args.source is None:
            source = work / "snapshot.tsv"
            rows = generate(source, 0, rows_wanted=args.rows)
        else:
            source = args.source.absolute()
            with open(source, "rb") as f:
                rows = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
        size = source.stat().st_size
        print(f"input: {rows:,} rows, {size / 2**20:.1f} MiB", flush=True)
        (work / "schema.json").write_text(json.dumps(SCHEMA.to_document()))
        receipt = work / "snapshot.receipt.json"
        results: dict[str, Timed] = {}

        def validate(i: int) -> Timed:
            receipt.unlink(missing_ok=True)
            timed, _ = run_tree(
                [
                    DPONE,
                    "validate",
                    str(source),
                    "--schema",
                    str(work / "schema.json"),
                    "--receipt-out",
                    str(receipt),
                    "--json",
                ]
            )
            return timed

        results["validate"] = median("validate", args.runs if "validate" in steps else 1, validate)
        if "validate" not in steps:
            del results["validate"]

        data_dir = work / "ch"
        with LocalServer(data_dir) as server:
            port = server.info.http_port
            admin = admin_credentials(data_dir)
            run_admin_sql(port, "CREATE DATABASE bench ENGINE = Atomic", credentials=admin)
            staged: dict[str, str] = {}

            def stage(mode: str) -> Callable[[int], Timed]:
                # "default": no --preparation option, as a user runs it.
                flag = [] if mode == "default" else ["--preparation", mode]

                def once(i: int) -> Timed:
                    runs_dir = work / f"runs-{mode}-{i}"
                    timed, out = run_tree(
                        [
                            DPONE,
                            "stage",
                            str(source),
                            "--receipt",
                            str(receipt),
                            "--work-dir",
                            str(runs_dir),
                            "--database",
                            "bench",
                            "--data-dir",
                            str(data_dir),
                            *flag,
                            "--json",
                        ]
                    )
                    answer = json.loads(out)
                    assert answer["rows"] == rows, answer
                    staged.setdefault(mode, answer["semantic_id"])
                    staged[f"table-{mode}"] = answer["table"]
                    shutil.rmtree(runs_dir)
                    return timed

                return once

            modes = {"stage": "default", "stage-python": MODE_PYTHON}
            for step, mode in modes.items():
                if step in steps:
                    results[step] = median(f"stage {mode}", args.runs, stage(mode))
            if "raw" in steps:
                table = next(
                    (staged[f"table-{m}"] for m in modes.values() if f"table-{m}" in staged), None
                )
                if table is None:
                    stage("default")(0)
                    table = staged["table-default"]
                tsv = work / "equivalent.tsv"
                fetch_to_file(
                    port, f"SELECT * FROM bench.`{table}` FORMAT TabSeparated", tsv, admin
                )
                ddl = run_admin_sql(
                    port,
                    f"SELECT create_table_query FROM system.tables WHERE database = 'bench' "
                    f"AND name = '{table}' FORMAT TSVRaw",
                    credentials=admin,
                ).strip()

                def raw(i: int) -> Timed:
                    name = f"raw_{i}"
                    run_admin_sql(
                        port, ddl.replace(f"bench.{table}", f"bench.{name}", 1), credentials=admin
                    )
                    seconds = post_file(
                        port, f"INSERT INTO bench.{name} FORMAT TabSeparated", tsv, admin
                    )
                    counted = run_admin_sql(
                        port, f"SELECT count() FROM bench.{name}", credentials=admin
                    )
                    assert int(counted) == rows, counted
                    run_admin_sql(port, f"DROP TABLE bench.{name} SYNC", credentials=admin)
                    return Timed(seconds, 0.0)

                results["raw"] = median("raw insert", args.runs, raw)
                print(f"  (equivalent TSV: {tsv.stat().st_size / 2**20:.1f} MiB)")
        if "export" in steps:
            db = work / "source.db"
            make_sqlite(source, db)

            def export(i: int) -> Timed:
                out = work / f"export-{i}.tsv"
                timed, _ = run_tree(
                    [
                        DPONE,
                        "export",
                        "--source",
                        f"sqlite:{db}",
                        "--table",
                        "t",
                        "--out",
                        str(out),
                        "--json",
                    ]
                )
                same = _same_bytes(out, source)
                out.unlink()
                Path(f"{out}.receipt.json").unlink(missing_ok=True)
                assert same, "the export differs from the generated file"
                return timed

            results["export"] = median("export (sqlite)", args.runs, export)
        if len(staged.keys() & {"default", MODE_PYTHON}) == 2:
            same = staged["default"] == staged[MODE_PYTHON]
            print(f"semantic ids of the two modes {'equal' if same else 'DIFFER'}")

    mib = size / 2**20
    base = results.get("raw")
    print(f"\n{rows:,} rows, {mib:.1f} MiB of bulk text; medians of {args.runs} runs")
    for name, r in results.items():
        ratio = f"{r.seconds / base.seconds:5.2f}x raw" if base else ""
        rss = f"peak RSS {r.peak_mib:4.0f} MiB" if name != "raw" else "(server side)"
        print(
            f"{name:13s} {r.seconds:7.2f} s  {rows / r.seconds:>11,.0f} rows/s  "
            f"{mib / r.seconds:7.1f} MiB/s  {ratio}  {rss}"
        )


if __name__ == "__main__":
    main()
