"""Staging faults on the real server: deadlines, journal failures, cleanup outcomes,
pre-flight refusals, identity and receipt checks, credentials and the principal."""

from __future__ import annotations

import dataclasses
import signal
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.contracts.receipt import FileReceipt
from dpone.errors import DponeError, JournalError, Terminated
from dpone.exporters.export import export_table
from dpone.exporters.sources import SqliteSource
from dpone.localserver import ADMIN_USER, ServerInfo
from dpone.ports.clickhouse_errors import OutcomeUnknown, TransportDeadline
from dpone.ports.clickhouse_request import ClickHouseRequest, Credentials, mutation
from dpone.ports.clickhouse_result import QueryResult
from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
from dpone.sinks import ClickHouseSink
from dpone.staging.composition import build_transport
from dpone.staging.journal import ClickHouseFileAttemptJournal, file_journals, read_events
from dpone.staging.recovery import list_attempts
from dpone.staging.service import ClickHouseValidatedFileService
from tests import chhttp
from tests.plugins.managed_server import STAGER_PASSWORD
from tests.plugins.staging import (
    DB,
    Interfering,
    Replacement,
    Wrapped,
    config,
    documents,
    export_hostile,
    fake_count,
    interfering_sink,
    runner,
    states,
    table_exists,
    wrapped_transport,
)

pytestmark = pytest.mark.usefixtures("staging_database")  # the databases, for every test here
WRONG_COUNT = fake_count(b'{"n":1}\n')  # the primary failure: count_mismatch, after INSERT


def chain(*hooks: Callable[[ClickHouseRequest], Replacement]) -> Any:
    def hook(request: ClickHouseRequest) -> Replacement:
        replaced = None
        for h in hooks:
            replaced = h(request) or replaced
        return replaced

    return hook


# ---------------------------------------------------------------- item 5: completion


