"""``dpone retire`` and what ``dpone status`` says about tables removed from the project.

One managed server per module (``--protect refresh_db``); each test has its own target,
project file, work dir and store. What is checked is what the server holds
(``system.tables``), what the store and the journals record, and what status prints.
Also here: rollback copies no longer pile up after a publication cut before its
claim (issue 24, item 10).
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
    yield from protected_server(tmp_path_factory, DATABASE, "retire-ch", request.param)


def tables_named(port: int, names: list[str]) -> dict[str, str]:
    """name -> UUID of those of ``names`` that exist in the database now."""
    listed = ", ".join(f"'{n}'" for n in names)
    found = chhttp.rows(
        port,
        f"SELECT name, toString(uuid) AS u FROM system.tables WHERE database = '{DATABASE}' "
        f"AND name IN ({listed})",
    )
    return {str(r["name"]): str(r["u"]) for r in found}


def published_three_times(tmp_path: Path, server: dict[str, Any], target: str) -> Path:
    """A project whose target was published three times (keep 2): the target, 2 copies
    (the third publication dropped the first one's, the empty target it created)."""
    config = project(tmp_path, server, target, keep=2)
    for run in range(3):
        make_source(tmp_path / "shop.db", rows_of(4, name=f"p{run}-"))
        code, done = refresh(config, "items")
        assert code == 0, done
        assert len(done["tables"][0]["dropped_rollback_copies"]) == (run == 2)
    return config


def slot_tables(tmp_path: Path, target: str) -> list[str]:
    """The target and the names its publications' generations have (from status)."""
    status = as_json(dpone("status", "--config", str(tmp_path / "dpone.toml"), "--json"))
    (entry,) = [t for t in [*status["targets"], *status["removed"]] if t["target"].endswith(target)]
    return [target, *[c["table"].split(".", 1)[1] for c in entry["rollback_copies"]]]


def without_table(config: Path) -> None:
    """The project file with its table removed (its source table was dropped)."""
    text = config.read_text()
    config.write_text(text[: text.index("[tables.items]")])


def retire(config: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return dpone("retire", name, "--config", str(config), *args)


def test_retire_a_removed_table_then_status_shows_it_retired_and_a_readded_one_refreshes(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    config = published_three_times(tmp_path, server, "t_retire")
    names = slot_tables(tmp_path, "t_retire")
    before = tables_named(port, names)
    assert len(names) == 3 and set(before) == set(names)  # the target and two copies
    full = config.read_text()
    without_table(config)

    # Status remembers the slot the project file forgot, with what it still holds.
    status = dpone("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stdout
    (removed,) = as_json(status)["removed"]
    qualified = f"{DATABASE}.t_retire"
    command = shlex.join(["dpone", "retire", qualified, "--config", str(config), "--yes"])
    assert removed["target"] == qualified and removed["retired"] is None
    assert removed["target_table"] == {"table": qualified, "uuid": before["t_retire"]}
    assert sorted(c["uuid"] for c in removed["rollback_copies"]) == sorted(
        before[n] for n in names[1:]
    )
    assert removed["command"] == command
    text = dpone("status", "--config", str(config)).stdout
    assert f"{qualified}: removed from the project file, not retired" in text
    assert f"to remove what it holds: {command}" in text

    # Without --yes only the plan: nothing is dropped.
    asked = retire(config, qualified, "--json")
    assert asked.returncode == 2, asked.stdout
    error = as_json(asked)["error"]
    assert error["code"] == "confirmation_required"
    assert sorted(p["table"] for p in error["details"]["planned"]) == sorted(
        f"{DATABASE}.{n}" for n in names
    )
    assert tables_named(port, names) == before

    done = retire(config, qualified, "--yes", "--json")
    assert done.returncode == 0, done.stdout
    report = as_json(done)
    assert report["ok"] is True and report["retired"] is True and report["kept"] == []
    assert sorted((d["table"], d["uuid"]) for d in report["dropped"]) == sorted(
        (f"{DATABASE}.{n}", before[n]) for n in names
    )
    assert [d["role"] for d in report["dropped"]] == ["target", "rollback_copy", "rollback_copy"]
    assert tables_named(port, names) == {}  # nothing of the slot is left on the server
    for dropped in report["dropped"]:  # each drop is its own verified journal
        journal = as_json(dpone("journal", "verify", dropped["journal"], "--json"))
        assert journal["state"] == "discarded"

    status = dpone("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stdout
    (removed,) = as_json(status)["removed"]
    assert removed["retired"]["state"] == "retired"
    assert removed["retired"]["at"] == report["retired_at"]
    assert len(removed["retired"]["dropped"]) == 3
    assert removed["target_table"] is None and removed["rollback_copies"] == []
    assert removed["command"] is None
    text = dpone("status", "--config", str(config)).stdout
    assert f"{qualified}: removed from the project file, retired {report['retired_at']}" in text

    again = retire(config, qualified, "--yes", "--json")  # idempotent: nothing left to drop
    assert again.returncode == 0, again.stdout
    assert as_json(again)["dropped"] == [] and as_json(again)["retired_at"] == report["retired_at"]

    # The table comes back under the same name: a first publication of a new life.
    config.write_text(full)
    make_source(tmp_path / "shop.db", rows_of(6, name="back-"))
    code, back = refresh(config, "items")
    assert code == 0, back
    assert back["tables"][0]["created_target"] is True
    assert target_rows(port, "t_retire") == [[i, f"back-{i}\ttab", f"{i}.25"] for i in range(1, 7)]
    now = as_json(dpone("status", "--config", str(config), "--json"))
    (entry,) = now["targets"]
    assert now["removed"] == [] and entry["retired"] is None
    assert entry["last_publication"]["rows"] == 6
    assert entry["last_publication"]["uuid"] == back["tables"][0]["target_uuid_after"]


def test_retire_refuses_while_a_publication_is_unfinished(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    make_source(tmp_path / "shop.db", rows_of(3))
    config = project(tmp_path, server, "t_retire_blocked")
    assert refresh(config, "items")[0] == 0
    make_source(tmp_path / "shop.db", rows_of(5))
    store = tmp_path / "store.sqlite"
    killed(
        ["refresh", "--config", str(config), "items"],
        lambda: "exchange_intent" in store_states(store),
    )
    assert "exchange_intent" in store_states(store)
    held = tables_named(port, ["t_retire_blocked"])

    refused = retire(config, "items", "--yes", "--json")
    assert refused.returncode == 1, refused.stdout
    error = as_json(refused)["error"]
    assert error["code"] == "publication_unfinished" and "dpone status" in error["message"]
    reconcile = error["details"]["next_command"]
    assert shlex.split(reconcile)[:3] == ["dpone", "snapshot", "reconcile"]
    assert tables_named(port, ["t_retire_blocked"]) == held  # nothing was dropped
    assert not (tmp_path / "work" / "retire").exists()

    settled = as_json(dpone(*shlex.split(reconcile)[1:], "--json"))
    assert settled["state"] in ("published", "not_published"), settled
    for item in as_json(dpone("status", "--config", str(config), "--json"))["needs_person"]:
        assert dpone(*shlex.split(item["command"])[1:]).returncode == 0  # a discard, if any
    done = retire(config, "items", "--yes", "--json")
    assert done.returncode == 0, done.stdout
    assert tables_named(port, ["t_retire_blocked"]) == {}


def killed(args: list[str], ready: Callable[[], bool]) -> bool:
    """Run ``dpone ARGS``, SIGSTOP it once ``ready()`` holds, then SIGKILL it.

    False when the command ended before ``ready()`` was seen to hold, or was frozen a
    moment late, when ``ready()`` no longer held: then it is let go on (SIGCONT) to end
    as it would, a missed try, never killed where the test did not mean to.
    """
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dpone", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready() and process.poll() is None and time.monotonic() < deadline:
            pass  # no sleep: the states waited for last milliseconds
        process.send_signal(signal.SIGSTOP)
        if process.poll() is not None:
            return False
        if not ready():
            process.send_signal(signal.SIGCONT)
            process.wait(timeout=120)
            return False
        return True
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


def _planned_drop(retire_dir: Path) -> bool:
    """A retire journal has recorded its table's facts and not yet its DROP's intent."""
    journals = list(retire_dir.iterdir()) if retire_dir.is_dir() else []
    return any(journal_state(j) == "discarding/retention_planned" for j in journals)


def test_sigkill_mid_retire_then_status_names_the_retire_that_finishes_it(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    # The drops take milliseconds each: a retire that ends before it is frozen is tried
    # again on a new table (a finished retire leaves nothing to cut).
    for attempt in range(5):
        home = tmp_path / f"try{attempt}"
        home.mkdir()
        target = f"t_kill_retire_{attempt}"
        config = published_three_times(home, server, target)
        names = slot_tables(home, target)
        before = tables_named(port, names)
        assert len(before) == 3
        retire_dir = home / "work" / "retire"
        args = ["retire", "items", "--config", str(config), "--yes"]
        if killed(args, functools.partial(_planned_drop, retire_dir)):
            break
    else:
        pytest.fail("no retire was seen between a drop's facts and its DROP in five tries")
    (cut,) = [j for j in retire_dir.iterdir() if journal_state(j) != "discarded/discarded"]
    assert journal_state(cut) == "discarding/retention_planned"
    left = tables_named(port, names)
    assert left and set(left) <= set(names)  # halfway: some dropped, the cut one is there
    assert all(left[n] == before[n] for n in left)

    status = dpone("status", "--config", str(config), "--json")
    assert status.returncode == 1, status.stdout
    (item,) = as_json(status)["needs_person"]
    assert item["kind"] == "retire_unfinished"
    assert item["command"] == shlex.join(
        ["dpone", "retire", "items", "--config", str(config), "--yes"]
    )
    assert "retiring" in dpone("status", "--config", str(config)).stdout

    done = dpone(*shlex.split(item["command"])[1:], "--json")
    assert done.returncode == 0, done.stdout
    report = as_json(done)
    assert [f["journal"] for f in report["finished_journals"]] == [str(cut)]
    assert report["finished_journals"][0]["state"] == "discarded"
    assert tables_named(port, names) == {}
    assert journal_state(cut) == "discarded/discarded"
    status = dpone("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stdout
    (entry,) = as_json(status)["targets"]
    assert entry["retired"]["state"] == "retired" and entry["last_publication"] is None
    text = dpone("status", "--config", str(config)).stdout
    assert f"items -> {DATABASE}.{target}: retired" in text


def _prepared_then_killed(config: Path, store: Path) -> None:
    """A refresh killed after its intent is PREPARED and before its claim (retried)."""
    for run in range(8):
        known = len(store_states(store))
        make_source(config.parent / "shop.db", rows_of(4, name=f"cut{run}-"))
        killed(
            ["refresh", "--config", str(config), "items"],
            functools.partial(_more_records, store, known),
        )
        states = store_states(store)
        if states[-1] == "prepared":
            return
        if states[-1] != "published":  # claimed: reconcile it, and try again
            (item,) = [
                i
                for i in as_json(dpone("status", "--config", str(config), "--json"))["needs_person"]
                if i["kind"] in ("exchange_intent", "commit_unknown")
            ]
            # Killed after its claim: the reconcile decides published (exit 0), or
            # not_published (exit 1, a decision too) when the EXCHANGE was never sent.
            done = dpone(*shlex.split(item["command"])[1:], "--json")
            decided = as_json(done).get("state")
            assert (done.returncode, decided) in ((0, "published"), (1, "not_published")), (
                done.stdout,
                done.stderr,
            )
    pytest.fail("no refresh was seen between its prepare and its claim in eight tries")


def _more_records(store: Path, known: int) -> bool:
    return len(store_states(store)) > known


def test_rollback_copies_do_not_pile_up_after_a_publication_cut_before_its_claim(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    store = tmp_path / "store.sqlite"
    config = project(tmp_path, server, "t_pile", keep=1)
    for run in range(2):
        make_source(tmp_path / "shop.db", rows_of(4, name=f"a{run}-"))
        assert refresh(config, "items")[0] == 0
    _prepared_then_killed(config, store)
    (cut,) = [doc for state, doc in _intents(store) if state == "prepared"]
    # Unattended, nobody cancels it: the next nights refresh again.
    reports = []
    for run in range(3):
        make_source(tmp_path / "shop.db", rows_of(4, name=f"b{run}-"))
        code, done = refresh(config, "items")
        assert code == 0, done
        reports.append(done["tables"][0])
    assert [r["error"] for r in reports] == [None, None, None]  # retention ran every time
    # Of every table the slot's publications used, the target and keep_rollback = 1
    # copy are left.
    used = ["t_pile", *[doc["generation"]["table"] for _, doc in _intents(store)]]
    assert sorted(tables_named(port, used)) == sorted(["t_pile", reports[-1]["generation_table"]])
    status = as_json(dpone("status", "--config", str(config), "--json"))
    (entry,) = status["targets"]
    assert [c["uuid"] for c in entry["rollback_copies"]] == [reports[-1]["target_uuid_before"]]
    # The superseded intent can never be claimed: no cancel is asked for, and its
    # generation was discarded through its staging journal.
    kinds = [i["kind"] for i in status["needs_person"]]
    assert "prepared" not in kinds and "staged_unpublished" not in kinds, status["needs_person"]
    attempt = tmp_path / "work" / "attempts" / cut["attempt"]["attempt_id"]
    assert journal_state(attempt) == "discarded/discarded"
    assert reports[0]["dropped_rollback_copies"][-1] == f"{DATABASE}.{cut['generation']['table']}"


def _intents(store: Path) -> list[tuple[str, dict[str, Any]]]:
    """(state, intent document) of every stored intent, read only, oldest first."""
    with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        rows = conn.execute(
            "SELECT r.state, i.intent_bytes FROM intents i JOIN records r USING (intent_sha256)"
            " ORDER BY i.created_at"
        )
        return [(str(state), json.loads(bytes(data))) for state, data in rows]


def test_the_empty_target_of_a_first_publication_cut_before_its_claim_is_not_kept_forever(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    # The first refresh of a new target creates the empty target at prepare; it is
    # killed before its claim (retried on a new target when the kill comes too late).
    for attempt in range(5):
        home = tmp_path / f"try{attempt}"
        home.mkdir()
        target = f"t_first_cut_{attempt}"
        config = project(home, server, target, keep=1)
        store = home / "store.sqlite"
        make_source(home / "shop.db", rows_of(4, name="first-"))
        killed(
            ["refresh", "--config", str(config), "items"],
            functools.partial(_more_records, store, 0),
        )
        if store_states(store) == ["prepared"]:
            break
    else:
        pytest.fail("no first refresh was seen between its prepare and its claim in five tries")
    empty = tables_named(port, [target])
    assert len(empty) == 1  # the empty target the cut publication created
    for _ in range(2):  # status names the cancel, then the discard of its generation
        for item in as_json(dpone("status", "--config", str(config), "--json"))["needs_person"]:
            assert item["kind"] in ("prepared", "staged_unpublished"), item
            assert dpone(*shlex.split(item["command"])[1:]).returncode == 0, item
    reports = []
    for run in range(3):
        make_source(home / "shop.db", rows_of(4, name=f"n{run}-"))
        code, done = refresh(config, "items")
        assert code == 0, done
        reports.append(done["tables"][0])
    assert reports[0]["target_uuid_before"] == empty[target]  # published over the empty one
    assert [r["error"] for r in reports] == [None, None, None]
    # The empty target dpone created (its CREATE is in the cancelled intent's history)
    # was proven dpone's and dropped like any copy: keep_rollback = 1 is kept.
    used = [target, *[doc["generation"]["table"] for _, doc in _intents(store)]]
    assert sorted(tables_named(port, used)) == sorted([target, reports[-1]["generation_table"]])
    assert empty[target] not in tables_named(port, used).values()
