"""Retained storage counts every table dpone retained or created, by the UUIDs the store
recorded (issue 22, finding 6), on a real managed server.

The user's original target, once exchanged out, sits under the generation's name with
no ownership mark; so does the empty target a first publication created. Both are
counted through the UUIDs their intents recorded, wherever they sit in the database,
each once; a dropped one is simply gone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.errors import DponeError
from dpone.localserver.principal_pool import (
    CATALOG_USER,
    CLOSER_USER,
    pool_names,
)
from dpone.ports.clickhouse_request import Endpoint
from dpone.ports.composition_snapshot import TargetSlot
from dpone.publication.catalog import (
    ByteObservationMissing,
    CatalogUnobservable,
    ClickHouseSnapshotCatalog,
)
from dpone.publication.ceilings.retained import recorded_table_uuids, recorded_target_names
from dpone.publication.composition import pool_credentials
from dpone.publication.store import SqliteSnapshotStore, parsed_intents
from dpone.publication.store.errors import SnapshotStoreError
from tests import chhttp
from tests.plugins.retained_storage import (
    B_ROWS,
    NEXT,
    catalog_of,
    publisher_of,
    recording_catalog,
    rig_for,
    sizes,
)
from tests.publication_harness import Rig, Row

A_ROWS: list[Row] = [(i, f"a-{i:04d}-" + "x" * 40, i) for i in range(1, 301)]


def publish_over_users_target(rig: Rig) -> tuple[str, str]:
    """A user's unmarked target replaced by B; the names (target, A's new name)."""
    b = rig.stage(B_ROWS, "user-b")
    rig.existing_target(b, "t", A_ROWS)  # B's design, no mark: the user's own table
    prepared = rig.prepare(b, "t")
    published = publisher_of(rig).publish(prepared.intent_sha256)
    assert published.state.value == "published"
    marks = chhttp.rows(
        rig.http_port,
        f"SELECT comment FROM system.columns WHERE database = '{rig.database}' "
        f"AND table = '{b.table}' AND position = 1",
    )
    assert marks == [{"comment": ""}]  # A, now under B's name, carries no mark
    return "t", b.table


def test_the_users_exchanged_out_target_is_counted(
    retained_server: tuple[Path, int, int], tmp_path: Path
) -> None:
    rig = rig_for(retained_server, tmp_path, "ret_copy")
    target, copy = publish_over_users_target(rig)
    slot = TargetSlot(rig.database, target)
    size = sizes(rig)
    assert size[copy] > 1000 and set(size) == {target, copy}
    expected = size[target] + size[copy]
    assert recording_catalog(rig).retained_bytes(slot, NEXT) == expected
    assert recording_catalog(rig).observe(slot, NEXT).retained_bytes == expected
    # Wherever the copy sits in the database, its UUID says it is the retained A.
    rig.admin(f"RENAME TABLE {rig.database}.{copy} TO {rig.database}.kept_by_hand")
    assert recording_catalog(rig).retained_bytes(slot, NEXT) == expected
    # Without the recorded UUIDs (the count by mark alone) A would be missing.
    assert catalog_of(rig, None).retained_bytes(slot, NEXT) == size[target]


def test_the_empty_target_a_first_publication_created_is_counted(
    retained_server: tuple[Path, int, int], tmp_path: Path
) -> None:
    rig = rig_for(retained_server, tmp_path, "ret_first")
    b = rig.stage(B_ROWS, "first-b")
    prepared = rig.prepare(b, "t")  # creates the empty target E: no mark, recorded as A
    assert publisher_of(rig).publish(prepared.intent_sha256).state.value == "published"
    assert rig.uuid_of(b.table) == prepared.target_uuid  # E is now under B's name
    # E is empty (0 bytes); rows written into it later are storage dpone retains.
    rig.admin(
        f"INSERT INTO {rig.database}.{b.table} SELECT number, hex(SHA256(toString(number))),"
        " number FROM numbers(2000)"
    )
    slot = TargetSlot(rig.database, "t")
    size = sizes(rig)
    assert size[b.table] > 1000
    seen = recording_catalog(rig).observe(slot, NEXT)
    assert seen.retained_bytes == size["t"] + size[b.table]
    assert catalog_of(rig, None).observe(slot, NEXT).retained_bytes == size["t"]


def test_each_table_counts_once_and_a_dropped_one_is_gone(
    retained_server: tuple[Path, int, int], tmp_path: Path
) -> None:
    rig = rig_for(retained_server, tmp_path, "ret_gone")
    target, copy = publish_over_users_target(rig)
    staged = rig.stage(B_ROWS, "gone-next")
    rig.prepare(staged, target)  # its generation is now both marked and recorded
    slot = TargetSlot(rig.database, target)
    size = sizes(rig)
    assert set(size) == {target, copy, staged.table}
    catalog = recording_catalog(rig)
    assert catalog.retained_bytes(slot, NEXT) == size[target] + size[copy] + size[staged.table]
    assert catalog.retained_bytes(slot, staged.table) == size[target] + size[copy]
    rig.admin(f"DROP TABLE {rig.database}.{copy} SYNC")
    assert catalog.retained_bytes(slot, staged.table) == size[target]


def test_a_recorded_table_without_a_byte_counter_is_missing_not_zero(
    retained_server: tuple[Path, int, int], tmp_path: Path
) -> None:
    rig = rig_for(retained_server, tmp_path, "ret_null")
    db = rig.database
    rig.admin(f"CREATE TABLE {db}.t (id UInt64) ENGINE = MergeTree ORDER BY id")
    rig.admin(f"CREATE VIEW {db}.recorded_view AS SELECT toUInt64(1) AS id")
    view_uuid = rig.uuid_of("recorded_view")
    assert view_uuid is not None and "recorded_view" not in sizes(rig)  # NULL total_bytes
    catalog = catalog_of(rig, lambda database: {view_uuid} if database == db else set())
    with pytest.raises(ByteObservationMissing) as caught:
        catalog.retained_bytes(TargetSlot(db, "t"), NEXT)
    assert caught.value.details["table"] == "recorded_view"
    with pytest.raises(ByteObservationMissing):
        catalog.observe(TargetSlot(db, "t"), NEXT)


def test_an_unreadable_record_of_tables_is_unobservable(
    retained_server: tuple[Path, int, int], tmp_path: Path
) -> None:
    rig = rig_for(retained_server, tmp_path, "ret_fail")
    rig.admin(f"CREATE TABLE {rig.database}.t (id UInt64) ENGINE = MergeTree ORDER BY id")

    def unreadable(database: str) -> set[str]:
        # A store that cannot answer (the server cannot produce this fault).
        raise SnapshotStoreError(
            f"the store of {database} is unavailable", code="store_unavailable"
        )

    catalog = catalog_of(rig, unreadable)
    for observe in (catalog.retained_bytes, catalog.observe):
        with pytest.raises(CatalogUnobservable) as caught:
            observe(TargetSlot(rig.database, "t"), NEXT)
        assert caught.value.code == "catalog_unobservable"
        assert caught.value.details["cause"] == "store_unavailable"
        assert isinstance(caught.value.__cause__, DponeError)


def test_the_recorded_uuids_are_every_intents_a_and_b_of_the_database(
    retained_server: tuple[Path, int, int], tmp_path: Path
) -> None:
    rig = rig_for(retained_server, tmp_path, "ret_ref")
    b = rig.stage(B_ROWS, "ref-b")
    prepared = rig.prepare(b, "t")
    uuids = recorded_table_uuids(SqliteSnapshotStore(rig.store_path))
    assert uuids(rig.database) == {prepared.target_uuid, prepared.generation_uuid}
    assert uuids("another_database") == frozenset()


def test_each_intent_is_read_once_a_process_and_a_new_one_is_counted(
    retained_server: tuple[Path, int, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history grows by every table of every run: an observation lists the
    database's intent digests and reads only the intents stored since (issue 33)."""
    read: list[bytes] = []
    real = parsed_intents._recorded

    def counted(data: bytes) -> parsed_intents.RecordedTables:
        read.append(data)
        return real(data)

    monkeypatch.setattr(parsed_intents, "_recorded", counted)
    rig = rig_for(retained_server, tmp_path, "ret_once")
    first = rig.prepare(rig.stage(B_ROWS, "once-b"), "t")
    store = SqliteSnapshotStore(rig.store_path)
    uuids, names = recorded_table_uuids(store), recorded_target_names(store)
    for _ in range(3):
        assert uuids(rig.database) == {first.target_uuid, first.generation_uuid}
        assert names(rig.database) == {"t"}
    other = rig.stage(B_ROWS, "once-c")
    rig.existing_target(other, "u", [])
    second = rig.prepare(other, "u")
    for _ in range(3):
        assert uuids(rig.database) == {
            first.target_uuid,
            first.generation_uuid,
            second.target_uuid,
            second.generation_uuid,
        }
        assert names(rig.database) == {"t", "u"}
    # Each of the two intents was read once, however often the reads ran (the prepares'
    # own observations among them).
    assert sorted(read) == sorted(s.intent_bytes for s in store.list_snapshots())


