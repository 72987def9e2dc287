"""`dpone refresh` end to end against a raw TabSeparated insert plus EXCHANGE TABLES.

Usage: python -m bench.refresh [--rows 1000000] [--ten-million] [--keep DIR]
       python -m bench.refresh --many-tables
       python -m bench.refresh --peer dlt [--runs 3] [--peer-venv DIR] [--rows ...]

Generates a SQLite source (mixed types: bigint, int, nvarchar with tabs, newlines and
backslashes, decimal, datetime2(7), uniqueidentifier, nullable varbinary), starts a
managed server of its own (``dpone server start --protect bench_db``) and measures in
the same run:

- ``dpone refresh`` as a user runs it (a child process, ``--json``), twice: the first
  creates the target, the second replaces it (the nightly case, the one compared);
  the phase timings come from the refresh report;
- the baseline, the least a full replace can do: the same rows exported by a plain
  Python loop to ClickHouse's own TabSeparated (a child process), one
  ``INSERT ... FORMAT TabSeparated`` over HTTP into a fresh table with the target's
  structure, and ``EXCHANGE TABLES`` with a copy of the target. No validation, no
  exact conversion, no counts, no proof.

With ``--peer dlt``, instead of the baseline: dlt's fastest full replace of the same
table into the same server, alternating with ``dpone refresh``, and the fidelity of
both targets against the source (:mod:`bench.peer_dlt`; dlt lives in a venv of its own).

Peak memory is the largest sum of resident memory over the child's process tree,
sampled every 50 ms (the managed server is a separate process, not counted). The
machine may be shared: the figures are one run's, not a controlled measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import compile_bytecode
from dpone.localserver.credentials import admin_credentials
from dpone.ports.clickhouse_request import Credentials
from dpone.project.refresh import PHASES

DATABASE = "bench_db"
CREATE = (
    "CREATE TABLE items (id bigint NOT NULL, qty int NOT NULL, name nvarchar(200), "
    "balance decimal(18, 2), updated_at datetime2(7) NOT NULL, external_id uniqueidentifier, "
    "blob varbinary)"
)
COLUMNS = 7
_ESCAPES = {ord("\\"): "\\\\", ord("\t"): "\\t", ord("\n"): "\\n"}
_BYTE_ESCAPES = ((b"\\", b"\\\\"), (b"\t", b"\\t"), (b"\n", b"\\n"))


def generate(path: Path, rows: int, seed: int = 7, table: str = "items") -> None:
    """The source: ``rows`` repeatable rows of mixed types, some hostile, in ``table``
    (a new file, unless ``table`` is not ``items``: then a table added to it)."""
    rng = random.Random(seed)
    words = ("alpha", "beta\ttab", "gamma\nline", "delta\\slash", "ε-unicode", "", "zeta")

    def produce() -> Iterator[tuple[Any, ...]]:
        for i in range(1, rows + 1):
            when = (
                f"20{rng.randint(10, 29)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}."
                f"{rng.randint(0, 9_999_999):07d}"
            )
            yield (
                i,
                rng.randint(-(2**31), 2**31 - 1),
                None if i % 17 == 0 else f"{rng.choice(words)} {i}",
                None if i % 23 == 0 else f"{rng.randint(-(10**15), 10**15) / 100:.2f}",
                when,
                str(uuid.UUID(int=rng.getrandbits(128))).upper() if i % 5 else None,
                rng.randbytes(rng.randint(1, 12)) if i % 3 else None,
            )

    if table == "items":
        path.unlink(missing_ok=True)
    with sqlite3.connect(path) as conn:
        conn.execute(CREATE.replace("CREATE TABLE items", f"CREATE TABLE {table}", 1))
        conn.executemany(f"INSERT INTO {table} VALUES (?, ?, ?, ?, ?, ?, ?)", produce())
    conn.close()


def _tsv_field(value: Any) -> bytes:
    if value is None:
        return b"\\N"
    if isinstance(value, bytes):
        data: bytes = value
        for raw, escaped in _BYTE_ESCAPES:
            data = data.replace(raw, escaped)
        return data
    return str(value).translate(_ESCAPES).encode("utf-8")


def child_export(source: str, out: str) -> None:
    """The baseline's export: every row as ClickHouse TabSeparated, nothing checked."""
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as conn, open(out, "wb") as sink:
        for row in conn.execute("SELECT * FROM items"):
            sink.write(b"\t".join(_tsv_field(v) for v in row) + b"\n")
    conn.close()


