"""``dpone refresh`` stopped by SIGINT, SIGTERM or SIGHUP in each phase, then refreshed.

Issue 24, items 2 and 6: Ctrl-C printed ``[interrupted] interrupted``, with no phase,
nothing about what it left and no next command, even after its EXCHANGE ran. Now the
run stops with 128 + the signal, its one JSON object names the signal and the phase,
lists what it left as ``dpone status`` does (``left_behind``) and the commands that
resolve it (``next_commands``); after them nothing needs a person, no lease is held,
and the next five refreshes publish the source exactly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dpone.contracts.composition_snapshot import SnapshotIntent
from dpone.durable_files import temporary_siblings
from dpone.publication.store import SqliteSnapshotStore
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import (
    SERVER_KINDS,
    confirmed,
    make_source,
    project,
    protected_server,
    rows_of,
    target_rows,
)

DATABASE = "refresh_db"  # project() of tests/plugins/refresh.py targets this database


@pytest.fixture(scope="module", params=SERVER_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "interrupt-ch", request.param)


def _journal_states(attempts: Path) -> list[str]:
    states = []
    for event in attempts.glob("*/events/*/attempt.json"):
        if not confirmed(event):
            continue  # not an event (yet)
        try:
            states.append(str(json.loads(event.read_bytes())["state"]))
        except (OSError, ValueError):
            continue  # being written
    return states


def _intent_states(store: Path) -> list[str]:
    if not store.exists():
        return []
    try:
        return [s.state for s in SqliteSnapshotStore(store, create=False).list_snapshots()]
    except Exception:  # polled while the refresh writes it
        return []


def _ended_ingest_leases(store: Path) -> int:
    if not store.exists():
        return 0
    try:
        records = SqliteSnapshotStore(store, create=False).lease_records(active_only=False)
    except Exception:  # polled while the refresh writes it
        return 0
    return sum(1 for r in records if r.lease.role == "ingest" and not r.lease.active)


def _interrupt(config: Path, ready: Callable[[], bool], signum: signal.Signals) -> dict[str, Any]:
    """Run one refresh, send ``signum`` once ``ready``, return its table's report."""
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dpone", "refresh", "--config", str(config), "items", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while not ready():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the refresh never reached the point to stop it"
        time.sleep(0.005)
    process.send_signal(signum)
    out, err = process.communicate(timeout=180)
    assert process.returncode == 128 + signum, (out, err)
    lines = out.splitlines()
    assert len(lines) == 1, (out, err)  # one JSON object, never a traceback
    document = json.loads(lines[0])
    assert "Traceback" not in err, err
    assert document["ok"] is False and document["interrupted"] == signum.name, document
    assert document["error"]["code"] == "interrupted", document
    (report,) = document["tables"]
    assert report["interrupted"] == signum.name and report["next_commands"], report
    assert report["error"]["details"]["phase"] == report["phase"], report
    return dict(report)


def _last_state(attempt: Path) -> str:
    events = [e for e in sorted(attempt.glob("events/*/attempt.json")) if confirmed(e)]
    return str(json.loads(events[-1].read_bytes())["state"])


def _assert_leases_closed(store: Path, attempt_id: str) -> None:
    opened = SqliteSnapshotStore(store, create=False)
    leases = opened.leases_of(attempt_id)
    assert leases and all(not lease.active for lease in leases), leases
    ingest = [lease for lease in leases if lease.role == "ingest"]
    assert ingest and all(opened.closure_proven(lease) for lease in ingest), ingest


def _resolve(report: dict[str, Any], config: Path) -> None:
    """Run each command the report names; afterwards nothing needs a person."""
    for command in report["next_commands"]:
        argv = command.split()
        assert argv[0] == "dpone", command
        if argv[1] == "refresh":
            continue  # nothing was left: the next command is the refresh again
        done = dpone(*argv[1:], "--json")
        if done.returncode != 0:  # a reconcile that decided NOT_PUBLISHED exits 1: decided
            decided = as_json(done)
            assert decided.get("state") == "not_published", (command, done.stdout, done.stderr)
            assert "next_command" not in decided, decided
    status = as_json(dpone("status", "--config", str(config), "--json"))
    assert status["needs_person"] == [] and status["active_leases"] == [], status