def test_another_slots_live_target_is_not_this_slots_retained_storage(
    retained_server: tuple[Path, int, int], tmp_path: Path
) -> None:
    rig = rig_for(retained_server, tmp_path, "ret_two")
    target, copy = publish_over_users_target(rig)  # slot "t": its B is now its target
    other = rig.stage(B_ROWS, "other-b")
    rig.existing_target(other, "u", [])
    published = publisher_of(rig).publish(rig.prepare(other, "u").intent_sha256)
    assert published.state.value == "published"
    size = sizes(rig)
    store = SqliteSnapshotStore(rig.store_path)
    endpoint = Endpoint("127.0.0.1", rig.http_port, rig.tcp_port, rig.database)
    catalog = ClickHouseSnapshotCatalog(
        HttpTransport(endpoint, pool_credentials(rig.data_dir)[CATALOG_USER]),
        trusted_users=frozenset({"dpone_admin", CATALOG_USER, CLOSER_USER, *pool_names()}),
        recorded_uuids=recorded_table_uuids(store),
        live_targets=recorded_target_names(store),
    )
    # Slot t: its target plus its own old A and slot u's old A (a retained copy of
    # this database), never slot u's live target, whose UUID an intent recorded too.
    expected = size[target] + size[copy] + size[other.table]
    assert catalog.retained_bytes(TargetSlot(rig.database, target), NEXT) == expected
    # Without the live targets the count took slot u's target as retained.
    assert (
        recording_catalog(rig).retained_bytes(TargetSlot(rig.database, target), NEXT)
        == expected + size["u"]
    )
