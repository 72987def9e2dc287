"""``bench.refresh --peer dlt``: dlt's fastest full replace beside ``dpone refresh``.

dlt (https://dlthub.com) is never a dependency of dpone: the bench installs it once
into a venv of its own (``--peer-venv``, default ``~/.cache/dpone-bench/dlt-venv``)
with the pinned versions below, and runs it there as a child process executing
:mod:`bench.peer_dlt_child` (a script that imports nothing of dpone).

Same source table, same managed server, same run: dlt loads into a database of its own
(:data:`PEER_DATABASE`, created by the bench as the administrator). The administrator's
credentials reach the child through dlt's own environment variables, set for that
process only (never argv). dlt connects without TLS (``secure=0``) with the server's
native port for its queries and its HTTP port for the parquet inserts.

Each tool runs once first (it creates its target); then ``runs`` rounds, each a
``dpone refresh`` and a dlt run, both replacing an existing table, both timed as a whole
(wall clock of the child process, start-up included), and the same driver's bare
fetch of the same rows against dpone's export of them (:mod:`bench.export`'s ``bare``
and ``reader`` modes, each in its own process). Medians, the ratio dpone/dlt, and the
export against the bare fetch. Then the
fidelity of both targets against the source (:mod:`bench.peer_fidelity`).
"""

from __future__ import annotations

import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

from bench.peer_fidelity import compare, print_fidelity
from dpone.ports.clickhouse_request import Credentials

PEER_DATABASE = "bench_dlt"
PEER_TABLE = "peer___items"  # dlt's dataset "peer", its default separator "___"
DLT_VERSION = "1.31.0"
PINS = (
    f"dlt[clickhouse,parquet]=={DLT_VERSION}",
    "pyarrow==26.0.1",
    "sqlalchemy==2.1.9",
    "clickhouse-connect==1.12.0",
    "clickhouse-driver==0.2.11",
)
CHILD = Path(__file__).with_name("peer_dlt_child.py")
# Variables of dpone's interpreter that must not leak into the other venv's.
_NOT_INHERITED = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")


