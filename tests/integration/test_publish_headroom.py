"""Storage ceilings hold while the INSERT streams and again at publish (issue 22, finding 9).

- A refresh bounds the staging stream by the headroom the total transient ceiling leaves
  over what the slot's database retains now, and refuses before staging when there is
  none (``limit_exceeded``, naming the ceiling).
- ``publish`` observes again and refuses the dispatch (``limit_exceeded``) when retained
  storage grew over its ceiling after ``prepare``: NOT_PUBLISHED, nothing sent, the
  reason and the ceiling in the history.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from dpone.contracts.composition_snapshot import DEFAULT_LIMITS, SnapshotRecord
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import AttemptRef, TargetSlot
from dpone.project.config import Project, load_project
from dpone.project.refresh import RefreshService, TableReport
from dpone.publication.ceilings.retained import headroom_policy, headroom_refusal
from dpone.publication.store import SqliteSnapshotStore
from dpone.staging.contract import StagingPolicy
from tests.plugins.retained_storage import (
    B_ROWS,
    NEXT,
    publisher_of,
    recording_catalog,
    rig_for,
    sizes,
)
from tests.publication_harness import Rig

# ---------------------------------------------------------------------- the pure bound


def test_the_headroom_narrows_the_streaming_bound_to_what_the_total_ceiling_leaves() -> None:
    limits = dataclasses.replace(
        DEFAULT_LIMITS, wire_bytes=1000, total_transient_storage_bytes=5000
    )
    base = StagingPolicy(max_spool_bytes=1000)
    assert headroom_policy(limits, 4800, base).max_spool_bytes == 200  # the headroom binds
    assert headroom_policy(limits, 100, base).max_spool_bytes == 1000  # wire bytes bind
    assert headroom_policy(limits, 100, base).max_rows == base.max_rows  # nothing else moves


@pytest.mark.parametrize(
    ("retained", "ceiling"),
    [
        (5000, "total_transient_storage_bytes"),  # no headroom left at all
        (7000, "total_transient_storage_bytes"),
        (9001, "retained_storage_bytes"),  # retained is over its own ceiling first
    ],
)
def test_no_headroom_refuses_naming_the_ceiling(retained: int, ceiling: str) -> None:
    limits = dataclasses.replace(
        DEFAULT_LIMITS, retained_storage_bytes=9000, total_transient_storage_bytes=5000
    )
    with pytest.raises(DponeError) as caught:
        headroom_policy(limits, retained, StagingPolicy())
    assert caught.value.code == "limit_exceeded"
    assert dict(caught.value.details) == {
        "ceiling": ceiling,
        "observed": retained,
        "limit": limits.to_document()[ceiling],
    }


def test_only_a_stop_at_the_headroom_names_the_transient_ceiling() -> None:
    limits = dataclasses.replace(
        DEFAULT_LIMITS, wire_bytes=1000, total_transient_storage_bytes=5000
    )
    spool = DponeError("spool over", code="spool_budget_exceeded")
    narrowed = headroom_policy(limits, 4800, StagingPolicy(max_spool_bytes=1000))
    refusal = headroom_refusal(limits, 4800, narrowed, spool)
    assert refusal is not None and refusal.code == "limit_exceeded"
    assert refusal.details["ceiling"] == "total_transient_storage_bytes"
    assert (refusal.details["headroom_bytes"], refusal.details["retained_bytes"]) == (200, 4800)
    wide = headroom_policy(limits, 100, StagingPolicy(max_spool_bytes=1000))
    assert headroom_refusal(limits, 100, wide, spool) is None  # wire bytes stopped it
    other = DponeError("no", code="too_many_records")
    assert headroom_refusal(limits, 4800, narrowed, other) is None


# ---------------------------------------------------------------------- refresh


def write_source(path: Path, count: int) -> None:
    path.unlink(missing_ok=True)
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE items (id bigint NOT NULL, name nvarchar(80), qty int)")
        conn.executemany(
            "INSERT INTO items VALUES (?, ?, ?)",
            [(i, f"item-{i:05d}-" + "y" * 40, i) for i in range(1, count + 1)],
        )


def project_on(rig: Rig, tmp_path: Path) -> Project:
    """A project refreshing ``items`` into ``<rig database>.t`` on the rig's server."""
    config = tmp_path / "dpone.toml"
    config.write_text(
        f'[project]\nwork_dir = "work"\nstore = "{rig.store_path}"\n'
        f'[clickhouse]\ndata_dir = "{rig.data_dir}"\n'
        '[sources.shop]\nkind = "sqlite"\npath = "shop.db"\n'
        f'[tables.items]\nsource = "shop"\ntable = "items"\ntarget = "{rig.database}.t"\n'
        'order_by = "id"\n'
    )
    return load_project(config)


def published_once(rig: Rig, tmp_path: Path) -> tuple[Project, TableReport, int]:
    """A first refresh of 20 rows; the project, its report and what is retained after."""
    write_source(tmp_path / "shop.db", 20)
    project = project_on(rig, tmp_path)
    first = RefreshService(project).refresh(project.tables["items"])
    assert first.ok, first.error
    retained = recording_catalog(rig).retained_bytes(TargetSlot(rig.database, "t"), NEXT)
    # The first publication's empty target is the only copy, and it holds 0 bytes: the
    # count is the target's alone, with or without the recorded UUIDs.
    assert retained == sizes(rig)["t"] > 0
    return project, first, retained