# ---------------------------------------------------------------------- measuring


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_measured(
    argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[float, float, subprocess.CompletedProcess[bytes]]:
    """Run ``argv``; its wall seconds, the peak RSS (MiB) of its tree, and its result."""
    started = time.perf_counter()
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd
    )
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            tree, total, todo = _children(), 0, [process.pid]
            while todo:
                pid = todo.pop()
                total += _rss_kib(pid)
                todo.extend(tree.get(pid, []))
            peak[0] = max(peak[0], total)
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate()
    seconds = time.perf_counter() - started
    stop.set()
    sampler.join()
    done = subprocess.CompletedProcess(argv, process.returncode, out, err)
    return seconds, peak[0] / 1024, done


def _post(
    port: int, query: str, credentials: Credentials, body: Any = b"", length: int | None = None
) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    started = time.perf_counter()
    headers = {
        "X-ClickHouse-User": credentials.user,
        "X-ClickHouse-Key": credentials.password,
        "Content-Length": str(len(body) if length is None else length),
    }
    params = {"query": query, "wait_end_of_query": "1", "async_insert": "0"}
    conn.request("POST", "/?" + urllib.parse.urlencode(params), body=body, headers=headers)
    response = conn.getresponse()
    answer = response.read()
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"{query[:60]}: {answer.decode(errors='replace')[:300]}")
    return time.perf_counter() - started


def dpone(*args: str) -> list[str]:
    return [sys.executable, "-m", "dpone", *args]


def refresh_once(config: Path) -> dict[str, Any]:
    seconds, peak, done = run_measured(dpone("refresh", "items", "--config", str(config), "--json"))
    if done.returncode != 0:
        raise RuntimeError(done.stdout.decode()[-2000:] + done.stderr.decode()[-2000:])
    report: dict[str, Any] = json.loads(done.stdout)["tables"][0]
    return {"wall": seconds, "peak_mib": peak, "report": report}


def baseline(work: Path, port: int, credentials: Credentials) -> dict[str, Any]:
    tsv = work / "baseline.tsv"
    export_s, peak, done = run_measured(
        [sys.executable, "-m", "bench.refresh", "--child-export", str(work / "source.db"), str(tsv)]
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.decode()[-2000:])
    for sql in (
        "DROP TABLE IF EXISTS bench_db.base_new SYNC",
        "DROP TABLE IF EXISTS bench_db.base_target SYNC",
        "CREATE TABLE bench_db.base_target AS bench_db.items",
    ):
        _post(port, sql, credentials)
    started = time.perf_counter()
    create_s = _post(port, "CREATE TABLE bench_db.base_new AS bench_db.items", credentials)
    with open(tsv, "rb") as body:
        insert_s = _post(
            port,
            "INSERT INTO bench_db.base_new FORMAT TabSeparated",
            credentials,
            body,
            tsv.stat().st_size,
        )
    exchange_s = _post(
        port, "EXCHANGE TABLES bench_db.base_new AND bench_db.base_target", credentials
    )
    load_s = time.perf_counter() - started
    return {
        "export": export_s,
        "create": create_s,
        "insert": insert_s,
        "exchange": exchange_s,
        "total": export_s + load_s,
        "peak_mib": peak,
        "tsv_bytes": tsv.stat().st_size,
    }


