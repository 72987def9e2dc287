"""`prepare` and `publish` of a small table on a managed server of its own.

Usage: python -m bench.publish [--runs 5]

Starts a managed server protecting ``bench_pub`` (the publication pool declared, as
``dpone server start --protect`` does), and for each of ``--runs`` rounds and each
setting stages a three-row generation over a three-row target through a leased ingest
principal (the tests' rig, tests/publication_harness.py), then times
``publisher.prepare`` and ``publisher.publish`` through ``build_publication``, as the
CLI wires them. Two settings are measured in the same run: the defaults (drain-gate
session T = 1 s, margin 2 s) and the old ones (T = 5 s, margin 3 s). It prints the
medians and the ratio old/new, and checks every publish ended ``published``.
The machine may be shared: the figures are one run's, not a controlled measurement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests import chhttp
from tests.publication_harness import Rig, Row

from dpone.localserver import LocalServer
from dpone.localserver.principal_pool import managed_server_users
from dpone.ports.composition_snapshot import AttemptRef, TargetSlot
from dpone.project.leases import close_lease
from dpone.publication.composition import (
    PublicationConfig,
    build_publication,
    provision_protected_databases,
)
from dpone.publication.store import SqliteSnapshotStore

DATABASE = "bench_pub"
A_ROWS: list[Row] = [(1, "a", 1), (2, "b", 2), (3, None, None)]
B_ROWS: list[Row] = [(1, "x", 10), (4, "y", 40), (5, "z", None)]
SETTINGS = {"new (T=1, margin=2)": (1, 2.0), "old (T=5, margin=3)": (5, 3.0)}


def one_round(rig: Rig, name: str, timeout: int, margin: float) -> tuple[float, float]:
    """Prepare and publish one small table; the two durations in seconds."""
    a = rig.stage(A_ROWS, f"{name}-a")
    rig.existing_target(a, name, A_ROWS)
    store = SqliteSnapshotStore(rig.store_path)
    parts = rig.components()
    for lease in store.leases_of(f"{name}-a"):  # A only made the target: free its user,
        close_lease(parts, lease.lease_id)  # proven closed (an unproven end would block)
    b = rig.stage(B_ROWS, f"{name}-b")
    config = PublicationConfig(
        rig.data_dir,
        rig.store_path,
        session_timeout_seconds=timeout,
        session_margin_seconds=margin,
    )
    started = time.perf_counter()
    publisher = build_publication(config, DATABASE).publisher
    prepared = publisher.prepare(
        AttemptRef(b.journal_path, TargetSlot(DATABASE, name)), b.journal_head
    )
    middle = time.perf_counter()
    published = publisher.publish(prepared.intent_sha256)
    ended = time.perf_counter()
    if published.state.value != "published":
        raise SystemExit(f"{name}: publish ended {published.state.value}")
    return middle - started, ended - middle


def main(argv: list[str] | None = None) -> int:
    """Measure and print the medians (see the module doc)."""
    parser = argparse.ArgumentParser(prog="python -m bench.publish")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dpone-bench-publish-") as root:
        data_dir = Path(root) / "ch"
        server = LocalServer(data_dir, users=managed_server_users((DATABASE,)))
        info = server.start()
        try:
            provision_protected_databases(data_dir, info.http_port, (DATABASE,))
            chhttp.register_server(info.http_port, data_dir)
            rig = Rig(data_dir, info.http_port, info.tcp_port, DATABASE, Path(root))
            figures: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in SETTINGS}
            for run in range(args.runs):
                for index, (label, (timeout, margin)) in enumerate(SETTINGS.items()):
                    prepare, publish = one_round(rig, f"t{run}_{index}", timeout, margin)
                    figures[label][0].append(prepare)
                    figures[label][1].append(publish)
        finally:
            server.stop()
    medians = {k: (statistics.median(p), statistics.median(q)) for k, (p, q) in figures.items()}
    for label, (prepare, publish) in medians.items():
        print(f"{label}: prepare {prepare:.2f} s, publish {publish:.2f} s (median of {args.runs})")
    (new_prepare, new_publish), (old_prepare, old_publish) = medians.values()
    print(
        f"ratio old/new: prepare {old_prepare / new_prepare:.2f}x, publish {old_publish / new_publish:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