def refresh_with(project: Project, **ceilings: int) -> TableReport:
    table = project.tables["items"]
    limits = dataclasses.replace(table.limits, **ceilings)
    return RefreshService(project).refresh(dataclasses.replace(table, limits=limits))


def refused_in_stage(report: TableReport) -> dict[str, object]:
    """The details of a refresh refused with ``limit_exceeded`` in its ``stage`` phase."""
    assert not report.ok and report.phase == "stage", report.error
    assert report.error is not None and report.error["code"] == "limit_exceeded"
    return dict(report.error["details"])


def test_a_stream_over_the_headroom_is_stopped_while_staging(
    retained_server: tuple[Path, int, int],
    tmp_path: Path,
) -> None:
    rig = rig_for(retained_server, tmp_path, "head_stream")
    project, first, retained = published_once(rig, tmp_path)
    write_source(tmp_path / "shop.db", 200)  # about 13 KB of RowBinary
    details = refused_in_stage(refresh_with(project, total_transient_storage_bytes=retained + 500))
    assert details["ceiling"] == "total_transient_storage_bytes"
    assert (details["retained_bytes"], details["headroom_bytes"]) == (retained, 500)
    assert details["limit"] == retained + 500
    assert details["cause"] == "spool_budget_exceeded"
    assert rig.uuid_of("t") == first.target_uuid_after  # nothing was published


def test_no_headroom_refuses_before_anything_is_staged(
    retained_server: tuple[Path, int, int],
    tmp_path: Path,
) -> None:
    rig = rig_for(retained_server, tmp_path, "head_zero")
    project, first, retained = published_once(rig, tmp_path)
    report = refresh_with(project, total_transient_storage_bytes=retained)
    assert refused_in_stage(report) == {
        "ceiling": "total_transient_storage_bytes",
        "observed": retained,
        "limit": retained,
    }
    # Refused before staging: no journal, no staged table, no ingest lease for it.
    assert not (project.work_dir / "attempts" / report.attempt_id).exists()
    assert report.journal is None
    assert SqliteSnapshotStore(rig.store_path).leases_of(report.attempt_id) == []
    assert rig.uuid_of("t") == first.target_uuid_after


def test_retained_over_its_ceiling_refuses_before_staging(
    retained_server: tuple[Path, int, int],
    tmp_path: Path,
) -> None:
    rig = rig_for(retained_server, tmp_path, "head_retained")
    project, _, retained = published_once(rig, tmp_path)
    report = refresh_with(project, retained_storage_bytes=retained - 1)
    assert refused_in_stage(report) == {
        "ceiling": "retained_storage_bytes",
        "observed": retained,
        "limit": retained - 1,
    }
    assert not (project.work_dir / "attempts" / report.attempt_id).exists()


# ---------------------------------------------------------------------- publish


def test_publish_refuses_the_dispatch_when_retained_storage_grew_over_its_ceiling(
    retained_server: tuple[Path, int, int],
    tmp_path: Path,
) -> None:
    rig = rig_for(retained_server, tmp_path, "head_publish")
    db, slot = rig.database, TargetSlot(rig.database, "t")
    first = rig.stage(B_ROWS, "pub-1")
    created = rig.prepare(first, "t")  # creates the empty target E (recorded, no mark)
    assert publisher_of(rig).publish(created.intent_sha256).state.value == "published"
    # E now sits under the first generation's name.
    assert rig.uuid_of(first.table) == created.target_uuid
    second = rig.stage(B_ROWS, "pub-2")
    seen = recording_catalog(rig).observe(slot, second.table)
    assert seen.generation is not None
    limits = dataclasses.replace(
        DEFAULT_LIMITS,
        retained_storage_bytes=seen.retained_bytes + 1000,
        total_transient_storage_bytes=seen.retained_bytes + seen.generation.total_bytes + 1000,
    )
    publisher = publisher_of(rig, limits)
    prepared = publisher.prepare(AttemptRef(second.journal_path, slot), second.journal_head)
    intent = prepared.intent_sha256
    # Between prepare and publish the retained E grows far past the 1000 bytes of slack.
    rig.admin(
        f"INSERT INTO {db}.{first.table} SELECT number, hex(SHA256(toString(number))), number"
        " FROM numbers(5000)"
    )
    grown = recording_catalog(rig).retained_bytes(slot, second.table)
    assert grown > limits.retained_storage_bytes
    published = publisher.publish(intent)
    assert (published.state.value, published.revision) == ("not_published", 3)
    store = SqliteSnapshotStore(rig.store_path)
    record = SnapshotRecord.from_bytes(store.load(intent).record_bytes)
    assert record.reason == "not_sent_limit_exceeded"  # the reason is kept in the record
    assert record.dispatch is not None and record.dispatch.outcome == "not_sent"
    facts = [dict(h.facts) for h in store.history(intent)]
    [refused] = [f for f in facts if f.get("step") == "dispatch_refused"]
    assert refused == {
        "step": "dispatch_refused",
        "reason": "limit_exceeded",
        "ceiling": "retained_storage_bytes",
        "observed": grown,
        "limit": limits.retained_storage_bytes,
    }
    [reconciled] = [f for f in facts if f.get("step") == "reconcile"]
    assert reconciled["dispatch_reason"] == "limit_exceeded"
    assert reconciled["decided"] == "not_published"
    # Nothing was sent: the target is still the first publication's B.
    assert rig.uuid_of("t") == first.uuid and rig.uuid_of(second.table) == second.uuid
    assert rig.exchange_events(intent) == []