def main() -> None:
    compile_bytecode()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--ten-million", action="store_true", help="10,000,000 rows.")
    parser.add_argument("--keep", type=Path, help="Work here and keep it (default: a temp dir).")
    parser.add_argument("--child-export", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument(
        "--many-tables",
        action="store_true",
        help="The many-small-tables case instead: 20 tables of 2,000 rows with --jobs 4 "
        "against one such table (bench.many_tables, with its defaults and --sequential).",
    )
    parser.add_argument(
        "--peer",
        choices=["dlt"],
        help="Compare with a peer tool instead of the baseline (bench.peer_dlt).",
    )
    parser.add_argument("--runs", type=int, default=3, help="With --peer: timed rounds.")
    parser.add_argument(
        "--peer-venv", type=Path, help="With --peer: its venv (default: under ~/.cache)."
    )
    args = parser.parse_args()
    if args.child_export:
        child_export(*args.child_export)
        return
    if args.many_tables:
        from bench import many_tables  # imports this module: loaded only when asked

        many_tables.main(["--sequential"])
        return
    rows = 10_000_000 if args.ten_million else args.rows
    peer = None
    if args.peer:
        from bench import peer_dlt  # imports this module: loaded only when asked

        peer = PeerRequest(args.runs, args.peer_venv or peer_dlt.default_venv())
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        measure(args.keep, rows, peer)
    else:
        with tempfile.TemporaryDirectory(prefix="dpone-bench-refresh-") as tmp:
            measure(Path(tmp), rows, peer)


@dataclasses.dataclass(frozen=True)
class PeerRequest:
    """``--peer dlt``: how many timed rounds, and where dlt's venv is."""

    runs: int
    venv: Path


def measure(work: Path, rows: int, peer: PeerRequest | None = None) -> None:
    data_dir = work / "ch"
    started = time.perf_counter()
    generate(work / "source.db", rows)
    print(
        f"generated {rows:,} rows in {time.perf_counter() - started:.1f}s "
        f"({(work / 'source.db').stat().st_size / 2**20:.0f} MiB SQLite)",
        flush=True,
    )
    server = subprocess.run(
        dpone("server", "start", "--protect", DATABASE, "--data-dir", str(data_dir), "--json"),
        capture_output=True,
        check=True,
    )
    info: dict[str, Any] = json.loads(server.stdout)
    port = info["http_port"]
    try:
        config = work / "dpone.toml"
        config.write_text(
            f'[project]\nwork_dir = "work"\nstore = "store.sqlite"\nkeep_rollback = 1\n'
            f'[clickhouse]\ndata_dir = "{data_dir}"\n'
            '[sources.src]\nkind = "sqlite"\npath = "source.db"\n'
            f'[tables.items]\nsource = "src"\ntable = "items"\ntarget = "{DATABASE}.items"\n'
            'order_by = "id"\n'
        )
        first = refresh_once(config)
        print(f"first refresh (creates the target): {first['wall']:.1f}s", flush=True)
        if peer is not None:
            from bench.peer_dlt import measure_peer

            credentials = admin_credentials(data_dir)
            measure_peer(work, rows, config, info, credentials, peer.runs, peer.venv)
            return
        second = refresh_once(config)
        base = baseline(work, port, admin_credentials(data_dir))
        report(rows, second, base)
    finally:
        subprocess.run(dpone("server", "stop", "--data-dir", str(data_dir)), capture_output=True)


def report(rows: int, refreshed: dict[str, Any], base: dict[str, Any]) -> None:
    timings: dict[str, float] = refreshed["report"]["timings"]
    size_mib = refreshed["report"]["file_bytes"] / 2**20
    wall = refreshed["wall"]
    print(
        f"\n{rows:,} rows, exported bulk text {size_mib:.1f} MiB "
        f"(baseline TSV {base['tsv_bytes'] / 2**20:.1f} MiB)"
    )
    print(
        f"dpone refresh (second run, replaces the target): {wall:.1f}s wall, "
        f"{rows / wall:,.0f} rows/s, {size_mib / wall:.1f} MiB/s, "
        f"peak RSS of its process tree {refreshed['peak_mib']:.0f} MiB"
    )
    print(
        f"baseline (export + INSERT FORMAT TabSeparated + EXCHANGE): {base['total']:.1f}s, "
        f"{rows / base['total']:,.0f} rows/s, peak RSS of the export {base['peak_mib']:.0f} MiB"
    )
    print(f"total ratio: {wall / base['total']:.2f}x the baseline")
    pairs: dict[str, float | None] = {
        "check": None,
        "export": base["export"],
        "stage": base["create"] + base["insert"],
        "prepare": None,
        "shrink_guard": None,
        "publish": base["exchange"],
        "retention": None,
    }
    print(f"{'phase':<14}{'dpone s':>10}{'baseline s':>12}{'ratio':>9}{'share':>8}")
    for phase in PHASES:
        seconds, other = timings[phase], pairs[phase]
        ratio = f"{seconds / other:.2f}x" if other else "-"
        shown = f"{other:.3f}" if other is not None else "-"
        print(f"{phase:<14}{seconds:>10.2f}{shown:>12}{ratio:>9}{seconds / wall:>8.0%}")


if __name__ == "__main__":
    main()