def default_venv() -> Path:
    """Where the dlt venv lives unless ``--peer-venv`` says otherwise."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "dpone-bench" / "dlt-venv"


def ensure_venv(venv: Path) -> Path:
    """The dlt venv's interpreter, the venv created and the pins installed if needed.

    A marker file records the pins a finished install holds; a venv without it (or
    with other pins) is installed into again, so an interrupted install is redone.
    """
    python = venv / "bin" / "python"
    marker = venv / "dpone-bench-pins.txt"
    wanted = "\n".join(PINS) + "\n"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"installing dlt {DLT_VERSION} into {venv} (once)", flush=True)
    if not python.exists():
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PINS],
        check=True,
        env=_child_environment({}),
    )
    # Compiled once here, so no timed run pays for compiling dlt's modules.
    subprocess.run([str(python), "-m", "compileall", "-q", str(venv / "lib")], check=True)
    marker.write_text(wanted)
    return python


def _child_environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    env.update(extra)
    return env


def dlt_environment(server: dict[str, Any], credentials: Credentials) -> dict[str, str]:
    """The child's environment: dlt's destination settings, telemetry off."""
    prefix = "DESTINATION__CLICKHOUSE__CREDENTIALS__"
    return _child_environment(
        {
            prefix + "HOST": "127.0.0.1",
            prefix + "PORT": str(server["tcp_port"]),
            prefix + "HTTP_PORT": str(server["http_port"]),
            prefix + "SECURE": "0",
            prefix + "USERNAME": credentials.user,
            prefix + "PASSWORD": credentials.password,
            prefix + "DATABASE": PEER_DATABASE,
            # dlt reports anonymous usage to its makers by default; no network here.
            "RUNTIME__DLTHUB_TELEMETRY": "false",
        }
    )


def export_seconds(mode: str, work: Path) -> float:
    """``bench.export``'s ``mode`` over the bench's source, timed in its own process."""
    from bench.export import measure  # the one owner of these measurements

    return measure(mode, work / "source.db", work / "export.tsv")["seconds"]


def dlt_once(
    python: Path, work: Path, env: dict[str, str], source: str = "source.db", *tables: str
) -> dict[str, Any]:
    """One dlt run as a whole (of ``tables`` of ``work / source``, default its
    ``items``): its wall seconds and the peak RSS of its process tree."""
    from bench.refresh import run_measured  # bench.refresh imports this module

    home = work / "dlt"
    home.mkdir(exist_ok=True)
    argv = [str(python), str(CHILD), str(work / source), str(home / "pipelines"), *tables]
    seconds, peak, done = run_measured(argv, env=env, cwd=home)
    if done.returncode != 0:
        raise RuntimeError(
            "dlt failed: " + done.stdout.decode()[-2000:] + done.stderr.decode()[-3000:]
        )
    return {"wall": seconds, "peak_mib": peak}


def measure_peer(
    work: Path,
    rows: int,
    config: Path,
    server: dict[str, Any],
    credentials: Credentials,
    runs: int,
    venv: Path,
) -> None:
    """Time dpone and dlt alternately, print medians and ratio, then their fidelity."""
    from bench.refresh import DATABASE, _post, refresh_once

    python = ensure_venv(venv)
    port = server["http_port"]
    _post(port, f"CREATE DATABASE IF NOT EXISTS {PEER_DATABASE} ENGINE = Atomic", credentials)
    env = dlt_environment(server, credentials)
    first = dlt_once(python, work, env)
    print(f"first dlt run (creates its target): {first['wall']:.1f}s", flush=True)
    dpone_runs: list[dict[str, Any]] = []
    dlt_runs: list[dict[str, Any]] = []
    fetches: list[float] = []
    exports: list[float] = []
    for n in range(1, runs + 1):
        dpone_runs.append(refresh_once(config))
        dlt_runs.append(dlt_once(python, work, env))
        # The same driver's bare fetch of the same rows and dpone's export of them, each
        # in its own process, timed alike (bench.export's modes "bare" and "reader").
        fetches.append(export_seconds("bare", work))
        exports.append(export_seconds("reader", work))
        print(
            f"run {n}: dpone refresh {dpone_runs[-1]['wall']:.1f}s "
            f"(peak {dpone_runs[-1]['peak_mib']:.0f} MiB; its export "
            f"{dpone_runs[-1]['report']['timings']['export']:.2f}s), "
            f"dlt {dlt_runs[-1]['wall']:.1f}s (peak {dlt_runs[-1]['peak_mib']:.0f} MiB), "
            f"bare fetch {fetches[-1]:.2f}s, dpone export {exports[-1]:.2f}s",
            flush=True,
        )
    ours = statistics.median(r["wall"] for r in dpone_runs)
    theirs = statistics.median(r["wall"] for r in dlt_runs)
    print(
        f"\n{rows:,} rows, each tool replacing its existing target, medians of {runs} "
        f"alternating runs (wall clock of the child process, start-up included):"
    )
    print(
        f"dpone refresh: {ours:.1f}s ({rows / ours:,.0f} rows/s), peak RSS "
        f"{statistics.median(r['peak_mib'] for r in dpone_runs):.0f} MiB"
    )
    print(
        f"dlt {DLT_VERSION} (sql_database, pyarrow backend, parquet, replace "
        f"staging-optimized): {theirs:.1f}s ({rows / theirs:,.0f} rows/s), peak RSS "
        f"{statistics.median(r['peak_mib'] for r in dlt_runs):.0f} MiB"
    )
    print(f"ratio dpone/dlt: {ours / theirs:.2f}")
    export = statistics.median(exports)
    fetch = statistics.median(fetches)
    print(
        f"dpone export (validated bulk text and its receipt) {export:.2f}s against sqlite3's "
        f"bare fetchmany(10000) of the same SELECT {fetch:.2f}s, each in its own process: "
        f"{export / fetch:.2f}x (the goal: at most 1.30x)"
    )
    phases = {
        phase: statistics.median(r["report"]["timings"][phase] for r in dpone_runs)
        for phase in dpone_runs[0]["report"]["timings"]
    }
    print("dpone phases (medians): " + ", ".join(f"{k} {v:.2f}s" for k, v in phases.items()))
    results = compare(
        work / "source.db",
        port,
        credentials,
        {"dpone": f"{DATABASE}.items", "dlt": f"{PEER_DATABASE}.{PEER_TABLE}"},
    )
    print_fidelity(results, rows)
