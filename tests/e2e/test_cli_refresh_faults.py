"""``dpone refresh`` killed with SIGKILL in each phase, then what ``dpone status`` names.

One managed server per module (``--protect refresh_db``). Each kill is triggered by
observing the refresh's own durable traces (its export's temporary file, its staging
journal, the store's leases and records, its retention journals), never by a timer.
After each kill: the target is exactly the old snapshot (or the new one, once the
EXCHANGE ran); every command ``dpone status --json`` names is run until status is
clean; no ingest or publisher lease stays active; no partial export remains; and a
following refresh publishes the new source.

Where status names nothing that finishes what a kill left, the test finishes it the
documented way, checks everything else, and fails with :class:`StatusGap`.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import (
    DATABASE,
    SERVER_KINDS,
    journal_state,
    killed_in,
    make_source,
    project,
    protected_server,
    refresh,
    rows_of,
    store_states,
    target_rows,
)

# Big enough that export, validation and staging each take a good part of a second.
ROWS = 50_000


class StatusGap(AssertionError):
    """``dpone status`` left something a kill caused without a finishing command."""


@pytest.fixture(scope="module", params=SERVER_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "refresh-faults-ch", request.param)


def expected(count: int, name: str) -> list[list[Any]]:
    return [[i, f"{name}{i}\ttab", f"{i}.25"] for i in range(1, count + 1)]


def _data_partials(tmp_path: Path) -> list[Path]:
    """The export's temporary data files (the receipt's have ``.receipt.json.`` inside)."""
    exports = tmp_path / "work" / "exports"
    return [p for p in exports.glob(".items.tsv.*.partial") if ".receipt.json." not in p.name]


def _all_partials(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "work").rglob("*.partial"))


def _active_leases(store: Path) -> list[tuple[str, str, str]]:
    """Active leases, read only (user, role, attempt)."""
    if not store.exists():
        return []
    with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT user, role, attempt_id FROM leases WHERE active = 1")
        return [(str(u), str(r), str(a)) for u, r, a in rows]


def _leases(store: Path, attempt_id: str) -> dict[str, int]:
    """role -> active of the leases issued to ``attempt_id`` (read only)."""
    if not store.exists():
        return {}
    try:
        with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
            rows = conn.execute(
                "SELECT role, active FROM leases WHERE attempt_id = ?", (attempt_id,)
            )
            return {str(role): int(active) for role, active in rows}
    except sqlite3.Error:
        return {}  # the store is being created


def _new_attempt(tmp_path: Path, before: set[str]) -> Path | None:
    attempts = tmp_path / "work" / "attempts"
    new = [d for d in attempts.iterdir() if d.name not in before] if attempts.is_dir() else []
    return new[0] if new else None


def _planned_table(attempt: Path) -> str:
    first = sorted((attempt / "events").glob("*"))[0]
    return str(json.loads((first / "attempt.json").read_bytes())["planned_ownership"]["table"])


def _retention_state(retention: Path, earlier: frozenset[str] = frozenset()) -> str | None:
    """The state of the one retention journal not in ``earlier`` (None: not exactly one)."""
    journals = (
        [j for j in retention.iterdir() if j.name not in earlier] if retention.is_dir() else []
    )
    return journal_state(journals[0]) if len(journals) == 1 else None


def _frozen_then_killed(
    config: Path, ready: Callable[[], bool], look: Callable[[], Any], wanted: Any = None
) -> Any:
    """Start a refresh, SIGSTOP it as soon as ``ready()`` holds, ``look()``, SIGKILL it.

    None when the refresh ended before ``ready()`` was seen to hold, or (with ``wanted``)
    when it was frozen a moment late, past ``wanted``: then it is let go on (SIGCONT) to
    end as it would, a missed try, never killed where the test did not mean to.
    """
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"}
    argv = [sys.executable, "-m", "dpone", "refresh", "--config", str(config), "items"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 120
        while not ready() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        process.send_signal(signal.SIGSTOP)
        if process.poll() is not None:
            return None
        seen = look()
        if wanted is not None and seen != wanted:
            process.send_signal(signal.SIGCONT)
            process.wait(timeout=120)
            return None
        return seen
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


def _attempt_ids(tmp_path: Path) -> set[str]:
    attempts = tmp_path / "work" / "attempts"
    return {d.name for d in attempts.iterdir()} if attempts.is_dir() else set()


def _spin(condition: Callable[[], bool], seconds: float) -> bool:
    """Poll ``condition`` as fast as possible for a short window (no sleep between checks)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
    return False