@pytest.mark.parametrize(
    "signals",
    [
        (signal.SIGINT, signal.SIGINT, signal.SIGINT, signal.SIGINT),
        (signal.SIGTERM, signal.SIGTERM, signal.SIGHUP, signal.SIGTERM),
    ],
    ids=["sigint", "sigterm-sighup"],
)
def test_a_signal_in_each_phase_says_what_it_left_then_five_refreshes_publish(
    tmp_path: Path, server: dict[str, Any], signals: tuple[signal.Signals, ...]
) -> None:
    rows = rows_of(300_000)
    make_source(tmp_path / "shop.db", rows)
    target = f"t_interrupt_{signals[0].name.lower()}"
    config = project(tmp_path, server, target)
    work = tmp_path / "work"
    attempts, store = work / "attempts", tmp_path / "store.sqlite"
    export = work / "exports" / "items.tsv"

    # export: the temporary file is being written; nothing is left but the run again.
    report = _interrupt(config, lambda: bool(temporary_siblings(export)), signals[0])
    assert (report["phase"], report["outcome"], report["left_behind"]) == (
        "export",
        "interrupted",
        [],
    ), report
    assert report["next_commands"] == [f"dpone refresh items --config {config}"]
    assert temporary_siblings(export) == [] and not export.exists()
    _resolve(report, config)

    # stage: the attempt's journal exists (staging 300,000 rows takes a fraction of a
    # second, so the signal may land in prepare's first step instead). The lease was
    # closed on the way out; the attempt was cleaned or is named with its command.
    known = set(attempts.iterdir()) if attempts.is_dir() else set()

    def staging() -> bool:
        return attempts.is_dir() and bool(set(attempts.iterdir()) - known)

    report = _interrupt(config, staging, signals[1])
    assert report["phase"] in ("stage", "prepare"), report
    left = report["left_behind"]
    assert all(i["attempt_id"] == report["attempt_id"] for i in left), report
    if not left:
        assert report["next_commands"] == [f"dpone refresh items --config {config}"], report
    _resolve(report, config)

    # prepare: staged, no intent yet, and the ingest lease ended: prepare's closure of
    # the ingest user runs (it waits out the drain gate). The "staged" event alone is
    # not enough: the stage phase still returns after it, and a signal there under
    # load landed in "stage" (a CI run).
    seen = len(_intent_states(store))
    before = _journal_states(attempts).count("staged")
    ended = _ended_ingest_leases(store)

    def preparing() -> bool:
        staged = _journal_states(attempts).count("staged") > before
        return staged and len(_intent_states(store)) == seen and _ended_ingest_leases(store) > ended

    report = _interrupt(config, preparing, signals[2])
    assert report["phase"] == "prepare", report
    # The refresh ended what it held: the generation nothing will publish is discarded
    # (ownership checked), its ingest lease closed with a stored proof.
    assert report["left_behind"] == [], report
    assert report["next_commands"] == [f"dpone refresh items --config {config}"], report
    assert _last_state(attempts / report["attempt_id"]) == "discarded"
    _assert_leases_closed(store, report["attempt_id"])
    _resolve(report, config)

    # publish: claimed (EXCHANGE_INTENT); the EXCHANGE and the closure take seconds.
    count = len(_intent_states(store))
    report = _interrupt(
        config,
        lambda: (
            len(_intent_states(store)) > count and _intent_states(store)[-1] == "exchange_intent"
        ),
        signals[3],
    )
    assert report["phase"] == "publish" and report["left_behind"] == [], report
    (mine,) = [
        s
        for s in SqliteSnapshotStore(store, create=False).list_snapshots()
        if SnapshotIntent.from_bytes(s.intent_bytes).attempt_id == report["attempt_id"]
    ]
    # Reconciled on the way out, from what the server shows: either way it is decided.
    assert report["state"] == mine.state, (report, mine)
    if mine.state == "published":
        assert (report["ok"], report["outcome"], report["next_commands"]) == (
            True,
            "published",
            [],
        ), report
        assert target_rows(server["http_port"], target) == [list(r) for r in rows]
    else:
        assert mine.state == "not_published", mine
        assert report["next_commands"] == [f"dpone refresh items --config {config}"], report
        assert _last_state(attempts / report["attempt_id"]) == "discarded"
    _assert_leases_closed(store, report["attempt_id"])
    _resolve(report, config)

    for _ in range(5):
        again = dpone("refresh", "--config", str(config), "items", "--json")
        assert again.returncode == 0, again.stdout + again.stderr
    assert target_rows(server["http_port"], target) == [list(r) for r in rows]
    leases = SqliteSnapshotStore(store, create=False).lease_records(active_only=False)
    assert all(not r.lease.active for r in leases)
