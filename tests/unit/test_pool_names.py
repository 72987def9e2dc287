"""Named pools, the managed server's pools record, and the ownership markers' names."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpone.errors import ConfigurationError
from dpone.localserver.pool_file import remote_grants, remote_role, render_pool
from dpone.localserver.principal_pool import (
    DEFAULT_POOL,
    ROLE_INGEST,
    ROLE_PUBLISHER,
    PoolNames,
    managed_server_users,
)
from dpone.localserver.protected import (
    check_pools,
    parse_pools,
    record_protected,
    recorded_pools,
    recorded_protected,
    start_command,
)
from dpone.ports.composition_snapshot import TargetSlot
from dpone.project.config import parse_project
from dpone.publication.principals.ownership import Marker, Owner, owner_of
from dpone.publication.store import SqliteSnapshotStore


def test_the_default_pool_keeps_its_names_and_a_named_pool_carries_its_name() -> None:
    assert DEFAULT_POOL.members()[:3] == ("dpone_catalog", "dpone_closer", "dpone_ingest_1")
    assert DEFAULT_POOL.keeper == "dpone_keeper" and DEFAULT_POOL.marker == "owner_pool"
    sales = PoolNames("sales", size=2)
    assert sales.members() == (
        "dpone_sales_catalog",
        "dpone_sales_closer",
        "dpone_sales_ingest_1",
        "dpone_sales_ingest_2",
        "dpone_sales_publisher_1",
        "dpone_sales_publisher_2",
    )
    assert sales.marker == "owner_pool_sales" and sales.keeper == "dpone_sales_keeper"
    # A pool knows only its own principals: another pool's are outside it.
    assert sales.role_of("dpone_sales_publisher_2") == ROLE_PUBLISHER
    assert sales.role_of("dpone_publisher_1") is None
    assert DEFAULT_POOL.role_of("dpone_sales_ingest_1") is None
    assert DEFAULT_POOL.role_of("dpone_ingest_3") == ROLE_INGEST


@pytest.mark.parametrize("name", ["Sales", "1st", "a_b", "a-b", "x" * 25, "s p"])
def test_a_pool_name_that_is_not_lowercase_letters_and_digits_is_refused(name: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        PoolNames(name)
    assert caught.value.code == "invalid_pool" and repr(name) in caught.value.message


def test_a_named_pools_render_has_its_own_principals_and_its_keeper_claims_its_marker() -> None:
    pool = PoolNames("ops")
    rendered = render_pool(["ops_db"], pool=pool)
    assert rendered.users == (*pool.members(), "dpone_ops_keeper")
    assert "<dpone_ops_publisher_1>" in rendered.users_xml
    assert "<dpone_publisher_1>" not in rendered.users_xml
    keeper = remote_grants(remote_role("dpone_ops_keeper", pool) or "", ["ops_db"], pool)
    assert "GRANT CREATE TABLE, DROP TABLE ON `_dpone_identity`.`owner_pool_ops`" in keeper
    assert "GRANT CREATE TABLE, DROP TABLE ON `_dpone_identity`.owner_slot_*" in keeper
    # The default pool's keeper claims only the default pool's marker.
    default = remote_grants("keeper", ["ops_db"])
    assert not any("owner_pool_ops" in g for g in default)


def test_the_managed_server_declares_each_pool_over_its_own_databases() -> None:
    users = {u.name: u for u in managed_server_users(["main"], pools={"a": ("db_a",)})}
    assert "dpone_publisher_1" in users and "dpone_a_publisher_1" in users
    assert all("db_a" not in g for g in users["dpone_publisher_1"].grants or ())
    assert any("db_a" in g for g in users["dpone_a_publisher_1"].grants or ())
    assert all("main" not in g for g in users["dpone_a_publisher_1"].grants or ())


def test_pools_are_parsed_recorded_and_repeated_by_the_start_command(tmp_path: Path) -> None:
    assert parse_pools(["a:x", "b:y,z", "a:w"]) == {"a": ("x", "w"), "b": ("y", "z")}
    for bad in ("a", "a:", ":x", "A:x"):
        with pytest.raises(ConfigurationError) as caught:
            parse_pools([bad])
        assert caught.value.code == "invalid_pool"
    # A database belongs to one pool: two would let one's principals write the other's.
    with pytest.raises(ConfigurationError) as caught:
        check_pools(["main"], {"a": ("main",)})
    assert caught.value.code == "database_in_two_pools"
    with pytest.raises(ConfigurationError) as caught:
        check_pools([], {"a": ("x",), "b": ("x",)})
    assert caught.value.code == "database_in_two_pools"
    record_protected(tmp_path, ["main"], {"a": ("x",)})
    assert recorded_protected(tmp_path) == ("main",)
    assert recorded_pools(tmp_path) == {"a": ("x",)}
    command = start_command(tmp_path, pools={"a": ("y",), "b": ("z",)})
    assert command.endswith("--protect main --pool a:x,y --pool b:z"), command


def test_the_project_names_its_pool_and_its_commands_then_name_the_project(
    tmp_path: Path,
) -> None:
    text = (
        '[project]\nstore = "s.sqlite"\n[clickhouse]\npool = "sales"\n'
        '[sources.s]\nkind = "sqlite"\npath = "x.db"\n'
        '[tables.t]\nsource = "s"\ntable = "t"\ntarget = "db.t"\norder_by = "id"\n'
    )
    project = parse_project(text, tmp_path / "dpone.toml")
    assert project.clickhouse.access.pool == PoolNames("sales")
    # A --data-dir command would use the default pool: status names the project file.
    assert project.server_arguments() == ["--config", str(tmp_path / "dpone.toml")]
    with pytest.raises(ConfigurationError) as caught:
        parse_project(text.replace('"sales"', '"Sales!"'), tmp_path / "dpone.toml")
    assert "clickhouse.pool" in str(caught.value.details["problems"])


def test_a_slot_marker_is_one_name_per_slot_and_a_comment_names_its_owner() -> None:
    one = Marker.of_slot(TargetSlot("db", "t"))
    assert one == Marker.of_slot(TargetSlot("db", "t"))
    assert one.name.startswith("owner_slot_") and len(one.name) == len("owner_slot_") + 40
    # Names that run together differently are different slots.
    assert Marker.of_slot(TargetSlot("db", "t_x")) != Marker.of_slot(TargetSlot("db_t", "x"))
    owner = Owner("1234", "/p/store.sqlite", "host-1")
    assert owner_of(one.comment(owner)) == owner
    assert owner_of("not json") is None and owner_of('{"owner": 3}') is None


def test_a_store_has_one_identity_however_many_objects_open_it(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    first = SqliteSnapshotStore(path).store_identity()
    assert SqliteSnapshotStore(path).store_identity() == first
    assert SqliteSnapshotStore(tmp_path / "other.sqlite").store_identity() != first
    assert len(first) == 36