def finish_what_status_names(tmp_path: Path, config: Path, gaps: list[str]) -> list[str]:
    """Run every command ``dpone status`` names until it is clean; the kinds it named.

    ``retention_unfinished`` names ``dpone journal show`` (facts, not a finish): that
    is recorded as a gap and the journal is finished with ``dpone attempts discard``
    in the retention work dir, as docs/operations.md describes.
    """
    kinds: list[str] = []
    for _ in range(4):
        status = dpone("status", "--config", str(config), "--json")
        needs = as_json(status)["needs_person"]
        if not needs:
            assert status.returncode == 0, status.stdout
            return kinds
        assert status.returncode == 1, status.stdout
        for item in needs:
            kinds.append(item["kind"])
            assert item["command"], item
            command = shlex.split(item["command"])
            assert command[0] == "dpone", item
            if command[1:3] == ["journal", "show"]:
                gaps.append(
                    f"status names `{item['command']}` for {item['kind']}, which finishes nothing"
                )
                server = as_json(dpone("status", "--config", str(config), "--json"))
                assert server["server_running"] is True
                data_dir = config.read_text().split('data_dir = "')[1].split('"')[0]
                command = [
                    "dpone",
                    "attempts",
                    "discard",
                    item["attempt_id"],
                    "--work-dir",
                    str(tmp_path / "work" / "retention"),
                    "--database",
                    DATABASE,
                    "--data-dir",
                    data_dir,
                ]
            done = dpone(*command[1:], "--json")
            assert done.returncode == 0, (item, done.stdout, done.stderr)
    raise AssertionError(f"status still names something after four rounds: {kinds}")


def check_after(tmp_path: Path, config: Path, gaps: list[str]) -> None:
    """No lease stays active (a leftover one is a gap of status: it names none)."""
    left = _active_leases(tmp_path / "store.sqlite")
    if left:
        gaps.append(f"leases stay active and status names none: {left}")


def refresh_publishes(config: Path, port: int, target: str, rows: list[list[Any]]) -> None:
    code, done = refresh(config, "items")
    assert code == 0, done
    assert target_rows(port, target) == rows


