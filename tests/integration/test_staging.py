"""stage_validated_file end to end on the real server, with faults."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from dpone.errors import DponeError, JournalError
from dpone.localserver import ServerInfo, admin_credentials
from dpone.ports.clickhouse_request import ClickHouseRequest, Endpoint
from dpone.ports.clickhouse_result import QueryResult
from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
from dpone.sinks import ClickHouseSink
from dpone.staging.composition import build_transport
from dpone.staging.journal import file_journals, read_events
from dpone.staging.recovery import list_attempts
from dpone.staging.service import ClickHouseValidatedFileService
from tests import chhttp
from tests.plugins.staging import (
    DB,
    Interfering,
    config,
    export_hostile,
    fake_count,
    interfering_sink,
    runner,
    states,
    table_exists,
)

pytestmark = pytest.mark.usefixtures("staging_database")  # the databases, for every test here


@pytest.fixture
def kind(transport_kind: str) -> str:
    return transport_kind


def test_hostile_values_stage_and_read_back_equal(
    kind: str, clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, data = export_hostile(tmp_path)
    staged = ClickHouseSink(config(clickhouse, tmp_path / "work", kind)).stage_validated_file(
        path, receipt, attempt_id=f"hostile-{kind}"
    )
    assert staged.rows == len(data)
    got = chhttp.rows(
        clickhouse.http_port,
        f"SELECT id, hex(txt) AS t, isNull(txt) AS tn, hex(bin) AS b, isNull(bin) AS bn, toString(g) AS g FROM {DB}.{staged.table} ORDER BY id",
    )
    expected = sorted(data, key=lambda r: r[0])
    assert [r["id"] for r in got] == [r[0] for r in expected]
    for row, (_, text, blob, guid) in zip(got, expected, strict=True):
        assert (row["tn"], row["bn"]) == (text is None, blob is None)
        assert text is None or bytes.fromhex(row["t"]).decode() == text
        assert blob is None or bytes.fromhex(row["b"]) == blob
        assert row["g"] == (None if guid is None else guid.lower())
    assert states(staged.journal_path) == [
        "checking",
        "prepared",
        "creating_staging",
        "loading",
        "verifying",
        "staged",
    ]
    consumption = staged.metadata["validated_file_consumption"]
    assert consumption["record"]["state"] == "staged" and consumption["journal"] == str(
        staged.journal_path
    )
    assert consumption["record"]["counts"] == {
        "prepared_rows": len(data),
        "observed_count": len(data),
    }
    assert not (staged.journal_path / "spool").exists()
    journal_text = b"".join(p.read_bytes() for p in staged.journal_path.rglob("attempt.json"))
    assert str(path).encode() not in journal_text  # no source path
    for value in (b"NULL", "עברית".encode(), b"dup"):
        assert value not in journal_text  # no source values


def test_empty_input_is_not_submitted_and_counted_zero(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, _ = export_hostile(tmp_path, rows=0)
    staged = ClickHouseSink(config(clickhouse, tmp_path / "work")).stage_validated_file(
        path, receipt, attempt_id="empty-1"
    )
    assert staged.rows == 0
    events = read_events(staged.journal_path)
    loading = next(e.document for e in events if e.document["state"] == "loading")
    assert loading["outcome"] == "not_submitted_empty" and loading["query"] == {
        "kind": "insert",
        "query_id": None,
    }
    assert events[-1].document["counts"] == {"prepared_rows": 0, "observed_count": 0}


def test_every_event_records_counts_null_until_known(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, data = export_hostile(tmp_path)
    staged = ClickHouseSink(config(clickhouse, tmp_path / "work")).stage_validated_file(
        path, receipt, attempt_id="counts-1"
    )
    n = len(data)
    assert [
        (e.document["state"], e.document["counts"]) for e in read_events(staged.journal_path)
    ] == [
        ("checking", {"prepared_rows": None, "observed_count": None}),  # admitted
        ("prepared", {"prepared_rows": n, "observed_count": None}),
        ("creating_staging", {"prepared_rows": n, "observed_count": None}),
        ("loading", {"prepared_rows": n, "observed_count": None}),
        ("verifying", {"prepared_rows": n, "observed_count": None}),
        ("staged", {"prepared_rows": n, "observed_count": n}),
    ]
    # A failure at admission: its one event says nothing is known yet.
    with open(path, "ab") as f:
        f.write(b"1\t\t\t\n")
    with pytest.raises(DponeError):
        ClickHouseSink(config(clickhouse, tmp_path / "work")).stage_validated_file(
            path, receipt, attempt_id="counts-2"
        )
    [failed] = read_events(tmp_path / "work" / "counts-2")
    assert failed.document["counts"] == {"prepared_rows": None, "observed_count": None}


@pytest.mark.parametrize(
    ("output", "code"),
    [
        (b'{"n":88}\n', "count_mismatch"),
        (b'{"n":true}\n', "count_unobservable"),
        (b'{"n":"87"}\n', "count_unobservable"),
        (b"", "count_unobservable"),
        (b'{"n":87}\n{"n":87}\n', "count_unobservable"),
        (b'{"m":87}\n', "count_unobservable"),
    ],
)
def test_wrong_counts_fail_and_clean_up(
    clickhouse: ServerInfo, tmp_path: Path, output: bytes, code: str
) -> None:
    path, receipt, data = export_hostile(tmp_path)
    if b"87" in output:
        output = output.replace(b"87", str(len(data)).encode())
    sink = interfering_sink(clickhouse, tmp_path / "work", fake_count(output))
    attempt = f"count-{abs(hash(output)) % 10**8}"
    with pytest.raises(DponeError) as caught:
        sink.stage_validated_file(path, receipt, attempt_id=attempt)
    assert caught.value.code == code
    assert caught.value.details["last_event"]["state"] == "failed_cleaned"
    assert not table_exists(clickhouse, f"dpone_stage_{attempt.replace('-', '_h')}")
    assert states(tmp_path / "work" / attempt)[-3:] == ["cleanup", "cleanup", "failed_cleaned"]
    assert not (tmp_path / "work" / attempt / "spool").exists()


def test_table_altered_between_checks_is_refused(clickhouse: ServerInfo, tmp_path: Path) -> None:
    path, receipt, _ = export_hostile(tmp_path)

    seen = 0

    def alter(request: ClickHouseRequest) -> None:
        nonlocal seen
        if "-read-table-" in request.query_id or "-read-verify-" in request.query_id:
            seen += 1
            if seen == 2:  # after the INSERT, before the second identity check
                chhttp.query(
                    clickhouse.http_port,
                    f"ALTER TABLE {DB}.dpone_stage_altered_h1 ADD COLUMN extra Int8",
                )

    with pytest.raises(DponeError) as caught:
        interfering_sink(clickhouse, tmp_path / "work", alter).stage_validated_file(
            path, receipt, attempt_id="altered-1"
        )
    assert caught.value.code == "table_identity_mismatch"
    assert "columns differ" in str(caught.value)
    assert not table_exists(
        clickhouse, "dpone_stage_altered_h1"
    )  # ours (comment, UUID) and dropped


def test_source_modified_during_insert_is_detected(clickhouse: ServerInfo, tmp_path: Path) -> None:
    path, receipt, _ = export_hostile(tmp_path)

    def tamper(request: ClickHouseRequest) -> None:
        if request.query_id.endswith("-insert"):
            with open(path, "r+b") as f:
                f.write(b"9")

    with pytest.raises(DponeError) as caught:
        interfering_sink(clickhouse, tmp_path / "work", tamper).stage_validated_file(
            path, receipt, attempt_id="tamper-1"
        )
    assert caught.value.code == "artifact_hash_mismatch"
    assert states(tmp_path / "work" / "tamper-1")[-1] == "failed_cleaned"
    assert not table_exists(clickhouse, "dpone_stage_tamper_h1")


def test_spool_modified_before_insert_is_detected(clickhouse: ServerInfo, tmp_path: Path) -> None:
    path, receipt, _ = export_hostile(tmp_path)

    def tamper(request: ClickHouseRequest) -> None:
        if request.query_id.endswith("-insert") and request.body is not None:
            os.chmod(request.body, 0o600)
            with open(request.body, "r+b") as f:
                f.write(b"\x07")

    with pytest.raises(DponeError) as caught:
        interfering_sink(clickhouse, tmp_path / "work", tamper).stage_validated_file(
            path, receipt, attempt_id="spool-1"
        )
    assert caught.value.code == "sent_bytes_mismatch"
    assert not table_exists(clickhouse, "dpone_stage_spool_h1")


def test_source_modified_before_admission_fails_clean(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    with open(path, "ab") as f:
        f.write(b"1\t\t\t\n")
    with pytest.raises(DponeError) as caught:
        ClickHouseSink(config(clickhouse, tmp_path / "work")).stage_validated_file(
            path, receipt, attempt_id="early-1"
        )
    assert caught.value.code == "artifact_size_mismatch"
    assert states(tmp_path / "work" / "early-1") == ["failed_cleaned"]


def test_existing_attempt_is_refused(clickhouse: ServerInfo, tmp_path: Path) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    sink = ClickHouseSink(config(clickhouse, tmp_path / "work"))
    sink.stage_validated_file(path, receipt, attempt_id="twice-1")
    with pytest.raises(JournalError) as caught:
        sink.stage_validated_file(path, receipt, attempt_id="twice-1")
    assert caught.value.code == "attempt_exists"
    assert states(tmp_path / "work" / "twice-1")[-1] == "staged"


def test_auto_transport_is_refused(clickhouse: ServerInfo, tmp_path: Path) -> None:
    with pytest.raises(DponeError) as caught:
        build_transport(dataclasses.replace(config(clickhouse, tmp_path), transport="auto"))
    assert caught.value.code == "invalid_transport"


def test_server_stopped_mid_insert_retains_everything(kind: str, tmp_path: Path) -> None:
    import signal
    import time

    from dpone.connectors.clickhouse_client import ClientTransport
    from dpone.connectors.clickhouse_http import HttpTransport
    from dpone.localserver import LocalServer

    path, receipt, _ = export_hostile(tmp_path)
    with LocalServer(tmp_path / "victim") as victim:
        info = victim.info
        chhttp.register_server(info.http_port, info.data_dir)
        chhttp.query(info.http_port, f"CREATE DATABASE {DB} ENGINE = Atomic")
        inserting = False
        readings = 0

        def clock() -> float:
            nonlocal readings
            if inserting:
                readings += 1
                if readings == 3:  # the request is on its way: the server dies mid-INSERT
                    os.kill(info.pid, signal.SIGKILL)
                    time.sleep(0.3)
            return time.monotonic()

        endpoint = Endpoint("127.0.0.1", info.http_port, info.tcp_port, DB)
        inner = (HttpTransport if kind == "http" else ClientTransport)(
            endpoint, admin_credentials(info.data_dir), clock=clock
        )

        def arm(request: ClickHouseRequest) -> None:
            nonlocal inserting
            inserting = request.query_id.endswith("-insert")

        sink = ClickHouseSink(
            config(info, tmp_path / "work", kind), runner_factory=runner(Interfering(inner, arm))
        )
        with pytest.raises(DponeError) as caught:
            sink.stage_validated_file(path, receipt, attempt_id=f"victim-{kind}")
        victim._process.wait()  # type: ignore[union-attr]
        victim._process = None
    assert caught.value.details["last_event"]["state"] == "retained_unknown", getattr(
        caught.value, "__notes__", None
    )
    attempt_dir = tmp_path / "work" / f"victim-{kind}"
    assert (attempt_dir / "spool" / "data.rowbinary").exists()  # retained for the operator
    [summary] = list_attempts(tmp_path / "work")
    assert summary.needs_operator and summary.state == "retained_unknown"
    assert summary.table_uuid is not None
    assert summary.inventory["table"] == {
        "database": DB,
        "table": f"dpone_stage_victim_h{kind}",
        "uuid": summary.table_uuid,
    }
    assert summary.sent_mutations[-1] == f"dpone-b02-victim-{kind}-insert"


def test_lost_insert_acknowledgment_is_proven_before_cleanup(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    from dpone.ports.clickhouse_errors import OutcomeUnknown

    path, receipt, _ = export_hostile(tmp_path)
    cfg = config(clickhouse, tmp_path / "work")
    inner: Any = build_transport(cfg)

    class LosingAcks:
        name = inner.name
        endpoint = inner.endpoint

        def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
            result: QueryResult = inner.execute(request, deadline=deadline)
            if request.query_id.endswith("-insert"):  # the INSERT ran; its answer is lost
                raise OutcomeUnknown(
                    "connection lost (simulated)", code="connection_lost", query_id=request.query_id
                )
            return result

    phases: list[tuple[str, int, int]] = []
    sink = ClickHouseSink(
        cfg, runner_factory=runner(LosingAcks()), progress=lambda *p: phases.append(p)
    )
    with pytest.raises(OutcomeUnknown):
        sink.stage_validated_file(path, receipt, attempt_id="lost-ack-1")
    events = [e.document for e in read_events(tmp_path / "work" / "lost-ack-1")]
    observed = next(e for e in events if e["outcome"] == "termination_observed")
    assert observed["remote"] == {
        "query_id": "dpone-b02-lost-ack-1-insert",
        "termination": "finished_ok",
        "source": "query_log",
    }
    assert [e["outcome"] for e in events][-3:] == [
        "termination_observed",
        "drop_intent",
        "terminal",
    ]
    assert events[-1]["state"] == "failed_cleaned"
    assert not table_exists(clickhouse, "dpone_stage_lost_hack_h1")
    assert phases and phases[-1][0] == "loading"


def test_verification_deadline_after_the_insert(clickhouse: ServerInfo, tmp_path: Path) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    now = [0.0]

    def jump(request: ClickHouseRequest) -> None:
        if "-read-verify-" in request.query_id:  # the first read after the INSERT
            now[0] += 10_000.0  # the verification phase overruns

    from dpone.connectors.clickhouse_http import HttpTransport

    cfg = config(clickhouse, tmp_path / "work", verification_seconds=60.0)
    inner = HttpTransport(cfg.endpoint, cfg.credentials, clock=lambda: now[0])  # one clock for both
    svc = ClickHouseValidatedFileService(
        Interfering(inner, jump),
        DB,
        journal_factory=file_journals(tmp_path / "work"),
        policy=cfg.policy,
        clock=lambda: now[0],
    )
    with pytest.raises(DponeError) as caught:
        svc.stage(ContractValidatedFileArtifact(path, receipt), "late-verify-1")
    # The reads after the INSERT find the verification deadline spent: never sent.
    assert caught.value.code == "transport_deadline" and caught.value.details["submitted"] is False
    assert states(tmp_path / "work" / "late-verify-1")[-1] == "failed_cleaned"
    assert not table_exists(clickhouse, "dpone_stage_late_hverify_h1")


def test_loading_deadline_expires_mid_insert_and_stays_unknown(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    from dpone.connectors.clickhouse_http import HttpTransport

    path, receipt, _ = export_hostile(tmp_path)
    now = [0.0]
    sending = [False]

    def clock() -> float:
        if sending[0]:
            now[0] += 400.0  # each reading while the INSERT streams costs 400 s
        return now[0]

    class WhileInserting:
        """Arms the costly clock for the INSERT's own call only."""

        def __init__(self, inner: Any) -> None:
            self.inner, self.name, self.endpoint = inner, inner.name, inner.endpoint

        def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
            sending[0] = request.query_id.endswith("-insert")
            try:
                result: QueryResult = self.inner.execute(request, deadline=deadline)
                return result
            finally:
                sending[0] = False

    cfg = config(clickhouse, tmp_path / "work", request_seconds=1000.0)
    inner = HttpTransport(cfg.endpoint, cfg.credentials, clock=clock)
    svc = ClickHouseValidatedFileService(
        WhileInserting(inner),
        DB,
        journal_factory=file_journals(tmp_path / "work"),
        policy=cfg.policy,
        clock=clock,
    )
    with pytest.raises(DponeError) as caught:
        svc.stage(ContractValidatedFileArtifact(path, receipt), "late-load-1")
    assert caught.value.code == "transport_deadline" and caught.value.details["submitted"] is True
    events = [e.document for e in read_events(tmp_path / "work" / "late-load-1")]
    observed = next(e for e in events if e["outcome"] == "termination_observed")
    assert observed["remote"]["query_id"] == "dpone-b02-late-load-1-insert"
    # A truncated INSERT body leaves nothing on this server: no process, no query-log
    # entry. Without evidence the outcome stays unknown and everything is retained.
    assert observed["remote"]["termination"] == "unknown"
    assert events[-1]["state"] == "retained_unknown"
    assert table_exists(clickhouse, "dpone_stage_late_hload_h1")
    assert (tmp_path / "work" / "late-load-1" / "spool" / "data.rowbinary").exists()


def test_decoder_and_finalizer_of_the_bundle(clickhouse: ServerInfo, tmp_path: Path) -> None:
    from dpone.staging.composition import build_clickhouse_staging_components

    path, receipt, data = export_hostile(tmp_path)
    components = build_clickhouse_staging_components(config(clickhouse, tmp_path / "work"))
    loaded = components.decoder.load(receipt)
    assert loaded.rows_validated == len(data)
    assert [p.clickhouse_type for p in components.decoder.plans(loaded)] == [
        "Int64",
        "Nullable(String)",
        "Nullable(String)",
        "Nullable(UUID)",
    ]
    staged = components.validated_file.stage(
        ContractValidatedFileArtifact(path, receipt), "bundle-1"
    )
    impostor = dataclasses.replace(staged, uuid="00000000-0000-0000-0000-000000000001")
    with pytest.raises(DponeError) as refused:
        components.finalizer.discard(impostor)
    assert refused.value.code == "ownership_unverified"
    assert table_exists(clickhouse, staged.table)  # nothing dropped on a mismatch
    components.finalizer.discard(staged)
    assert not table_exists(clickhouse, staged.table)
