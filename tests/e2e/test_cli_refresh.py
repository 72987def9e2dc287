"""``dpone refresh``, ``status``, ``check`` and ``init`` as a user runs them.

One managed server per module, started by the CLI with ``--protect refresh_db``; each
test has its own target table, project file and work dir.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import (
    DATABASE,
    SERVER_KINDS,
    converting,
    killed_in,
    make_source,
    project,
    protected_server,
    refresh,
    rows_of,
    store_states,
    target_rows,
)


@pytest.fixture(scope="module", params=SERVER_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "refresh-ch", request.param)


# A test of what only the managed server has (its data directory, its process).
managed_only = pytest.mark.parametrize("server", ["managed"], indirect=True)


def test_first_and_second_refresh_make_the_target_equal_the_source(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(20))
    config = project(tmp_path, server, "t_two")
    code, first = refresh(config, "items")
    assert code == 0, first
    report = first["tables"][0]
    assert first["ok"] is True and report["outcome"] == "published" and report["created_target"]
    assert report["rows"] == 20 and report["previous_rows"] == 0
    assert set(report["timings"]) == {
        "check",
        "export",
        "stage",
        "prepare",
        "shrink_guard",
        "publish",
        "retention",
    }
    # Each phase says what it sent; reads share kept connections (about 195 requests,
    # each on a new connection, before 2026-12-05; 101 on 2026-12-07). Each mutation,
    # each side-by-side sign-in of a remote pool's verification and the keeper's reads
    # beside them open their own.
    assert set(report["traffic"]) == set(report["timings"])
    sent = report["traffic"].values()
    requests = sum(p["requests"] for p in sent)
    opened = sum(p["new_connections"] for p in sent)
    assert requests < 108 and 1 <= opened <= 22 and opened * 4 < requests, report["traffic"]
    with sqlite3.connect(tmp_path / "shop.db") as conn:
        conn.execute("DELETE FROM items WHERE id IN (3, 4, 5)")
        conn.execute("UPDATE items SET name = 'changed', price = '0.01' WHERE id = 7")
        conn.execute("INSERT INTO items VALUES (100, 'new', '9.99')")
    conn.close()
    code, second = refresh(config, "--all")
    assert code == 0, second
    again = second["tables"][0]
    assert again["previous_rows"] == 20 and again["rows"] == 18
    assert again["target_uuid_before"] == report["target_uuid_after"]
    expected = [[i, f"n{i}\ttab", f"{i}.25"] for i in range(1, 21) if i not in (3, 4, 5)]
    expected[[r[0] for r in expected].index(7)] = [7, "changed", "0.01"]
    assert target_rows(server["http_port"], "t_two") == [*expected, [100, "new", "9.99"]]
    # The previous target is the rollback copy under the second generation's name.
    copy = chhttp.rows(
        server["http_port"],
        f"SELECT toString(uuid) AS u FROM system.tables WHERE "
        f"database = '{DATABASE}' AND name = '{again['generation_table']}'",
    )
    assert copy == [{"u": report["target_uuid_after"]}]
    shown = as_json(
        dpone(
            "snapshot",
            "show",
            again["intent_sha256"],
            "--store",
            str(tmp_path / "store.sqlite"),
            "--json",
        )
    )
    assert shown["state"] == "published" and shown["source_rows"] == 18


def test_shrink_guard_refuses_then_allow_shrink_publishes(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(10))
    config = project(tmp_path, server, "t_shrink")
    assert refresh(config, "items")[0] == 0
    before = target_rows(server["http_port"], "t_shrink")
    make_source(tmp_path / "shop.db", rows_of(4))
    code, refused = refresh(config, "items")
    report = refused["tables"][0]
    assert code == 1 and refused["ok"] is False
    assert (report["outcome"], report["phase"], report["error"]["code"]) == (
        "not_published",
        "shrink_guard",
        "shrink_refused",
    )
    assert (report["state"], report["revision"]) == ("not_published", 2)
    assert target_rows(server["http_port"], "t_shrink") == before
    gone = chhttp.rows(
        server["http_port"],
        f"SELECT count() AS n FROM system.tables WHERE "
        f"database = '{DATABASE}' AND name = '{report['generation_table']}'",
    )
    assert gone == [{"n": 0}]  # the refused generation was discarded
    journal = dpone("journal", "verify", report["journal"], "--json")
    assert as_json(journal)["state"] == "discarded"
    code, allowed = refresh(config, "items", "--allow-shrink")
    assert code == 0, allowed
    assert [r[0] for r in target_rows(server["http_port"], "t_shrink")] == [1, 2, 3, 4]


def test_empty_source_publishes_an_empty_target(tmp_path: Path, server: dict[str, Any]) -> None:
    make_source(tmp_path / "shop.db", [])
    config = project(tmp_path, server, "t_empty")
    code, done = refresh(config, "items")
    assert code == 0, done
    assert done["tables"][0]["rows"] == 0
    assert target_rows(server["http_port"], "t_empty") == []


def test_failing_source_leaves_the_target_and_names_the_phase(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(3))
    config = project(tmp_path, server, "t_fail")
    assert refresh(config, "items")[0] == 0
    (tmp_path / "shop.db").write_bytes(b"not a database, just bytes")
    code, failed = refresh(config, "items")
    report = failed["tables"][0]
    assert code == 1 and report["phase"] == "export" and report["outcome"] == "failed"
    assert report["error"]["code"] == "not_a_sqlite_database"
    assert [r[0] for r in target_rows(server["http_port"], "t_fail")] == [1, 2, 3]
    text = dpone("refresh", "--config", str(config), "items")
    assert text.returncode == 1 and "NOT published" in text.stdout and "unchanged" in text.stdout


def test_several_tables_continue_unless_fail_fast(tmp_path: Path, server: dict[str, Any]) -> None:
    make_source(tmp_path / "shop.db", rows_of(3))
    bad = '[tables.broken]\nsource = "shop"\ntable = "no_such_table"\ntarget = "refresh_db.t_broken"\n'
    config = project(tmp_path, server, "t_multi")
    config.write_text(bad + config.read_text())
    code, both = refresh(config, "broken", "items")
    assert code == 1 and [t["ok"] for t in both["tables"]] == [False, True]
    code, fast = refresh(config, "broken", "items", "--fail-fast")
    assert code == 1 and [t["outcome"] for t in fast["tables"]] == ["failed", "skipped"]
    # Every table after the first failure is skipped, not only the next one.
    other = '[tables.other]\nsource = "shop"\ntable = "items"\ntarget = "refresh_db.t_multi2"\n'
    config.write_text(config.read_text() + other)
    code, fast = refresh(config, "broken", "items", "other", "--fail-fast")
    assert code == 1
    assert [t["outcome"] for t in fast["tables"]] == ["failed", "skipped", "skipped"], fast


def test_bad_project_file_names_every_problem_with_its_location(tmp_path: Path) -> None:
    config = tmp_path / "dpone.toml"
    config.write_text(
        '[project]\nkeep_rollback = "two"\n'  # line 2: wrong type
        '[sources.shop]\nkind = "sqlite"\npath = "s.db"\npassword = "x"\n'  # line 6: a secret
        '[tables.items]\nsource = "nope"\n'  # line 8: unknown source
        'target = "nodot"\nshrink_guard = 1.5\ncolour = "red"\n'
    )
    done = dpone("check", "--config", str(config), "--json")
    assert done.returncode == 2
    problems = {p["key"]: p for p in as_json(done)["error"]["details"]["problems"]}
    assert {k: v["line"] for k, v in problems.items()} == {
        "project.keep_rollback": 2,
        "sources.shop.password": 6,
        "tables.items.source": 8,
        "tables.items.table": 7,
        "tables.items.target": 9,
        "tables.items.shrink_guard": 10,
        "tables.items.colour": 11,
    }
    assert "password_env" in problems["sources.shop.password"]["message"]
    text = dpone("check", "--config", str(config))
    assert text.returncode == 2 and "tables.items.colour (line 11): unknown key" in text.stderr
    config.write_text("[project\n")
    broken = as_json(dpone("check", "--config", str(config), "--json"))
    assert broken["error"]["details"]["problems"][0]["line"] == 1


@managed_only
def test_init_writes_an_example_that_check_accepts(tmp_path: Path, server: dict[str, Any]) -> None:
    config = tmp_path / "dpone.toml"
    assert dpone("init", "--config", str(config)).returncode == 0
    assert dpone("init", "--config", str(config)).returncode == 2  # never overwrites
    text = config.read_text().replace('".dpone/clickhouse"', f'"{server["data_dir"]}"')
    config.write_text(text.replace("dpone_demo.customers", f"{DATABASE}.t_init"))
    missing = as_json(dpone("check", "--config", str(config), "--json"))
    assert missing["ok"] is False
    assert [p["key"] for p in missing["problems"]] == ["tables.customers.table"]
    assert missing["error"]["code"] == missing["problems"][0]["code"]  # a failure's error object
    assert missing["error"]["details"]["problems"] == missing["problems"]
    with sqlite3.connect(tmp_path / "shop.db") as conn:
        conn.execute("CREATE TABLE customers (id bigint NOT NULL)")
    conn.close()
    assert as_json(dpone("check", "--config", str(config), "--json"))["ok"] is True
    config.write_text(text.replace("dpone_demo.customers", "unprotected_db.t_init"))
    refused = as_json(dpone("check", "--config", str(config), "--json"))
    assert [p["code"] for p in refused["problems"]] == ["database_not_protected"]


def three_refreshes(
    tmp_path: Path, server: dict[str, Any], target: str
) -> tuple[Path, list[dict[str, Any]]]:
    """The project of ``items`` into ``target``, and the reports of three refreshes of
    five rows, each with other names."""
    make_source(tmp_path / "shop.db", rows_of(5))
    config = project(tmp_path, server, target)
    reports = []
    for run in range(3):
        make_source(tmp_path / "shop.db", rows_of(5, name=f"r{run}-"))
        code, done = refresh(config, "items")
        assert code == 0, done
        reports.append(done["tables"][0])
    return config, reports


def test_status_and_retention_keep_one_rollback_copy(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    config, reports = three_refreshes(tmp_path, server, "t_keep")
    # Each publication after the first dropped the copy before it, verified and journaled.
    assert reports[1]["dropped_rollback_copies"] == [f"{DATABASE}.{reports[0]['generation_table']}"]
    assert reports[2]["dropped_rollback_copies"] == [f"{DATABASE}.{reports[1]['generation_table']}"]
    retention = sorted((tmp_path / "work" / "retention").iterdir())
    assert len(retention) == 2
    assert as_json(dpone("journal", "verify", str(retention[0]), "--json"))["state"] == "discarded"
    status = dpone("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stdout
    target = as_json(status)["targets"][0]
    assert target["last_publication"]["rows"] == 5
    assert target["last_publication"]["uuid"] == reports[2]["target_uuid_after"]
    assert [c["uuid"] for c in target["rollback_copies"]] == [reports[2]["target_uuid_before"]]
    # The copies of every publication the store remembers are observed at once: status
    # sends the same few requests however long the history (issue 33: at most 5).
    assert as_json(status)["traffic"]["requests"] <= 5, as_json(status)["traffic"]


def test_sigkill_during_publish_then_status_names_reconcile(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(6))
    config = project(tmp_path, server, "t_kill_publish")
    assert refresh(config, "items")[0] == 0
    make_source(tmp_path / "shop.db", rows_of(7))
    store = tmp_path / "store.sqlite"
    killed_in(tmp_path, config, lambda: "exchange_intent" in store_states(store))
    status = dpone("status", "--config", str(config), "--json")
    assert status.returncode == 1
    needs = as_json(status)["needs_person"]
    assert [n["kind"] for n in needs] == ["exchange_intent"]
    command = needs[0]["command"].split()
    assert command[:3] == ["dpone", "snapshot", "reconcile"]
    done = as_json(dpone(*command[1:], "--json"))
    # Killed after the claim: the EXCHANGE was sent (published) or provably not (the
    # generation then waits for its discard, which status names next).
    assert done["state"] in ("published", "not_published"), done
    rows = {"published": 7, "not_published": 6}[done["state"]]
    assert len(target_rows(server["http_port"], "t_kill_publish")) == rows
    if done["state"] == "not_published":
        (item,) = as_json(dpone("status", "--config", str(config), "--json"))["needs_person"]
        assert item["kind"] == "staged_unpublished" and item["command"].split()[:3] == [
            "dpone",
            "attempts",
            "discard",
        ]
        assert dpone(*item["command"].split()[1:]).returncode == 0
    assert dpone("status", "--config", str(config)).returncode == 0


def test_sigkill_during_stage_then_status_names_the_finishing_command(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(4))
    config = project(tmp_path, server, "t_kill_stage")
    assert refresh(config, "items")[0] == 0
    before = target_rows(server["http_port"], "t_kill_stage")
    make_source(tmp_path / "shop.db", rows_of(200_000))
    attempts = tmp_path / "work" / "attempts"
    first = {d.name for d in attempts.iterdir()}

    def staging() -> bool:  # the new attempt converts its rows: admitted, nothing sent yet
        new = [d for d in attempts.iterdir() if d.name not in first]
        return bool(new) and converting(new[0])

    killed_in(tmp_path, config, staging)
    assert target_rows(server["http_port"], "t_kill_stage") == before
    status = as_json(dpone("status", "--config", str(config), "--json"))
    assert status["ok"] is False
    # One item, the killed attempt: its finishing command also ends its ingest lease.
    (item,) = status["needs_person"]
    command = item["command"].split()
    assert command[:3] in (["dpone", "attempts", "cleanup"], ["dpone", "attempts", "discard"])
    assert [lease["holder"] for lease in status["active_leases"]] == (
        ["gone"] if command[2] == "cleanup" else ["live"]
    )
    done = dpone(*command[1:], "--json")
    assert done.returncode == 0, done.stdout
    assert as_json(dpone("status", "--config", str(config), "--json"))["needs_person"] == []
    assert json.loads(done.stdout)["state"] in ("failed_cleaned", "discarded")


def test_status_with_a_store_that_is_not_the_refreshes_says_so(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(3))
    config = project(tmp_path, server, "t_store_moved")
    assert refresh(config, "items")[0] == 0
    moved = config.read_text().replace('store = "store.sqlite"', 'store = "elsewhere.sqlite"')
    config.write_text(moved)
    done = dpone("status", "--config", str(config), "--json")
    assert done.returncode == 1, done.stdout
    needs = as_json(done)["needs_person"]
    assert len(needs) == 1, needs
    (item,) = needs
    assert (item["kind"], item["target"]) == ("store_missing", f"{DATABASE}.t_store_moved")
    assert "elsewhere.sqlite" in item["message"] and not (tmp_path / "elsewhere.sqlite").exists()
    text = dpone("status", "--config", str(config))
    assert text.returncode == 1 and "NEEDS A PERSON: store_missing" in text.stdout


def test_a_validation_warning_is_said_in_the_refresh_report(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    """With the compiled converter off, the export's validation and the stage go to the
    reference: the refresh succeeds, and its report carries the validation's warning."""
    make_source(tmp_path / "shop.db", rows_of(3))
    config = project(tmp_path, server, "t_reference")
    off = {"DPONE_NATIVE": "0"}
    done = dpone("refresh", "--config", str(config), "items", "--json", extra_env=off)
    report = as_json(done)["tables"][0]
    assert done.returncode == 0 and report["ok"], report
    (warning,) = report["warnings"]
    assert "switched off (DPONE_NATIVE=0)" in warning and "Python reference" in warning
    assert chhttp.query(server["http_port"], f"SELECT count() FROM {DATABASE}.t_reference") == "3\n"
    text = dpone("refresh", "--config", str(config), "items", extra_env=off)
    assert text.returncode == 0, text.stderr
    assert "dpone: warning: the compiled converter is switched off" in text.stderr
    assert "dpone: warning" not in text.stdout


