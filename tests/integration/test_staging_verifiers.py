"""The staging verifiers on the real server, through the public sink (issue 26, items 4, 5).

Control rows that lack a member are a coded error naming the read and the member; the
policy's scan budget bounds every scan of the source (at admission and at completion);
a failure at admission leaves its record, and the error carries it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from dpone.errors import DponeError
from dpone.localserver import ServerInfo
from dpone.ports.clickhouse_request import ClickHouseRequest
from dpone.sinks import ClickHouseSink
from dpone.staging.contract import StagingPolicy
from dpone.staging.journal import ClickHouseFileAttemptJournal, read_events
from tests.plugins.staging import (
    Replacement,
    config,
    export_hostile,
    interfering_sink,
    rewrite_read,
    states,
    table_exists,
)

pytestmark = pytest.mark.usefixtures("staging_database")  # the databases, for every test here


@pytest.mark.parametrize(
    ("purpose", "drop"),
    [("table", "engine"), ("table", "uuid"), ("columns", "comment"), ("columns", "type")],
)
def test_a_control_row_without_a_member_is_a_coded_error(
    clickhouse: ServerInfo, tmp_path: Path, purpose: str, drop: str
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    seen: list[str] = []

    def without(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        first, *rest = rows
        del first[drop]
        return [first, *rest]

    def incomplete(request: ClickHouseRequest) -> Replacement:
        if "-read-table-" not in request.query_id or seen:
            return None
        seen.append(request.query_id)  # the first one (table and columns): after the CREATE
        return rewrite_read(purpose, without)

    attempt = f"incomplete-{purpose}-{drop}"
    with pytest.raises(DponeError) as caught:
        interfering_sink(clickhouse, tmp_path / "work", incomplete).stage_validated_file(
            path, receipt, attempt_id=attempt
        )
    assert caught.value.code == "control_row_incomplete", caught.value
    assert caught.value.details["query_id"] == seen[0]
    assert (caught.value.details["member"], caught.value.details["row"]) == (drop, 1)
    assert seen[0] in caught.value.message and repr(drop) in caught.value.message
    # The table is the attempt's own (the next reads say so): dropped, all cleaned.
    assert states(tmp_path / "work" / attempt)[-1] == "failed_cleaned"
    assert not table_exists(clickhouse, "dpone_stage_" + attempt.replace("-", "_h"))


def sink_with_scan_cap(info: ServerInfo, work: Path, cap: int) -> ClickHouseSink:
    return ClickHouseSink(
        dataclasses.replace(config(info, work), policy=StagingPolicy(max_scan_bytes=cap))
    )


def test_the_scan_budget_bounds_the_admission_scan_and_its_failure_is_recorded(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    size = path.stat().st_size
    with pytest.raises(DponeError) as caught:
        sink_with_scan_cap(clickhouse, tmp_path / "work", size - 1).stage_validated_file(
            path, receipt, attempt_id="cap-entry-1"
        )
    assert caught.value.code == "verification_budget_exceeded"
    # Refused by the first scan, at admission: nothing prepared, nothing remote.
    [record] = [e.document for e in read_events(tmp_path / "work" / "cap-entry-1")]
    assert (record["state"], record["outcome"], record["error_code"]) == (
        "failed_cleaned",
        "terminal",
        "verification_budget_exceeded",
    )
    assert caught.value.details["last_event"] == record  # the error carries its record
    assert not (tmp_path / "work" / "cap-entry-1" / "spool").exists()
    # The same cap that the file fits passes.
    staged = sink_with_scan_cap(clickhouse, tmp_path / "work", size).stage_validated_file(
        path, receipt, attempt_id="cap-entry-2"
    )
    assert states(staged.journal_path)[-1] == "staged"


def test_the_scan_budget_bounds_the_completion_scan(clickhouse: ServerInfo, tmp_path: Path) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    size = path.stat().st_size

    def grow(request: ClickHouseRequest) -> None:
        if request.query_id.endswith("-insert"):  # the source grows past the cap meanwhile
            with open(path, "ab") as f:
                f.write(b"9" * 4096)

    work = tmp_path / "work"
    sink = interfering_sink(clickhouse, work, grow, max_scan_bytes=size)
    with pytest.raises(DponeError) as caught:
        sink.stage_validated_file(path, receipt, attempt_id="cap-complete-1")
    # The second scan ran, under the cap: it stops before reading past it.
    assert caught.value.code == "verification_budget_exceeded", caught.value
    assert states(work / "cap-complete-1")[-1] == "failed_cleaned"
    assert not table_exists(clickhouse, "dpone_stage_cap_hcomplete_h1")


def test_the_spool_entry_is_durable_before_the_prepared_event(
    clickhouse: ServerInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    synced: list[tuple[bool, int]] = []
    real = ClickHouseFileAttemptJournal.spool_prepared

    def spool_prepared(self: ClickHouseFileAttemptJournal) -> None:
        synced.append((self.spool_dir.is_dir(), self.sequence))
        real(self)

    monkeypatch.setattr(ClickHouseFileAttemptJournal, "spool_prepared", spool_prepared)
    staged = ClickHouseSink(config(clickhouse, tmp_path / "work")).stage_validated_file(
        path, receipt, attempt_id="spool-entry-1"
    )
    # Once, with the spool in place, while only the admission event exists.
    assert synced == [(True, 1)]
    assert read_events(staged.journal_path)[1].document["state"] == "prepared"
