"""Query-log proofs bound to the mutation's origin (issue 9, item 14), on the real server.

Attempt ids come from users, so anyone can run a query under the id
``dpone-b02-<attempt>-insert``. Such a run (another user, another database, or
before the attempt's dispatch window) must never prove that the attempt's mutation
finished, neither inside the service (cleanup after a lost answer) nor in
``attempts cleanup``; the attempt's own finished query still proves it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_tables import staging_table_name
from dpone.connectors.remote_termination import START_WINDOW_SLACK_SECONDS
from dpone.errors import DponeError
from dpone.localserver import ADMIN_USER, ServerInfo, admin_credentials
from dpone.ports.clickhouse_errors import ClickHouseServerError, OutcomeUnknown
from dpone.ports.clickhouse_request import ClickHouseRequest, Credentials, Endpoint, read
from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
from dpone.staging.composition import build_transport
from dpone.staging.recovery import cleanup_attempt
from tests.plugins.managed_server import STAGER_PASSWORD
from tests.plugins.staging import (
    DB,
    config,
    documents,
    export_hostile,
    table_exists,
    wrapped_service,
)

pytestmark = pytest.mark.usefixtures("staging_database")  # the databases, for every test here

# Stages one attempt as the administrator and dies (SIGKILL) around journal event ``at``:
# "after" it is durable, or "before" it is written (the request it follows has run).
CHILD = textwrap.dedent(
    f"""
    import os, signal, sys
    from pathlib import Path
    from dpone.staging.journal import ClickHouseFileAttemptJournal, file_journals
    from dpone.ports.clickhouse_request import Credentials, Endpoint
    from dpone.staging.composition import StagingConfig, build_transport
    from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
    from dpone.staging.service import ClickHouseValidatedFileService

    http, tcp, work, path, receipt, attempt, when, at = sys.argv[1:]

    class Crashing(ClickHouseFileAttemptJournal):
        def record(self, fields):
            if when == "before" and self.sequence + 1 == int(at):
                os.kill(os.getpid(), signal.SIGKILL)
            event = super().record(fields)
            if when == "after" and event.sequence == int(at):
                os.kill(os.getpid(), signal.SIGKILL)
            return event

    # The administrator, as the CLI gets it from the environment (never argv).
    admin = Credentials(os.environ["DPONE_CLICKHOUSE_USER"], os.environ["DPONE_CLICKHOUSE_PASSWORD"])
    cfg = StagingConfig(Endpoint("127.0.0.1", int(http), int(tcp), "{DB}"), admin, Path(work))
    svc = ClickHouseValidatedFileService(build_transport(cfg), "{DB}", journal_factory=file_journals(Path(work), Crashing))
    svc.stage(ContractValidatedFileArtifact(Path(path), Path(receipt)), attempt)
    """
)
INSERT_INTENT = 4  # checking, prepared, CREATE intent, INSERT intent (the identity exists)


@pytest.fixture(autouse=True)
def act_as_admin(clickhouse: ServerInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    """Child stagers act as the server's administrator (credentials via the environment)."""
    admin = admin_credentials(clickhouse.data_dir)
    monkeypatch.setenv("DPONE_CLICKHOUSE_USER", admin.user)
    monkeypatch.setenv("DPONE_CLICKHOUSE_PASSWORD", admin.password)


def crash(info: ServerInfo, work: Path, attempt: str, when: str, at: int) -> list[dict[str, Any]]:
    """Stage ``attempt`` in a child that dies around event ``at``; its journal."""
    path, receipt, _ = export_hostile(work.parent)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(info.http_port),
            str(info.tcp_port),
            str(work),
            str(path),
            str(receipt),
            attempt,
            when,
            str(at),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == -9, child.stderr
    docs = documents(work / attempt)
    intent = docs[INSERT_INTENT - 1]
    assert (intent["outcome"], intent["query"]) == (
        "intent",
        {"kind": "insert", "query_id": f"dpone-b02-{attempt}-insert"},
    )
    assert intent["principal"]["user"] == ADMIN_USER
    return docs


def foreign(info: ServerInfo, query_id: str, *, user: str, database: str, fails: bool) -> None:
    """Someone else's query under ``query_id``: succeeds, or fails before it starts."""
    credentials = (
        Credentials(user, STAGER_PASSWORD) if user == "stager" else admin_credentials(info.data_dir)
    )
    transport = HttpTransport(
        Endpoint("127.0.0.1", info.http_port, info.tcp_port, database), credentials
    )
    sql = f"SELECT * FROM {DB}.no_such_table" if fails else "SELECT 1"
    request = read(sql, query_id)
    if fails:
        with pytest.raises(ClickHouseServerError):
            transport.execute(request, deadline=time.monotonic() + 60)
    else:
        assert transport.execute(request, deadline=time.monotonic() + 60).output == b"1\n"


def operator_transport(info: ServerInfo, work: Path) -> Any:
    return build_transport(config(info, work))


# ---------------------------------------------------------------- attempts cleanup