def test_sigkill_during_export_and_its_validation_leaves_nothing_to_finish(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    make_source(tmp_path / "shop.db", rows_of(ROWS, name="a"))
    config = project(tmp_path, server, "t_kill_export")
    code, first = refresh(config, "items")
    assert code == 0, first
    size = first["tables"][0]["file_bytes"]
    old = expected(ROWS, "a")
    # Same length per row: the new export is exactly as long as the old one.
    make_source(tmp_path / "shop.db", rows_of(ROWS, name="b"))

    def writing() -> bool:  # rows are being written: the file exists, not yet complete
        return any(0 < p.stat().st_size < size for p in _data_partials(tmp_path))

    killed_in(tmp_path, config, writing)
    killed = _data_partials(tmp_path)
    assert len(killed) == 1 and killed[0].stat().st_size < size
    assert target_rows(port, "t_kill_export") == old
    gaps: list[str] = []
    assert finish_what_status_names(tmp_path, config, gaps) == []

    def validating() -> bool:  # every byte written, the file is re-read before its rename
        return any(p.stat().st_size == size for p in _data_partials(tmp_path) if p not in killed)

    killed_in(tmp_path, config, validating)
    # The second refresh removed the first one's leftovers before writing its own.
    (left,) = _data_partials(tmp_path)
    assert left not in killed and left.stat().st_size == size
    assert target_rows(port, "t_kill_export") == old
    assert finish_what_status_names(tmp_path, config, gaps) == []
    check_after(tmp_path, config, gaps)
    refresh_publishes(config, port, "t_kill_export", expected(ROWS, "b"))
    assert _all_partials(tmp_path) == []
    assert gaps == []


def test_sigkill_during_stage_verification_then_status_and_its_command(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    make_source(tmp_path / "shop.db", rows_of(4))
    config = project(tmp_path, server, "t_kill_verify")
    assert refresh(config, "items")[0] == 0
    old = target_rows(port, "t_kill_verify")
    make_source(tmp_path / "shop.db", rows_of(ROWS, name="v"))
    before = _attempt_ids(tmp_path)

    def verifying() -> bool:  # the INSERT was acknowledged; count and identity are checked
        return journal_state(_new_attempt(tmp_path, before)) == "verifying/acknowledged"

    killed_in(tmp_path, config, verifying)
    attempt = _new_attempt(tmp_path, before)
    assert journal_state(attempt) == "verifying/acknowledged"
    assert target_rows(port, "t_kill_verify") == old
    gaps: list[str] = []
    assert finish_what_status_names(tmp_path, config, gaps) == ["verifying"]
    assert attempt is not None and journal_state(attempt) == "failed_cleaned/operator_cleanup"
    check_after(tmp_path, config, gaps)
    refresh_publishes(config, port, "t_kill_verify", expected(ROWS, "v"))
    assert _all_partials(tmp_path) == []
    if gaps:
        raise StatusGap("; ".join(gaps))


def test_sigkill_during_prepare_while_ingest_closes_then_discard(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    store = tmp_path / "store.sqlite"
    make_source(tmp_path / "shop.db", rows_of(4))
    config = project(tmp_path, server, "t_kill_prepare")
    assert refresh(config, "items")[0] == 0
    old = target_rows(port, "t_kill_prepare")
    make_source(tmp_path / "shop.db", rows_of(100, name="p"))
    before = _attempt_ids(tmp_path)

    def closing_ingest() -> bool:
        # Staged and verified; prepare ended the ingest lease and is proving the
        # principal quiescent (samples over a window); no publisher is leased yet.
        attempt = _new_attempt(tmp_path, before)
        if journal_state(attempt) != "staged/staged" or attempt is None:
            return False
        return _leases(store, attempt.name) == {"ingest": 0}

    killed_in(tmp_path, config, closing_ingest)
    attempt = _new_attempt(tmp_path, before)
    assert attempt is not None and _leases(store, attempt.name) == {"ingest": 0}
    assert target_rows(port, "t_kill_prepare") == old
    gaps: list[str] = []
    assert finish_what_status_names(tmp_path, config, gaps) == ["staged_unpublished"]
    assert journal_state(attempt) == "discarded/discarded"
    table = _planned_table(attempt)
    generation = chhttp.rows(
        port,
        f"SELECT count() AS n FROM system.tables WHERE database = "
        f"'{DATABASE}' AND name = '{table}'",
    )
    assert generation == [{"n": 0}]  # the verified generation was dropped
    check_after(tmp_path, config, gaps)
    refresh_publishes(config, port, "t_kill_prepare", expected(100, "p"))
    assert gaps == []


def test_sigkill_during_retention_keeps_the_new_target_and_finishes_the_drop(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    store = tmp_path / "store.sqlite"
    make_source(tmp_path / "shop.db", rows_of(3, name="r1-"))
    config = project(tmp_path, server, "t_kill_retention")
    code, first = refresh(config, "items")
    assert code == 0, first
    retention = tmp_path / "work" / "retention"

    def dropping() -> bool:
        if store_states(store).count("published") < run:
            return False
        # Published: retention follows within milliseconds. Its journal's first event
        # (the copy's facts) is durable; the DROP's intent comes next.
        return _spin(
            lambda: _retention_state(retention, earlier) == "discarding/retention_planned", 5.0
        )

    # Frozen the moment its journal's first event is seen, the refresh is killed
    # before the DROP is sent (one sent and cut short stays unprovable for its whole
    # dispatch window, a minute). The drop takes milliseconds: a refresh that ends
    # before it is seen published and dropped a copy, and the next one drops again.
    # Each try watches only its own journal: a missed try's finished journal stays.
    for run in range(2, 8):
        make_source(tmp_path / "shop.db", rows_of(5, name=f"r{run}-"))
        earlier = (
            frozenset(j.name for j in retention.iterdir()) if retention.is_dir() else frozenset()
        )
        done = len(earlier)
        at_kill = _frozen_then_killed(
            config,
            dropping,
            functools.partial(_retention_state, retention, earlier),
            "discarding/retention_planned",
        )
        if at_kill is not None:
            break
        assert len(list(retention.iterdir())) == done + 1
    assert at_kill == "discarding/retention_planned", at_kill
    (journal,) = [j for j in retention.iterdir() if journal_state(j) != "discarded/discarded"]
    copy = _planned_table(journal)  # the rollback copy beyond keep_rollback = 1
    # Published before the kill: the target is the new snapshot.
    assert target_rows(port, "t_kill_retention") == expected(5, f"r{run}-")
    gaps: list[str] = []
    kinds = finish_what_status_names(tmp_path, config, gaps)
    assert kinds == ["retention_unfinished"]
    assert as_json(dpone("journal", "verify", str(journal), "--json"))["state"] == "discarded"
    gone = chhttp.rows(
        port,
        f"SELECT count() AS n FROM system.tables WHERE database = '{DATABASE}' AND name = '{copy}'",
    )
    assert gone == [{"n": 0}]
    check_after(tmp_path, config, gaps)
    make_source(tmp_path / "shop.db", rows_of(6, name="last-"))
    refresh_publishes(config, port, "t_kill_retention", expected(6, "last-"))
    # Its own drop's journal names the user the DROP ran as (a later proof of a cut
    # DROP's fate looks for exactly that user in the query log).
    (last,) = [j for j in retention.iterdir() if j.name > journal.name]
    first_event = sorted((last / "events").glob("*"))[0] / "attempt.json"
    named = json.loads(first_event.read_bytes())["principal"]["user"]
    chhttp.query(port, "SYSTEM FLUSH LOGS")
    ran_as = chhttp.rows(
        port,
        "SELECT DISTINCT user FROM system.query_log WHERE query_id = "
        f"'dpone-b02-{last.name}-discard'",
    )
    assert ran_as == [{"user": named}]
    status = as_json(dpone("status", "--config", str(config), "--json"))
    assert status["needs_person"] == []
    if gaps:
        raise StatusGap("; ".join(gaps))


def client_project(
    tmp_path: Path, server: dict[str, Any], target: str, accept: bool = True
) -> Path:
    """A project staging over the client transport (its ungated ingest accepted)."""
    config = project(tmp_path, server, target)
    text = config.read_text().replace("[clickhouse]\n", '[clickhouse]\ntransport = "client"\n')
    accepted = "[publication]\naccept_ungated_ingest = true\n" if accept else ""
    config.write_text(text.replace("[sources.shop]", accepted + "[sources.shop]"))
    return config


def test_the_client_transport_is_refused_unless_its_ungated_ingest_is_accepted(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    config = client_project(tmp_path, server, "t_client_refused", accept=False)
    done = dpone("refresh", "--config", str(config), "items", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    (report,) = json.loads(done.stdout)["tables"]
    assert (report["phase"], report["error"]["code"]) == ("check", "ingest_ungated")
    assert "clickhouse.transport" in report["error"]["message"]
    assert "accept_ungated_ingest" in report["error"]["message"]
    assert list(report["timings"]) == ["check"]  # refused before the export
    # Only publishing is refused: the project loads for every other command.
    status = dpone("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stdout + status.stderr


def test_refresh_over_the_client_transport_and_a_kill_while_loading(
    tmp_path: Path, server: dict[str, Any], clickhouse_client: str
) -> None:
    port = server["http_port"]
    make_source(tmp_path / "shop.db", rows_of(20))
    config = client_project(tmp_path, server, "t_client")
    code, first = refresh(config, "items")
    assert code == 0, first
    assert target_rows(port, "t_client") == expected(20, "n")
    with closing(sqlite3.connect(tmp_path / "shop.db")) as conn, conn:
        conn.execute("DELETE FROM items WHERE id IN (2, 3)")
        conn.execute("UPDATE items SET name = 'x\\y', price = '-0.25' WHERE id = 9")
    code, second = refresh(config, "items")
    assert code == 0, second
    assert second["tables"][0]["previous_rows"] == 20 and second["tables"][0]["rows"] == 18
    now = [r for r in expected(20, "n") if r[0] not in (2, 3)]
    now[[r[0] for r in now].index(9)] = [9, "x\\y", "-0.25"]
    assert target_rows(port, "t_client") == now
    # Staging sent its rows through clickhouse-client (the native protocol).
    sent = chhttp.rows(
        port,
        "SELECT DISTINCT interface FROM system.query_log WHERE query_id = "
        f"'dpone-b02-{second['tables'][0]['attempt_id']}-insert' AND type = 'QueryFinish'",
    )
    assert sent == [{"interface": "TCP"}]
    make_source(tmp_path / "shop.db", rows_of(ROWS, name="c"))
    before = _attempt_ids(tmp_path)

    def loading() -> bool:  # the server runs the INSERT the client sends
        attempt = _new_attempt(tmp_path, before)
        if journal_state(attempt) not in ("creating_staging/intent", "loading/intent"):
            return False
        assert attempt is not None
        insert = f"dpone-b02-{attempt.name}-insert"
        return _spin(
            lambda: bool(
                chhttp.rows(
                    port, f"SELECT 1 AS x FROM system.processes WHERE query_id = '{insert}'"
                )
            ),
            3.0,
        )

    killed_in(tmp_path, config, loading)
    assert target_rows(port, "t_client") == now
    gaps: list[str] = []
    kinds = finish_what_status_names(tmp_path, config, gaps)
    assert kinds in (["loading"], ["verifying"]), kinds
    check_after(tmp_path, config, gaps)
    refresh_publishes(config, port, "t_client", expected(ROWS, "c"))
    if gaps:
        raise StatusGap("; ".join(gaps))