def test_the_projects_drain_gate_settings_reach_the_refresh_publisher(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    from dpone.project.config import load_project
    from dpone.project.table_run import publication_for
    from dpone.publication.authority.snapshot_authority import SnapshotAuthority
    from dpone.publication.dispatch.executor import ClickHouseSnapshotExecutor

    config = project(
        tmp_path,
        server,
        "t_gate",
        extra="[publication]\nsession_timeout_seconds = 3\nsession_margin_seconds = 4.5\n",
    )
    loaded = load_project(config)
    parts = publication_for(loaded, loaded.tables["items"])
    executor = parts.publisher.executor
    authority = parts.publisher.authority
    assert isinstance(executor, ClickHouseSnapshotExecutor)
    assert isinstance(authority, SnapshotAuthority)
    assert executor.session_timeout == 3
    assert authority.policy.session_timeout == 3
    assert authority.policy.session_margin_seconds == 4.5


@managed_only
def test_every_directory_dpone_creates_for_a_project_is_private(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    """Before: work/attempts, work/retention and work/rollbacks (and the store's
    parents) were made 0755 under the usual umask (issue 37)."""
    make_source(tmp_path / "shop.db", rows_of(3))
    config = project(tmp_path, server, "t_private")
    text = config.read_text().replace('work_dir = "work"', 'work_dir = "state/work"')
    config.write_text(text.replace('store = "store.sqlite"', 'store = "state/db/store.sqlite"'))
    previous = os.umask(0o022)  # the usual one: what it lets through is what dpone asked
    try:
        for _ in range(2):
            code, done = refresh(config, "items")
            assert code == 0, done
        rolled = dpone("rollback", "items", "--config", str(config), "--json")
        assert rolled.returncode == 0, rolled.stdout
    finally:
        os.umask(previous)
    made = [tmp_path / "state", *(p for p in (tmp_path / "state").rglob("*") if p.is_dir())]
    names = {p.relative_to(tmp_path).as_posix() for p in made}
    assert {"state/work/attempts", "state/work/retention", "state/work/rollbacks"} <= names
    assert "state/db" in names
    wide = {p.relative_to(tmp_path).as_posix(): oct(p.stat().st_mode & 0o777) for p in made}
    assert {k: v for k, v in wide.items() if int(v, 8) & 0o077} == {}, wide


def test_a_steady_refresh_checks_and_keeps_its_copies_in_few_requests(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    """Issue 33: each request of a refresh is one more round trip. A refresh of a table
    dpone already publishes sends, in its check, one read of the ownership markers
    (three before: the check's, the claim's and the issuer's), one of the managed
    server's version and the target database's existence and grants (three before),
    and takes the target's columns from its observation of the target (read again
    before); its retention observes the copies in one read (two before) beside each
    copy's verified drop."""
    _, reports = three_refreshes(tmp_path, server, "t_trips")
    traffic = [{k: v["requests"] for k, v in r["traffic"].items()} for r in reports]
    # Before: the check sent 11 requests on the managed server (36 on the remote one,
    # whose check also verifies the installed pool), and retention 2, then 4.
    most = 6 if server["kind"] == "managed" else 32
    assert [t["check"] <= most for t in traffic[1:]] == [True, True], traffic
    # Retention observes the copies in one read; the later runs each drop one (the DROP
    # and the count that verifies it).
    assert [t["retention"] for t in traffic] == [1, 3, 3], traffic
