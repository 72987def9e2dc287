"""A small table's refresh and `dpone status` through a network with round trips.

Usage: python -m bench.latency [--rows 1000] [--runs 3] [--round-trips 0.002,0.02]

Starts a ClickHouse server dpone did not start (the managed engine with the pool an
operator installs, as the remote tests do) and a project that reaches it only through
``[clickhouse]`` host, port and credentials file. Then, in the same run, medians of
``runs`` of ``dpone refresh items --json`` (the nightly replace of ``rows`` rows) and
``dpone status --json``, each a child process as a user runs it:

- straight to the server on loopback: the baseline;
- through :class:`bench.latency_proxy.DelayProxy` with no delay (the proxy alone);
- through it at each round trip asked for (2 ms: one data centre; 20 ms: across a
  continent), which also charges one round trip for each new connection.

Each line gives the wall time, its ratio to the loopback baseline, the requests the
refresh and status sent (from their ``--json`` reports) and the connections the proxy
accepted (-1: a dpone that does not count them). The machine may be shared: the
figures are one run's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.remote_server import remote_server

from bench import compile_bytecode
from bench.latency_proxy import DelayProxy
from bench.refresh import DATABASE, dpone, generate


def _project(work: Path, clickhouse_toml: str, http_port: int) -> Path:
    """The project file, its ``[clickhouse]`` aimed at ``http_port``."""
    lines = [
        f"http_port = {http_port}" if line.startswith("http_port") else line
        for line in clickhouse_toml.splitlines()
    ]
    config = work / f"dpone-{http_port}.toml"
    config.write_text(
        '[project]\nwork_dir = "work"\nstore = "store.sqlite"\n'
        + "\n".join(lines)
        + '\n[sources.s]\nkind = "sqlite"\npath = "items.db"\n'
        + f'[tables.items]\nsource = "s"\ntable = "items"\ntarget = "{DATABASE}.items"\n'
        + 'order_by = "id"\n'
    )
    return config


def _run(argv: list[str]) -> tuple[float, dict[str, Any]]:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, check=False)
    took = time.monotonic() - started
    try:
        document: dict[str, Any] = json.loads(done.stdout)
    except ValueError as exc:
        why = f"{argv[3]} printed no JSON: {done.stdout[-500:]!r} {done.stderr[-2000:]!r}"
        raise SystemExit(why) from exc
    return took, document


def _refresh(config: Path) -> tuple[float, int, int]:
    took, document = _run(dpone("refresh", "items", "--config", str(config), "--json"))
    table = document["tables"][0]
    if table["outcome"] != "published":
        raise SystemExit(f"the refresh did not publish: {json.dumps(table)[:2000]}")
    # A dpone that reports no traffic (one from before it was counted, run as the
    # baseline of a comparison) counts -1.
    sent = table.get("traffic", {"": {"requests": -1, "new_connections": -1}}).values()
    return took, sum(p["requests"] for p in sent), sum(p["new_connections"] for p in sent)


def _status(config: Path) -> tuple[float, int, int]:
    took, document = _run(dpone("status", "--config", str(config), "--json"))
    if not document.get("ok"):
        raise SystemExit(f"status is not ok: {json.dumps(document)[:2000]}")
    traffic = document.get("traffic", {"requests": -1, "new_connections": -1})
    return took, traffic["requests"], traffic["new_connections"]


def _measure(config: Path, runs: int, proxy: DelayProxy | None) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name, step in (("refresh", _refresh), ("status", _status)):
        walls, requests, connections, accepted = [], [], [], []
        for _ in range(runs):
            before = proxy.connections() if proxy else 0
            wall, sent, opened = step(config)
            walls.append(wall)
            requests.append(sent)
            connections.append(opened)
            accepted.append((proxy.connections() - before) if proxy else opened)
        figures[name] = {
            "wall": statistics.median(walls),
            "requests": statistics.median(requests),
            "connections": statistics.median(connections),
            "accepted": statistics.median(accepted),
        }
    return figures


def measure(work: Path, rows: int, runs: int, round_trips: list[float]) -> None:
    """Set the server and the project up in ``work``, measure, print the table."""
    generate(work / "items.db", rows)
    servers = contextlib.contextmanager(remote_server)
    with servers(work / "remote", [DATABASE]) as server:
        direct = _project(work, server["clickhouse_toml"], server["http_port"])
        _refresh(direct)  # creates the target: what follows is the nightly replace
        results = [("loopback, no proxy (baseline)", _measure(direct, runs, None))]
        for round_trip in [0.0, *round_trips]:
            with DelayProxy(server["http_port"], round_trip) as proxy:
                config = _project(work, server["clickhouse_toml"], proxy.port)
                label = f"round trip {round_trip * 1000:g} ms" if round_trip else "proxy alone"
                results.append((label, _measure(config, runs, proxy)))
    base = results[0][1]
    print(f"one table of {rows:,} rows on a remote [clickhouse], medians of {runs}")
    print(
        "| link | refresh | vs loopback | requests | new conn. (dpone / proxy) "
        "| status | vs loopback | status requests | status conn. |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, got in results:
        r, s = got["refresh"], got["status"]
        print(
            f"| {label} | {r['wall']:.2f} s | {r['wall'] / base['refresh']['wall']:.2f}x "
            f"| {r['requests']:g} | {r['connections']:g} / {r['accepted']:g} "
            f"| {s['wall']:.2f} s | {s['wall'] / base['status']['wall']:.2f}x "
            f"| {s['requests']:g} | {s['connections']:g} / {s['accepted']:g} |"
        )


def main() -> None:
    """Parse the arguments, measure in a temporary directory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--round-trips", default="0.002,0.02", help="Seconds, comma-separated.")
    args = parser.parse_args()
    compile_bytecode()
    round_trips = [float(x) for x in args.round_trips.split(",") if x]
    with tempfile.TemporaryDirectory(prefix="dpone-bench-latency-") as work:
        measure(Path(work), args.rows, args.runs, round_trips)


if __name__ == "__main__":
    main()
