"""Several projects on one managed server: a pool each, and one store per pool and slot.

One server per module, started by the CLI with the default pool over ``shared_main``
and two named pools (``a`` over ``shared_a``, ``b`` over ``shared_b``). Each project is
a directory of its own with its own store, as two teams' jobs would be.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dpone.localserver.principal_pool import PoolNames
from dpone.ports.composition_snapshot import TargetSlot
from dpone.publication.principals.ownership import OwnedElsewhere, Owner, claim
from dpone.publication.principals.server_access import ServerAccess
from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.staging import export_hostile

MAIN, DB_A, DB_B = "shared_main", "shared_a", "shared_b"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data_dir = tmp_path_factory.mktemp("shared-ch") / "ch"
    started = dpone(
        "server",
        "start",
        "--data-dir",
        str(data_dir),
        "--protect",
        MAIN,
        "--pool",
        f"a:{DB_A}",
        "--pool",
        f"b:{DB_B}",
        "--json",
    )
    assert started.returncode == 0, started.stdout + started.stderr
    info = as_json(started)
    assert info["pools"] == {"a": [DB_A], "b": [DB_B]}
    chhttp.register_server(info["http_port"], data_dir)
    try:
        yield {**info, "data_dir": data_dir}
    finally:
        dpone("server", "stop", "--data-dir", str(data_dir))


def make_project(
    root: Path, server: dict[str, Any], targets: dict[str, str], pool: str = ""
) -> Path:
    """A project in ``root``: one SQLite source, a table per ``name -> db.target``."""
    root.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(root / "src.db") as conn:
        for name in targets:
            conn.execute(f"CREATE TABLE {name} (id bigint NOT NULL, label nvarchar(20))")
            conn.executemany(
                f"INSERT INTO {name} VALUES (?, ?)", [(i, f"{name}-{i}") for i in range(1, 31)]
            )
    conn.close()
    pool_key = f'pool = "{pool}"\n' if pool else ""
    tables = "".join(
        f'[tables.{name}]\nsource = "src"\ntable = "{name}"\ntarget = "{target}"\norder_by = "id"\n'
        for name, target in targets.items()
    )
    config = root / "dpone.toml"
    config.write_text(
        '[project]\nwork_dir = "work"\nstore = "store.sqlite"\n'
        f'[clickhouse]\ndata_dir = "{server["data_dir"]}"\n{pool_key}'
        '[sources.src]\nkind = "sqlite"\npath = "src.db"\n' + tables
    )
    return config


def refresh(config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = dpone("refresh", "--config", str(config), *args, "--json")
    return done.returncode, as_json(done)


def markers(port: int) -> list[dict[str, Any]]:
    return chhttp.rows(
        port,
        "SELECT name, comment FROM system.tables WHERE database = '_dpone_identity' "
        "AND startsWith(name, 'owner_') ORDER BY name",
    )


def store_id(config: Path) -> str:
    with sqlite3.connect(config.parent / "store.sqlite") as conn:
        (facts,) = conn.execute(
            "SELECT facts FROM steps WHERE key = 'store/identity' ORDER BY id LIMIT 1"
        ).fetchone()
    conn.close()
    return str(json.loads(facts)["store"])


def leases(config: Path) -> int:
    store = config.parent / "store.sqlite"
    if not store.exists():
        return 0
    with sqlite3.connect(store) as conn:
        (count,) = conn.execute("SELECT count(*) FROM leases").fetchone()
    conn.close()
    return int(count)


def exported(config: Path) -> list[Path]:
    work = config.parent / "work"
    return [p for p in work.rglob("*") if p.is_file() and "exports" in p.parts]


def target_labels(port: int, target: str) -> list[str]:
    found = chhttp.rows(port, f"SELECT label FROM {target} ORDER BY id")
    return [str(r["label"]) for r in found]


def test_a_second_store_on_one_pool_is_refused_before_its_export(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    first = make_project(tmp_path / "one", server, {"t_one": f"{MAIN}.t_one"})
    second = make_project(tmp_path / "two", server, {"t_two": f"{MAIN}.t_two"})
    code, report = refresh(first, "--all")
    assert code == 0, report
    owner = store_id(first)
    before = markers(port)
    assert owner in before[0]["comment"]

    # `dpone check` says so, and makes no marker of its own.
    checked = dpone("check", "--config", str(second), "--json")
    assert checked.returncode != 0
    codes = [p["code"] for p in as_json(checked)["problems"]]
    assert "pool_owned_elsewhere" in codes, codes
    assert markers(port) == before

    code, report = refresh(second, "--all")
    assert code != 0
    table = report["tables"][0]
    assert (table["phase"], table["error"]["code"]) == ("check", "pool_owned_elsewhere"), table
    message = table["error"]["message"]
    # Refused before its store was even made: nothing of the second project exists yet.
    assert owner in message and "not made yet" in message, message
    assert not (second.parent / "store.sqlite").exists()
    command = table["error"]["details"]["next_command"]
    assert command.split()[:3] == ["dpone", "pool", "hand-over"] and owner in command
    # Nothing was leased, exported or created for the refused store.
    assert leases(second) == 0 and exported(second) == []
    assert (
        chhttp.rows(
            port, f"SELECT name FROM system.tables WHERE database = '{MAIN}' AND name = 't_two'"
        )
        == []
    )

    # The first store is gone (say): the pool is handed over, and the second refreshes.
    handed = dpone("pool", "hand-over", "--config", str(second), "--from", owner, "--json")
    assert handed.returncode == 0, handed.stdout + handed.stderr
    moved = as_json(handed)["markers"]
    assert [m["handed_over"] for m in moved if m["marks"] == "pool"] == [True]
    code, report = refresh(second, "--all")
    assert code == 0, report
    assert target_labels(port, f"{MAIN}.t_two") == [f"t_two-{i}" for i in range(1, 31)]
    # And now the first store is the one refused.
    code, report = refresh(first, "--all")
    assert report["tables"][0]["error"]["code"] == "pool_owned_elsewhere", report


def test_a_slot_another_store_publishes_is_refused_before_its_export(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    first = make_project(tmp_path / "one", server, {"t_kept": f"{MAIN}.t_kept"})
    assert refresh(first, "--all")[0] == 0
    owner = store_id(first)
    # A new store takes the pool over (the old one "gone"), but not the old store's slot:
    # its project names only another table.
    second = make_project(tmp_path / "two", server, {"t_new": f"{MAIN}.t_new"})
    handed = dpone("pool", "hand-over", "--config", str(second), "--from", owner, "--json")
    assert handed.returncode == 0, handed.stdout + handed.stderr
    assert refresh(second, "--all")[0] == 0
    # The second project now also names the first one's target.
    with sqlite3.connect(second.parent / "src.db") as conn:
        conn.execute("CREATE TABLE t_kept (id bigint NOT NULL, label nvarchar(20))")
        conn.execute("INSERT INTO t_kept VALUES (1, 'intruder')")
    conn.close()
    second.write_text(
        second.read_text()
        + f'[tables.t_kept]\nsource = "src"\ntable = "t_kept"\ntarget = "{MAIN}.t_kept"\n'
        'order_by = "id"\n'
    )
    code, report = refresh(second, "t_kept")
    assert code != 0
    table = report["tables"][0]
    assert (table["phase"], table["error"]["code"]) == ("check", "slot_owned_elsewhere"), table
    assert owner in table["error"]["message"] and f"{MAIN}.t_kept" in table["error"]["message"]
    assert exported(second) == [] or all("t_kept" not in str(p) for p in exported(second))
    assert target_labels(port, f"{MAIN}.t_kept") == [f"t_kept-{i}" for i in range(1, 31)]


def test_two_projects_with_their_own_pools_refresh_at_once(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    projects = {
        pool: make_project(
            tmp_path / pool,
            server,
            {f"{pool}_{i}": f"{db}.{pool}_{i}" for i in range(1, 5)},
            pool=pool,
        )
        for pool, db in (("a", DB_A), ("b", DB_B))
    }
    for _ in range(2):
        running = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dpone",
                    "refresh",
                    "--config",
                    str(config),
                    "--all",
                    "--jobs",
                    "2",
                    "--json",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for config in projects.values()
        ]
        outputs = [p.communicate(timeout=300) for p in running]
        for process, (out, err) in zip(running, outputs, strict=True):
            assert process.returncode == 0, out + err
        for pool, db in (("a", DB_A), ("b", DB_B)):
            for i in range(1, 5):
                name = f"{pool}_{i}"
                assert target_labels(port, f"{db}.{name}") == [f"{name}-{n}" for n in range(1, 31)]
    # Each project leased only its own pool's principals.
    for pool, config in projects.items():
        with sqlite3.connect(config.parent / "store.sqlite") as conn:
            users = {u for (u,) in conn.execute("SELECT DISTINCT user FROM leases")}
        conn.close()
        assert users and all(u.startswith(f"dpone_{pool}_") for u in users), users


def test_a_stage_into_another_stores_pool_is_refused_before_its_lease(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    first = make_project(tmp_path / "one", server, {"t_staged": f"{MAIN}.t_staged"})
    assert refresh(first, "--all")[0] == 0
    owner = store_id(first)
    (tmp_path / "files").mkdir()
    path, receipt, _ = export_hostile(tmp_path / "files")
    store = tmp_path / "other" / "store.sqlite"
    done = dpone(
        "stage",
        str(path),
        "--receipt",
        str(receipt),
        "--store",
        str(store),
        "--work-dir",
        str(tmp_path / "other" / "work"),
        "--database",
        MAIN,
        "--data-dir",
        str(server["data_dir"]),
        "--attempt-id",
        "shared-1",
        "--json",
    )
    assert done.returncode != 0
    error = as_json(done)["error"]
    assert error["code"] == "pool_owned_elsewhere" and owner in error["message"], error
    with sqlite3.connect(store) as conn:
        assert conn.execute("SELECT count(*) FROM leases").fetchone() == (0,)
    conn.close()
    assert (
        chhttp.rows(
            server["http_port"],
            f"SELECT name FROM system.tables WHERE database = '{MAIN}' AND name LIKE '%shared%'",
        )
        == []
    )


def test_stores_claiming_at_once_leave_one_owner_of_the_pool_and_its_slots(
    server: dict[str, Any],
) -> None:
    """Four stores' first runs at once, ten times over: one owns the pool and every slot
    it asked for; the others are refused and made no marker (a store refused the pool
    claims no slot)."""
    port = server["http_port"]
    access = ServerAccess(server["data_dir"], pool=PoolNames("b"))
    slots = [TargetSlot(DB_B, "raced_1"), TargetSlot(DB_B, "raced_2")]
    for round_ in range(10):
        owners = [Owner(f"store-{round_}-{n}", f"/tmp/s{n}", "host") for n in range(4)]
        go = threading.Barrier(len(owners))

        def run(me: Owner, go: threading.Barrier = go) -> str:
            go.wait(timeout=60)
            try:
                claim(access, me, slots, project=None)
            except OwnedElsewhere as exc:
                return exc.code
            return "owner"

        with ThreadPoolExecutor(len(owners)) as pool:
            outcomes = list(pool.map(run, owners))
        assert outcomes.count("owner") == 1, outcomes
        assert set(outcomes) == {"owner", "pool_owned_elsewhere"}, outcomes
        winner = owners[outcomes.index("owner")]
        found = markers(port)
        assert len(found) == 3 and all(winner.store in m["comment"] for m in found), found
        chhttp.hand_over_servers()


def test_a_snapshot_prepare_from_another_store_is_refused_before_its_lease(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    """A generation staged with the store that owns the pool, then prepared with another
    store: refused before that store leases a publisher or claims the slot."""
    port, data_dir = server["http_port"], str(server["data_dir"])
    (tmp_path / "files").mkdir()
    path, receipt, _ = export_hostile(tmp_path / "files")
    owner_store = tmp_path / "owner" / "store.sqlite"
    staged = dpone(
        *("stage", str(path), "--receipt", str(receipt), "--store", str(owner_store)),
        *("--work-dir", str(tmp_path / "work"), "--database", MAIN, "--data-dir", data_dir),
        *("--attempt-id", "prep-1", "--json"),
    )
    assert staged.returncode == 0, staged.stdout + staged.stderr
    journal = as_json(staged)["journal"]
    other = tmp_path / "other" / "store.sqlite"
    done = dpone(
        *("snapshot", "prepare", "--journal", journal, "--target", f"{MAIN}.t_prepared"),
        *("--store", str(other), "--data-dir", data_dir, "--json"),
    )
    assert done.returncode != 0
    error = as_json(done)["error"]
    assert error["code"] == "pool_owned_elsewhere", error
    with sqlite3.connect(other) as conn:
        assert conn.execute("SELECT count(*) FROM leases").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    conn.close()
    assert markers(port)[0]["name"] == "owner_pool"
    assert len(markers(port)) == 1  # no slot marker for the refused store