def test_completion_belongs_to_the_verification_deadline(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, data = export_hostile(tmp_path)
    now = [0.0]

    def slow_load(request: ClickHouseRequest) -> None:
        if "-read-verify-" in request.query_id:  # the first read after the INSERT
            now[0] += 1000.0  # the load took longer than the whole preparation deadline

    cfg = config(
        clickhouse,
        tmp_path / "work",
        preparation_seconds=600.0,
        verification_seconds=5000.0,
        request_seconds=5000.0,
    )
    inner = HttpTransport(cfg.endpoint, cfg.credentials, clock=lambda: now[0])
    svc = ClickHouseValidatedFileService(
        Interfering(inner, slow_load),
        DB,
        journal_factory=file_journals(tmp_path / "work"),
        policy=cfg.policy,
        clock=lambda: now[0],
    )
    staged = svc.stage(ContractValidatedFileArtifact(path, receipt), "slow-load-1")
    assert staged.rows == len(data)
    assert states(staged.journal_path)[-1] == "staged"
    assert table_exists(clickhouse, "dpone_stage_slow_hload_h1")


# ---------------------------------------------------------------- item 6: the primary stays


class FailingJournal(ClickHouseFileAttemptJournal):
    """Every write from event ``fail_at`` on fails, each with its own number."""

    fail_at = 0
    failures = 0

    def record(self, fields: Any) -> Any:
        if self.sequence + 1 >= self.fail_at:
            type(self).failures += 1
            raise JournalError(
                f"disk full #{self.failures} (simulated)", code="journal_write_failed"
            )
        return super().record(fields)


def failing_journal(fail_at: int) -> type[FailingJournal]:
    return type("J", (FailingJournal,), {"fail_at": fail_at, "failures": 0})


def test_a_failed_failure_record_never_replaces_the_primary(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    chhttp.query(
        clickhouse.http_port, f"CREATE TABLE {DB}.dpone_stage_taken_h1 (x Int8) ENGINE = Memory"
    )
    cfg = config(clickhouse, tmp_path / "work")
    # Events: 1 admitted, 2 prepared, 3 the failure record (which cannot be written).
    sink = ClickHouseSink(cfg, journal_factory=file_journals(cfg.work_dir, failing_journal(3)))
    with pytest.raises(DponeError) as caught:
        sink.stage_validated_file(path, receipt, attempt_id="taken-1")
    assert caught.value.code == "table_exists"  # the primary, not the JournalError
    notes = getattr(caught.value, "__notes__", [])
    assert any("could not be published" in n and "disk full #1" in n for n in notes), notes
    assert len(read_events(tmp_path / "work" / "taken-1")) == 2
    [summary] = list_attempts(tmp_path / "work")
    assert summary.needs_operator  # no terminal record: an operator looks
    assert table_exists(clickhouse, "dpone_stage_taken_h1")  # not ours: untouched


@pytest.mark.parametrize(
    ("fail_at", "hook", "primary", "table_left"),
    [
        (3, None, "disk full #1 (simulated)", False),  # the CREATE intent: nothing is sent
        (4, None, "disk full #1 (simulated)", True),  # the INSERT intent
        (5, None, "disk full #1 (simulated)", True),
        (6, WRONG_COUNT, "COUNT observed 1 rows", True),  # the cleanup's first event
    ],
)
def test_journal_failure_never_drops_without_a_durable_intent(
    clickhouse: ServerInfo, tmp_path: Path, fail_at: int, hook: Any, primary: str, table_left: bool
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    cfg = config(clickhouse, tmp_path / "work")
    transport: Any = build_transport(cfg)
    if hook is not None:
        transport = Interfering(transport, hook)
    sink = ClickHouseSink(
        cfg,
        runner_factory=runner(transport),
        journal_factory=file_journals(cfg.work_dir, failing_journal(fail_at)),
    )
    attempt = f"journal-{fail_at}"
    with pytest.raises(DponeError) as caught:
        sink.stage_validated_file(path, receipt, attempt_id=attempt)
    # The error raised is the first failure; every later one is a note on it.
    assert caught.value.message.startswith(primary), caught.value.message
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "disk full #2" in notes or (fail_at == 6 and "disk full #1" in notes), notes
    # Without a durable DROP intent the table is never dropped.
    assert table_exists(clickhouse, f"dpone_stage_{attempt.replace('-', '_h')}") is table_left
    assert len(read_events(tmp_path / "work" / attempt)) == fail_at - 1
    assert any(
        a.attempt_id == attempt and a.needs_operator for a in list_attempts(tmp_path / "work")
    )


# ---------------------------------------------------------------- item 9 and cleanup outcomes


def timeout_on(marker: str) -> Callable[[ClickHouseRequest], None]:
    def hook(request: ClickHouseRequest) -> None:
        if marker in request.query_id:
            raise TransportDeadline(
                "probe timed out (simulated)", submitted=True, query_id=request.query_id
            )

    return hook


def garbage_on(marker: str) -> Callable[[ClickHouseRequest], QueryResult | None]:
    def hook(request: ClickHouseRequest) -> QueryResult | None:
        if marker in request.query_id:
            return QueryResult(request.query_id, b'{"n":"x"}\n', None, None, "http")
        return None

    return hook


@pytest.mark.parametrize(
    ("fault", "dropped"),
    [(timeout_on("-read-owned-"), False), (garbage_on("-read-dropped-"), True)],
    ids=["probe_timeout", "table_unobservable"],
)
def test_unobservable_cleanup_is_retained_unknown_with_the_table_listed(
    clickhouse: ServerInfo, tmp_path: Path, fault: Any, dropped: bool
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    sink = interfering_sink(clickhouse, tmp_path / "work", chain(WRONG_COUNT, fault))
    attempt = f"blind-{int(dropped)}"
    with pytest.raises(DponeError) as caught:
        sink.stage_validated_file(path, receipt, attempt_id=attempt)
    assert caught.value.code == "count_mismatch"
    docs = documents(tmp_path / "work" / attempt)
    last = docs[-1]
    assert (last["state"], last["error_code"]) == ("retained_unknown", "count_mismatch")
    uuid = next(d for d in docs if d["state"] == "loading")["observed_ownership"]["table_uuid"]
    table = f"dpone_stage_blind_h{int(dropped)}"
    assert last["cleanup_inventory"]["table"] == {"database": DB, "table": table, "uuid": uuid}
    assert table_exists(clickhouse, table) is not dropped


def wrapped_sink(
    info: ServerInfo, work: Path, fault: Any, count: bytes | None = b'{"n":1}\n'
) -> ClickHouseSink:
    """The public sink whose service runs through :func:`wrapped_transport`."""
    cfg = config(info, work)
    return ClickHouseSink(cfg, runner_factory=runner(wrapped_transport(cfg, fault, count)))


def test_a_drop_the_server_refuses_ends_cleanup_failed(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, _ = export_hostile(tmp_path)

    def refuse_drop(request: ClickHouseRequest, inner: Any, deadline: float) -> None:
        if request.query_id.endswith("-drop"):  # the server itself refuses this DROP
            inner.execute(
                mutation("DROP TABLE no_such_database_x.t", request.query_id), deadline=deadline
            )

    with pytest.raises(DponeError) as caught:
        wrapped_sink(clickhouse, tmp_path / "work", refuse_drop).stage_validated_file(
            path, receipt, attempt_id="refused-1"
        )
    assert caught.value.code == "count_mismatch"
    assert any("refused the DROP" in n for n in getattr(caught.value, "__notes__", []))
    docs = documents(tmp_path / "work" / "refused-1")
    assert [d["outcome"] for d in docs][-2:] == ["drop_intent", "terminal"]
    assert docs[-1]["state"] == "cleanup_failed"
    assert docs[-1]["settled"] == {"query_id": "dpone-b02-refused-1-drop", "by": "server_error"}
    assert docs[-1]["cleanup_inventory"]["table"]["table"] == "dpone_stage_refused_h1"
    assert table_exists(clickhouse, "dpone_stage_refused_h1")


def lose_answer(suffix: str, *, run_it: bool) -> Any:
    def fault(request: ClickHouseRequest, inner: Any, deadline: float) -> None:
        if request.query_id.endswith(suffix):
            if run_it:
                inner.execute(request, deadline=deadline)
            raise OutcomeUnknown(
                "connection lost (simulated)", code="connection_lost", query_id=request.query_id
            )

    return fault


@pytest.mark.parametrize(
    ("suffix", "run_it", "count", "ending"),
    [
        ("-create", True, None, "failed_cleaned"),
        ("-drop", True, b'{"n":1}\n', "failed_cleaned"),
        ("-drop", False, b'{"n":1}\n', "retained_unknown"),
    ],
    ids=["create_ran", "drop_ran", "drop_never_ran"],
)
def test_an_unknown_create_or_drop_inside_the_service(
    clickhouse: ServerInfo,
    tmp_path: Path,
    suffix: str,
    run_it: bool,
    count: bytes | None,
    ending: str,
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    attempt = f"unknown{suffix}-{int(run_it)}"
    with pytest.raises(DponeError):
        wrapped_sink(
            clickhouse, tmp_path / "work", lose_answer(suffix, run_it=run_it), count
        ).stage_validated_file(path, receipt, attempt_id=attempt)
    docs = documents(tmp_path / "work" / attempt)
    observed = [d["remote"] for d in docs if d["outcome"] == "termination_observed"]
    query_id = f"dpone-b02-{attempt}{suffix}"
    assert observed[-1]["query_id"] == query_id
    assert observed[-1]["termination"] == ("finished_ok" if run_it else "unknown")
    assert docs[-1]["state"] == ending
    table = "dpone_stage_" + attempt.replace("-", "_h")
    assert table_exists(clickhouse, table) is (ending == "retained_unknown")


# ---------------------------------------------------------------- item 14: receipt, endpoint


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"codec_version": 1}, "receipt_codec_mismatch"),
        ({"policy_id": "someone.else"}, "receipt_policy_mismatch"),
    ],
)
def test_receipt_codec_and_policy_must_be_the_ones_used(
    clickhouse: ServerInfo, tmp_path: Path, change: dict[str, Any], code: str
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    other = tmp_path / "other.receipt.json"
    other.write_bytes(
        dataclasses.replace(FileReceipt.from_bytes(receipt.read_bytes()), **change).to_bytes()
    )
    with pytest.raises(DponeError) as caught:
        ClickHouseSink(config(clickhouse, tmp_path / "work")).stage_validated_file(
            path, other, attempt_id="ids-1"
        )
    assert caught.value.code == code
    assert states(tmp_path / "work" / "ids-1") == ["checking", "failed_cleaned"]
    assert not table_exists(clickhouse, "dpone_stage_ids_h1")


def test_endpoint_identity_is_checked_again_after_the_insert(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, _ = export_hostile(tmp_path)

    def new_identity(request: ClickHouseRequest) -> None:
        if request.query_id.endswith("-insert"):  # from now on: another server's identity
            chhttp.query(clickhouse.http_port, "DROP DATABASE _dpone_identity SYNC")
            chhttp.query(clickhouse.http_port, "CREATE DATABASE _dpone_identity ENGINE = Atomic")

    with pytest.raises(DponeError) as caught:
        interfering_sink(clickhouse, tmp_path / "work", new_identity).stage_validated_file(
            path, receipt, attempt_id="moved-1"
        )
    assert caught.value.code == "endpoint_changed"
    before, after = caught.value.details["before"], caught.value.details["after"]
    assert before["server_id"] != after["server_id"]
    # Through another server nothing says what the attempt created: all is retained.
    assert states(tmp_path / "work" / "moved-1")[-1] == "retained_unknown"
    assert table_exists(clickhouse, "dpone_stage_moved_h1")
    assert (tmp_path / "work" / "moved-1" / "spool" / "data.rowbinary").exists()


# ---------------------------------------------------------------- item 17: before the expensive work


def test_a_missing_database_is_refused_before_the_file_is_read(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    cfg = config(clickhouse, tmp_path / "work")
    cfg = dataclasses.replace(
        cfg, endpoint=dataclasses.replace(cfg.endpoint, database="no_such_db")
    )
    with pytest.raises(DponeError) as caught:
        ClickHouseSink(cfg).stage_validated_file(path, receipt, attempt_id="nodb-1")
    assert caught.value.code == "database_missing"
    docs = documents(tmp_path / "work" / "nodb-1")
    assert [d["state"] for d in docs] == ["failed_cleaned"]  # not even admitted (no scan)
    assert (
        "source_identity" not in docs[0] and not (tmp_path / "work" / "nodb-1" / "spool").exists()
    )


def test_the_old_client_cannot_carry_datetime64_and_says_so_first(
    clickhouse: ServerInfo, clickhouse_client: str, tmp_path: Path
) -> None:
    db = tmp_path / "src.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (id bigint NOT NULL, at datetime, ok bit)")
        conn.execute("INSERT INTO t VALUES (1, '2024-01-02 03:04:05.123', 1)")
    exported = export_table(SqliteSource(db), "t", tmp_path / "t.tsv")
    with pytest.raises(DponeError) as caught:
        ClickHouseSink(config(clickhouse, tmp_path / "work", "client")).stage_validated_file(
            exported.path, exported.receipt_path, attempt_id="old-client-1"
        )
    assert caught.value.code == "transport_cannot_carry_type"
    assert "--transport http" in caught.value.message
    assert caught.value.details["columns"] == [
        "at Nullable(DateTime64(3, 'UTC'))",
        "ok Nullable(Bool)",
    ]
    assert states(tmp_path / "work" / "old-client-1") == ["checking", "failed_cleaned"]
    assert not (tmp_path / "work" / "old-client-1" / "spool").exists()  # nothing prepared
    assert not table_exists(clickhouse, "dpone_stage_old_hclient_h1")


# ---------------------------------------------------------------- weak tests made real


def test_receipt_replaced_during_the_attempt(clickhouse: ServerInfo, tmp_path: Path) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    (tmp_path / "other").mkdir()
    _, other_receipt, _ = export_hostile(tmp_path / "other", rows=3)
    replacement = other_receipt.read_bytes()
    assert replacement != receipt.read_bytes() and FileReceipt.from_bytes(replacement)

    def replace_receipt(request: ClickHouseRequest) -> None:
        if request.query_id.endswith("-insert"):  # a valid receipt of another file, atomically
            staged = receipt.with_name("incoming.json")
            staged.write_bytes(replacement)
            staged.replace(receipt)

    with pytest.raises(DponeError) as caught:
        interfering_sink(clickhouse, tmp_path / "work", replace_receipt).stage_validated_file(
            path, receipt, attempt_id="receipt-1"
        )
    assert caught.value.code == "receipt_replaced"
    assert states(tmp_path / "work" / "receipt-1")[-1] == "failed_cleaned"
    assert not table_exists(clickhouse, "dpone_stage_receipt_h1")
    assert receipt.read_bytes() == replacement  # the user's file is left as they made it


def test_preparation_deadline_fails_before_anything_remote(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    now = [0.0]

    def clock() -> float:
        return now[0]

    def late(request: ClickHouseRequest, inner: Any, deadline: float) -> QueryResult | None:
        if "-read-absent-" not in request.query_id:
            return None
        result: QueryResult = inner.execute(request, deadline=deadline)
        now[0] += 2.0  # the last pre-CREATE check ends after the preparation deadline
        return result

    cfg = config(clickhouse, tmp_path / "work", preparation_seconds=1.5)
    inner = HttpTransport(cfg.endpoint, cfg.credentials, clock=clock)
    svc = ClickHouseValidatedFileService(
        Wrapped(inner, late),
        DB,
        journal_factory=file_journals(tmp_path / "work"),
        policy=cfg.policy,
        clock=clock,
    )
    with pytest.raises(DponeError) as caught:
        svc.stage(ContractValidatedFileArtifact(path, receipt), "deadline-1")
    assert caught.value.code == "phase_deadline", caught.value
    assert (caught.value.code, caught.value.details["phase"]) == (
        "phase_deadline",
        "pre-CREATE checks",
    )
    docs = documents(tmp_path / "work" / "deadline-1")
    assert [d["state"] for d in docs] == ["checking", "prepared", "failed_cleaned"]
    assert not any(d["outcome"] == "intent" for d in docs)  # no mutation was ever intended
    chhttp.query(clickhouse.http_port, "SYSTEM FLUSH LOGS")
    sent = chhttp.rows(
        clickhouse.http_port,
        "SELECT DISTINCT query_kind FROM system.query_log "
        "WHERE query_id LIKE 'dpone-b02-deadline-1-%'",
    )
    assert sent == [{"query_kind": "Select"}]  # reads only: nothing remote changed
    assert not table_exists(clickhouse, "dpone_stage_deadline_h1")
    assert not (tmp_path / "work" / "deadline-1" / "spool").exists()


def test_no_credentials_in_any_artifact_and_the_principal_in_every_event(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, data = export_hostile(tmp_path)
    [admin_view] = chhttp.rows(
        clickhouse.http_port, "SELECT toString(id) AS id FROM system.users WHERE name = 'stager'"
    )
    cfg = dataclasses.replace(
        config(clickhouse, tmp_path / "work"),
        credentials=Credentials("stager", STAGER_PASSWORD),
        principal_uuid=admin_view["id"],
    )
    sink = ClickHouseSink(cfg)
    staged = sink.stage_validated_file(path, receipt, attempt_id="secret-1")
    assert staged.rows == len(data)
    # A failing attempt too: its journal, its retained files.
    with pytest.raises(DponeError):
        sink.stage_validated_file(path, receipt, attempt_id="secret-1")
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "attempt.json" for p in files)
    for secret in (STAGER_PASSWORD, STAGER_PASSWORD.encode().hex(), "stager-Pw"):
        for file in files:
            assert secret.encode() not in file.read_bytes(), file
    docs = documents(staged.journal_path)
    assert {tuple(sorted(d["principal"].items())) for d in docs} == {
        (("user", "stager"), ("user_uuid", admin_view["id"]))
    }


def test_the_principal_is_observed_by_a_user_who_may(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    staged = ClickHouseSink(config(clickhouse, tmp_path / "work")).stage_validated_file(
        path, receipt, attempt_id="principal-1"
    )
    [row] = chhttp.rows(
        clickhouse.http_port,
        f"SELECT toString(id) AS id FROM system.users WHERE name = '{ADMIN_USER}'",
    )
    assert all(
        d["principal"] == {"user": ADMIN_USER, "user_uuid": row["id"]}
        for d in documents(staged.journal_path)
    )


class FailingStagedRecord(ClickHouseFileAttemptJournal):
    """The `staged` event's publication fails once, as a full disk would fail it (the
    journal takes the unpublished file back); every other event is written."""

    failed = False

    def _publish(self, events_fd: int, sequence: int, data: bytes) -> None:
        if b'"state":"staged"' in data and not type(self).failed:
            type(self).failed = True
            raise JournalError("disk full (simulated)", code="journal_write_failed")
        super()._publish(events_fd, sequence, data)


def test_a_staged_record_that_fails_is_cleaned_up_like_any_failure(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    """Before: the state moved to staged before the record; its failure then refused the
    cleanup (invalid_transition): no DROP, no terminal event, the table left (issue 37,
    item 10)."""
    path, receipt, _ = export_hostile(tmp_path)
    cfg = config(clickhouse, tmp_path / "work")
    journal = type("J", (FailingStagedRecord,), {})
    sink = ClickHouseSink(cfg, journal_factory=file_journals(cfg.work_dir, journal))
    with pytest.raises(DponeError) as caught:
        sink.stage_validated_file(path, receipt, attempt_id="staged-fails")
    assert caught.value.code == "journal_write_failed", caught.value
    events = documents(tmp_path / "work" / "staged-fails")
    assert "staged" not in [e["state"] for e in events]
    assert events[-1]["state"] == "failed_cleaned" and events[-1]["outcome"] == "terminal"
    assert events[-1]["error_code"] == "journal_write_failed"
    assert not table_exists(clickhouse, "dpone_stage_staged_hfails")
    [summary] = list_attempts(tmp_path / "work")
    assert not summary.needs_operator, summary


class SwappedAfterAdmission(ClickHouseFileAttemptJournal):
    """Once the attempt is admitted (before its preparation), its directory is moved
    away and a symbolic link to another directory takes its name."""

    def record(self, fields: Any) -> Any:
        event = super().record(fields)
        if fields.get("outcome") == "admitted":
            real = self.attempt_dir.with_name(self.attempt_dir.name + ".real")
            self.attempt_dir.rename(real)
            elsewhere = self.attempt_dir.with_name("elsewhere")
            (elsewhere / "events").mkdir(parents=True)
            self.attempt_dir.symlink_to(elsewhere, target_is_directory=True)
        return event


def test_a_spool_is_written_where_its_journal_is_and_a_swapped_path_refused(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    """Before: the whole RowBinary copy went through the link, release_spool removed
    nothing, the attempt ended staged with a copy left where the link pointed (issue 37,
    item 9)."""
    path, receipt, _ = export_hostile(tmp_path)
    cfg = config(clickhouse, tmp_path / "work")
    sink = ClickHouseSink(cfg, journal_factory=file_journals(cfg.work_dir, SwappedAfterAdmission))
    with pytest.raises(DponeError) as caught:
        sink.stage_validated_file(path, receipt, attempt_id="swapped-1")
    assert caught.value.code == "spool_moved", caught.value
    work = tmp_path / "work"
    assert list((work / "elsewhere").rglob("*")) == [work / "elsewhere" / "events"]  # no data
    real = work / "swapped-1.real"
    assert not (real / "spool").exists()  # written there, then removed there
    events = documents(real)
    assert (events[-1]["state"], events[-1]["error_code"]) == ("failed_cleaned", "spool_moved")
    assert not table_exists(clickhouse, "dpone_stage_swapped_h1")


def test_a_failure_at_admission_is_recorded_as_the_attempts_end(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    """Reversal (issue 37, item 14): without the failure record on the admission path, an
    attempt refused there (its file no longer the receipt's) left a journal with no
    terminal event, which asks an operator to look at an attempt that did nothing."""
    path, receipt, _ = export_hostile(tmp_path)
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01  # the file is no longer the one the receipt describes
    path.write_bytes(bytes(data))
    cfg = config(clickhouse, tmp_path / "work")
    with pytest.raises(DponeError) as caught:
        ClickHouseSink(cfg).stage_validated_file(path, receipt, attempt_id="admission-1")
    events = documents(tmp_path / "work" / "admission-1")
    assert [(e["state"], e["outcome"]) for e in events] == [("failed_cleaned", "terminal")]
    assert events[-1]["error_code"] == caught.value.code
    [summary] = list_attempts(tmp_path / "work")
    assert not summary.needs_operator, summary
    assert caught.value.details["journal"] == str(tmp_path / "work" / "admission-1")


def _to_main_thread(signum: int) -> None:
    """``signum`` to the main thread, which holds it while an intent is journaled: a
    test process may keep threads of earlier tests, and a signal sent to the process
    could reach one of those instead (a dpone command has no such thread then)."""
    signal.pthread_kill(threading.main_thread().ident or 0, signum)


class SignalledAtTheInsertIntent(ClickHouseFileAttemptJournal):
    """SIGTERM reaches the process the moment the INSERT's intent is journaled."""

    def record(self, fields: Any) -> Any:
        event = super().record(fields)
        if fields.get("query", {}).get("kind") == "insert" and fields.get("outcome") == "intent":
            _to_main_thread(signal.SIGTERM)
        return event


def test_a_signal_as_the_insert_is_journaled_ends_with_a_proven_outcome(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    """Before: the signal came between the durable intent and the request, nothing said
    the request never left, and cleanup could never prove its termination
    (retained_unknown, then termination_unproven at every `attempts cleanup`; issue 37,
    item 8). Now it is raised once the intent is known: not_submitted, dropped."""

    def terminated(signum: int, frame: object) -> None:
        raise Terminated(signum)

    path, receipt, _ = export_hostile(tmp_path)
    cfg = config(clickhouse, tmp_path / "work")
    sink = ClickHouseSink(
        cfg, journal_factory=file_journals(cfg.work_dir, SignalledAtTheInsertIntent)
    )
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        with pytest.raises(Terminated):
            sink.stage_validated_file(path, receipt, attempt_id="signal-1")
    finally:
        signal.signal(signal.SIGTERM, previous)
    events = documents(tmp_path / "work" / "signal-1")
    settled = [e.get("settled") for e in events if e.get("settled")]
    assert {"query_id": "dpone-b02-signal-1-insert", "by": "not_submitted"} in settled, events
    assert events[-1]["state"] == "failed_cleaned", events[-1]
    assert not table_exists(clickhouse, "dpone_stage_signal_h1")
    [summary] = list_attempts(tmp_path / "work")
    assert not summary.needs_operator, summary


class SignalledAtTheDropIntent(ClickHouseFileAttemptJournal):
    """SIGTERM reaches the process the moment cleanup's DROP intent is journaled."""

    def record(self, fields: Any) -> Any:
        event = super().record(fields)
        if fields.get("outcome") == "drop_intent":
            _to_main_thread(signal.SIGTERM)
        return event


def test_a_signal_as_the_drop_is_journaled_leaves_it_settled_not_submitted(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    """The same gap for cleanup's DROP (found by review): its intent is settled
    not_submitted, so `attempts cleanup` later needs no proof of a query never sent."""

    def terminated(signum: int, frame: object) -> None:
        raise Terminated(signum)

    path, receipt, _ = export_hostile(tmp_path)
    cfg = config(clickhouse, tmp_path / "work")
    sink = ClickHouseSink(
        cfg,
        runner_factory=runner(Interfering(build_transport(cfg), WRONG_COUNT)),
        journal_factory=file_journals(cfg.work_dir, SignalledAtTheDropIntent),
    )
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        with pytest.raises(DponeError) as caught:  # the primary failure stays the error
            sink.stage_validated_file(path, receipt, attempt_id="dropsig-1")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert caught.value.code == "count_mismatch"
    events = documents(tmp_path / "work" / "dropsig-1")
    settled = [e.get("settled") for e in events if e.get("settled")]
    assert {"query_id": "dpone-b02-dropsig-1-drop", "by": "not_submitted"} in settled, events
    assert events[-1]["state"] == "cleanup_failed", events[-1]
    assert table_exists(clickhouse, "dpone_stage_dropsig_h1")  # never sent: still there