@pytest.mark.parametrize(
    ("user", "database", "before_window"),
    [("stager", DB, False), (ADMIN_USER, "default", False), (ADMIN_USER, DB, True)],
    ids=["another_user", "another_database", "before_the_window"],
)
def test_cleanup_ignores_a_foreign_run_of_the_unsent_insert_id(
    clickhouse: ServerInfo, tmp_path: Path, user: str, database: str, before_window: bool
) -> None:
    attempt = f"foreign-{user}-{database.replace('_', '')}-{int(before_window)}"
    query_id = f"dpone-b02-{attempt}-insert"
    work = tmp_path / "work"
    if before_window:
        foreign(clickhouse, query_id, user=user, database=database, fails=False)
        ran = time.time()
        # The attempt's dispatch window must open after the foreign start plus the slack.
        while time.time() < ran + START_WINDOW_SLACK_SECONDS + 1.0:
            time.sleep(0.1)
    # The INSERT intent is durable; the INSERT itself was never sent.
    docs = crash(clickhouse, work, attempt, "after", INSERT_INTENT)
    assert len(docs) == INSERT_INTENT
    if not before_window:
        foreign(clickhouse, query_id, user=user, database=database, fails=False)
    table = staging_table_name(attempt)
    assert table_exists(clickhouse, table)
    with pytest.raises(DponeError) as caught:
        cleanup_attempt(operator_transport(clickhouse, work), work, attempt, database=DB)
    assert (caught.value.code, caught.value.details["query_id"]) == (
        "termination_unproven",
        query_id,
    )
    assert f"by {ADMIN_USER} in {DB}" in caught.value.message
    assert documents(work / attempt) == docs  # a refused cleanup writes nothing
    assert table_exists(clickhouse, table)  # and drops nothing


def test_cleanup_proves_the_attempts_own_insert_despite_a_foreign_failure(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    attempt = "own-insert-1"
    query_id = f"dpone-b02-{attempt}-insert"
    work = tmp_path / "work"
    # The INSERT ran and was acknowledged; the process died before recording it.
    docs = crash(clickhouse, work, attempt, "before", INSERT_INTENT + 1)
    assert len(docs) == INSERT_INTENT
    # Another user's failing run of the same id: without the origin the two runs
    # disagree and nothing would be proven.
    foreign(clickhouse, query_id, user="stager", database=DB, fails=True)
    summary = cleanup_attempt(operator_transport(clickhouse, work), work, attempt, database=DB)
    assert summary.state == "failed_cleaned"
    proofs = [
        d["remote"] for d in documents(work / attempt) if d["outcome"] == "termination_observed"
    ]
    assert proofs == [{"query_id": query_id, "termination": "finished_ok", "source": "query_log"}]
    assert not table_exists(clickhouse, "dpone_stage_own_hinsert_h1")


# ---------------------------------------------------------------- inside the service


def lost(suffix: str, info: ServerInfo, *, run_it: bool, foreign_fails: bool) -> Any:
    """The request ending ``suffix`` runs (or not), a stager runs its id, the answer is lost."""

    def fault(request: ClickHouseRequest, inner: Any, deadline: float) -> None:
        if request.query_id.endswith(suffix):
            if run_it:
                inner.execute(request, deadline=deadline)
            foreign(info, request.query_id, user="stager", database=DB, fails=foreign_fails)
            raise OutcomeUnknown(
                "connection lost (simulated)", code="connection_lost", query_id=request.query_id
            )

    return fault


@pytest.mark.parametrize(
    ("suffix", "run_it", "foreign_fails", "count", "termination", "ending"),
    [
        ("-insert", False, False, None, "unknown", "retained_unknown"),
        ("-drop", False, False, b'{"n":1}\n', "unknown", "retained_unknown"),
        ("-insert", True, True, None, "finished_ok", "failed_cleaned"),
    ],
    ids=["insert_never_ran", "drop_never_ran", "own_insert_ran"],
)
def test_the_service_proves_only_its_own_query(
    clickhouse: ServerInfo,
    tmp_path: Path,
    suffix: str,
    run_it: bool,
    foreign_fails: bool,
    count: bytes | None,
    termination: str,
    ending: str,
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    attempt = f"svc{suffix}-{int(run_it)}"
    fault = lost(suffix, clickhouse, run_it=run_it, foreign_fails=foreign_fails)
    with pytest.raises(DponeError):
        wrapped_service(clickhouse, tmp_path / "work", fault, count).stage(
            ContractValidatedFileArtifact(path, receipt), attempt
        )
    docs = documents(tmp_path / "work" / attempt)
    observed = [d["remote"] for d in docs if d["outcome"] == "termination_observed"]
    assert observed[-1] == {
        "query_id": f"dpone-b02-{attempt}{suffix}",
        "termination": termination,
        "source": "query_log" if termination == "finished_ok" else "none",
    }
    assert docs[-1]["state"] == ending
    table = "dpone_stage_" + attempt.replace("-", "_h")
    assert table_exists(clickhouse, table) is (ending == "retained_unknown")
