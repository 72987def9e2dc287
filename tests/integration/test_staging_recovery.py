"""Recovery a user can finish, on a server of its own that is stopped and started.

Covers: cleanup after a restart (acknowledged mutations need no proof; an
unacknowledged one is proven by a server start after its dispatch window), a refused
cleanup that leaves ``attempts list`` unchanged, the journaled identity CREATE of a
fresh server, discarding staged tables (CLI and finalizer), ``journal verify --head``
and what a failed stage tells the user.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from dpone.errors import DponeError
from dpone.localserver import LocalServer, ServerInfo, admin_credentials
from dpone.ports.clickhouse_request import Credentials, Endpoint
from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
from dpone.staging.composition import (
    StagingConfig,
    build_clickhouse_staging_components,
)
from dpone.staging.journal import read_events
from dpone.staging.recovery import finishing_command, left_behind
from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.staging import DB, export_hostile

CHILD = textwrap.dedent(
    f"""
    import os, signal, sys
    from pathlib import Path
    from dpone.staging.journal import ClickHouseFileAttemptJournal, file_journals
    from dpone.ports.clickhouse_request import Credentials, Endpoint
    from dpone.staging.contract import StagingPolicy
    from dpone.staging.composition import StagingConfig, build_transport
    from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
    from dpone.staging.service import ClickHouseValidatedFileService

    http, tcp, work, path, receipt, attempt, crash_after, request_seconds = sys.argv[1:]

    class Crashing(ClickHouseFileAttemptJournal):
        def record(self, fields):
            event = super().record(fields)
            if event.sequence == int(crash_after):
                os.kill(os.getpid(), signal.SIGKILL)
            return event

    # The administrator, as the CLI gets it from the environment (never argv).
    admin = Credentials(os.environ["DPONE_CLICKHOUSE_USER"], os.environ["DPONE_CLICKHOUSE_PASSWORD"])
    cfg = StagingConfig(Endpoint("127.0.0.1", int(http), int(tcp), "{DB}"), admin, Path(work))
    svc = ClickHouseValidatedFileService(build_transport(cfg), "{DB}", journal_factory=file_journals(Path(work), Crashing),
                                         policy=StagingPolicy(request_seconds=float(request_seconds)))
    svc.stage(ContractValidatedFileArtifact(Path(path), Path(receipt)), attempt)
    """
)


def crash(
    info: ServerInfo,
    work: Path,
    path: Path,
    receipt: Path,
    attempt: str,
    after: int,
    request_seconds: float,
) -> None:
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
            str(after),
            str(request_seconds),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == -9, child.stderr


def server_args(info: ServerInfo) -> list[str]:
    return [
        "--database",
        DB,
        "--host",
        "127.0.0.1",
        "--http-port",
        str(info.http_port),
        "--tcp-port",
        str(info.tcp_port),
        "--json",
    ]


def listing(work: Path, *flags: str) -> list[dict[str, Any]]:
    attempts: list[dict[str, Any]] = as_json(
        dpone("attempts", "list", "--work-dir", str(work), "--json", *flags)
    )["attempts"]
    return attempts


def exists(info: ServerInfo, table: str) -> bool:
    return chhttp.query(info.http_port, f"EXISTS TABLE {DB}.{table}") == "1\n"


def act_as_admin(monkeypatch: pytest.MonkeyPatch, data_dir: Path, http_port: int) -> Credentials:
    """Children and ``--host`` commands act as the server's administrator (via the env)."""
    admin = admin_credentials(data_dir)
    monkeypatch.setenv("DPONE_CLICKHOUSE_USER", admin.user)
    monkeypatch.setenv("DPONE_CLICKHOUSE_PASSWORD", admin.password)
    chhttp.register_server(http_port, data_dir)
    return admin


def test_recovery_after_a_server_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    work = tmp_path / "work"
    data_dir = tmp_path / "victim"
    with LocalServer(data_dir) as first:
        info = first.info
        admin = act_as_admin(monkeypatch, data_dir, info.http_port)
        chhttp.query(info.http_port, f"CREATE DATABASE {DB} ENGINE = Atomic")
        # Item 12: a fresh server has no dpone identity; creating it is a journaled mutation.
        components = build_clickhouse_staging_components(
            StagingConfig(
                Endpoint("127.0.0.1", info.http_port, info.tcp_port, DB),
                admin,
                work,
            )
        )
        staged = components.validated_file.stage(
            ContractValidatedFileArtifact(path, receipt), "first-1"
        )
        docs = [e.document for e in read_events(staged.journal_path)]
        assert (docs[0]["state"], docs[0]["outcome"], docs[0]["query"]) == (
            "checking",
            "intent",
            {"kind": "identity", "query_id": "dpone-b02-first-1-identity"},
        )
        assert docs[0]["dispatch"]["not_before_ms"] < docs[0]["dispatch"]["not_after_ms"]
        assert docs[1]["settled"] == {
            "query_id": "dpone-b02-first-1-identity",
            "by": "acknowledged",
        }
        chhttp.query(info.http_port, "SYSTEM FLUSH LOGS")
        kinds = chhttp.rows(
            info.http_port,
            "SELECT DISTINCT query_kind FROM system.query_log "
            "WHERE query_id = 'dpone-b02-first-1-identity'",
        )
        assert kinds == [{"query_kind": "Create"}]
        # Crashes: after the verifying event (CREATE and INSERT acknowledged), and after
        # the INSERT intent (never dispatched; a one-second dispatch window).
        crash(info, work, path, receipt, "acked-1", 5, 600.0)
        crash(info, work, path, receipt, "unacked-1", 4, 1.0)
        assert exists(info, "dpone_stage_acked_h1") and exists(info, "dpone_stage_unacked_h1")
        before = listing(work)
        refused = dpone(
            "attempts", "cleanup", "unacked-1", "--work-dir", str(work), *server_args(info)
        )
        assert (
            refused.returncode == 1 and as_json(refused)["error"]["code"] == "termination_unproven"
        )
        assert listing(work) == before  # a refused cleanup changes nothing anyone sees
        window = next(
            e.document
            for e in read_events(work / "unacked-1")
            if e.document.get("dispatch") and e.document["query"]["kind"] == "insert"
        )["dispatch"]
    # The server starts again only once the INSERT's dispatch window has closed (and the
    # two-second resolution of the start-time bound has passed).
    while time.time() * 1000 < window["not_after_ms"] + 2500:
        time.sleep(0.1)
    with LocalServer(data_dir) as second:
        info = second.info
        act_as_admin(monkeypatch, data_dir, info.http_port)
        for attempt in ("acked-1", "unacked-1"):
            done = dpone(
                "attempts", "cleanup", attempt, "--work-dir", str(work), *server_args(info)
            )
            assert done.returncode == 0, done.stdout + done.stderr
            assert as_json(done)["state"] == "failed_cleaned"
        assert not exists(info, "dpone_stage_acked_h1") and not exists(
            info, "dpone_stage_unacked_h1"
        )
        proofs = [
            e.document["remote"]
            for e in read_events(work / "unacked-1")
            if e.document["outcome"] == "termination_observed"
        ]
        assert [(p["query_id"], p["termination"]) for p in proofs] == [
            ("dpone-b02-unacked-1-insert", "server_restart")
        ]
        # The acknowledged attempt needed no proof at all.
        assert not any(
            e.document["outcome"] == "termination_observed" for e in read_events(work / "acked-1")
        )
        assert {a["attempt_id"] for a in listing(work)} == set()

        # Item 18: the staged table is listed and discarded, with its own journaled DROP.
        [shown] = [a for a in listing(work, "--all") if a["attempt_id"] == "first-1"]
        assert (shown["state"], shown["planned_table"]["table"]) == (
            "staged",
            "dpone_stage_first_h1",
        )
        text = dpone("attempts", "list", "--work-dir", str(work), "--all").stdout
        assert "dpone attempts discard first-1" in text
        gone = dpone("attempts", "discard", "first-1", "--work-dir", str(work), *server_args(info))
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert as_json(gone)["state"] == "discarded" and not exists(info, "dpone_stage_first_h1")
        docs = [e.document for e in read_events(work / "first-1")]
        assert [(d["state"], d["outcome"]) for d in docs[-2:]] == [
            ("discarding", "drop_intent"),
            ("discarded", "discarded"),
        ]
        assert docs[-2]["query"] == {"kind": "discard", "query_id": "dpone-b02-first-1-discard"}
        assert docs[-1]["settled"] == {
            "query_id": "dpone-b02-first-1-discard",
            "by": "acknowledged",
        }
        again = dpone("attempts", "discard", "first-1", "--work-dir", str(work), *server_args(info))
        assert again.returncode == 1 and as_json(again)["error"]["code"] == "not_staged"

        # The finalizer is the same discard, and refuses a handle that is not the table's.
        components = build_clickhouse_staging_components(
            StagingConfig(
                Endpoint("127.0.0.1", info.http_port, info.tcp_port, DB),
                admin,
                work,
            )
        )
        other = components.validated_file.stage(
            ContractValidatedFileArtifact(path, receipt), "second-1"
        )
        impostor = dataclasses.replace(other, uuid="00000000-0000-0000-0000-000000000001")
        with pytest.raises(DponeError) as caught:
            components.finalizer.discard(impostor)
        assert caught.value.code == "ownership_unverified"
        assert exists(info, "dpone_stage_second_h1")
        assert (
            read_events(work / "second-1")[-1].document["state"] == "staged"
        )  # refusal writes nothing
        components.finalizer.discard(other)
        assert not exists(info, "dpone_stage_second_h1")
        assert (
            read_events(work / "second-1")[-2].document["query"]["query_id"]
            == "dpone-b02-second-1-discard"
        )


def test_journal_head_and_what_a_failed_stage_says(
    clickhouse: ServerInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    act_as_admin(monkeypatch, Path(clickhouse.data_dir), clickhouse.http_port)
    path, receipt, _ = export_hostile(tmp_path)
    chhttp.query(clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    work = tmp_path / "work"
    done = dpone(
        "stage",
        str(path),
        "--receipt",
        str(receipt),
        "--work-dir",
        str(work),
        "--attempt-id",
        "head-1",
        *server_args(clickhouse),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    staged = as_json(done)
    head = staged["journal_head"]
    assert head == read_events(work / "head-1")[-1].sha256
    ok = dpone("journal", "verify", staged["journal"], "--head", head, "--json")
    assert ok.returncode == 0 and as_json(ok)["head_checked"] is True
    archived = Path(staged["journal"]).rename(tmp_path / "archived-head-1")
    assert dpone("journal", "verify", str(archived), "--head", head).returncode == 0
    shutil.rmtree(sorted((archived / "events").iterdir())[-1])  # the final event deleted
    cut = dpone("journal", "verify", str(archived), "--head", head, "--json")
    assert cut.returncode == 1 and as_json(cut)["error"]["code"] == "journal_head_mismatch"
    (tmp_path / "empty" / "events").mkdir(parents=True)
    empty = dpone("journal", "verify", str(tmp_path / "empty"), "--json")
    assert empty.returncode == 1 and as_json(empty)["error"]["code"] == "journal_empty"

    # A stage that fails says what it left and how to finish.
    closed = dpone(
        "stage",
        str(path),
        "--receipt",
        str(receipt),
        "--work-dir",
        str(work),
        "--attempt-id",
        "nowhere-1",
        "--database",
        DB,
        "--host",
        "127.0.0.1",
        "--http-port",
        "1",
        "--tcp-port",
        "1",
    )
    assert closed.returncode == 1
    assert "the attempt nowhere-1 ended failed_cleaned; it left behind:" in closed.stderr
    assert f"journal: {work / 'nowhere-1'}" in closed.stderr


def test_left_behind_names_the_table_spool_and_command(tmp_path: Path) -> None:
    last = {
        "state": "retained_unknown",
        "cleanup_inventory": {
            "spool": "/w/a-1/spool/data.rowbinary",
            "table": {"database": DB, "table": "dpone_stage_a_h1", "uuid": "u-1"},
        },
    }
    assert left_behind(last, Path("/w/a-1")) == {
        "table": f"{DB}.dpone_stage_a_h1 (uuid u-1), may exist",
        "spool": "/w/a-1/spool/data.rowbinary",
        "journal": "/w/a-1",
    }
    assert finishing_command("retained_unknown", "a-1", Path("/my work"), DB) == (
        f"dpone attempts cleanup a-1 --work-dir '/my work' --database {DB}"
    )
    assert (
        finishing_command("staged", "a-1", Path("/w"), DB)
        == f"dpone attempts discard a-1 --work-dir /w --database {DB}"
    )
    assert finishing_command("failed_cleaned", "a-1", Path("/w"), DB) is None
    assert (
        json.dumps(left_behind({"state": "failed_cleaned"}, Path("/w/x"))) == '{"journal": "/w/x"}'
    )


KILLER = textwrap.dedent(
    f"""
    import os, signal, socket, sys, time
    from pathlib import Path
    from dpone.staging.journal import ClickHouseFileAttemptJournal, file_journals
    from dpone.connectors import clickhouse_http
    from dpone.ports.clickhouse_request import Credentials, Endpoint
    from dpone.staging.contract import StagingPolicy
    from dpone.staging.composition import StagingConfig, build_transport
    from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
    from dpone.staging.service import ClickHouseValidatedFileService

    http, tcp, work, path, receipt, attempt, mode, server_pid = sys.argv[1:]

    class DiesAtInsert(ClickHouseFileAttemptJournal):
        # The dispatching process itself dies right after the INSERT's intent.
        def record(self, fields):
            event = super().record(fields)
            if mode == "die" and (fields.get("query") or {{}}).get("kind") == "insert":
                os.kill(os.getpid(), signal.SIGKILL)
            return event

    read = clickhouse_http._BodyStream.read

    def killing_read(self, size=-1):
        # Part of the INSERT's body is on the wire: kill -9 the server, wait until
        # its listener is gone, then go on sending into the dead connection.
        if mode == "kill" and self.sent > 0 and not getattr(self, "killed", False):
            self.killed = True
            os.kill(int(server_pid), signal.SIGKILL)
            while True:
                try:
                    socket.create_connection(("127.0.0.1", int(http)), timeout=1).close()
                except OSError:
                    break
                time.sleep(0.05)
        return read(self, size)

    clickhouse_http._BodyStream.read = killing_read
    admin = Credentials(os.environ["DPONE_CLICKHOUSE_USER"], os.environ["DPONE_CLICKHOUSE_PASSWORD"])
    cfg = StagingConfig(Endpoint("127.0.0.1", int(http), int(tcp), "{DB}"), admin, Path(work))
    svc = ClickHouseValidatedFileService(build_transport(cfg), "{DB}", journal_factory=file_journals(Path(work), DiesAtInsert),
                                         policy=StagingPolicy(request_seconds=600.0))
    svc.stage(ContractValidatedFileArtifact(Path(path), Path(receipt)), attempt)
    """
)


def test_cleanup_right_after_the_server_died_mid_insert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 15: the stage saw its INSERT fail unknown and returned; a restart proves it gone.

    The request window is 600 s, yet cleanup succeeds on the first restart: the journal
    records when the sending call returned, and the server started after that. An
    attempt whose dispatching process died itself (no such record) stays refused.
    """
    path, receipt, _ = export_hostile(tmp_path)
    work = tmp_path / "work"
    data_dir = tmp_path / "victim"
    first = LocalServer(data_dir)
    info = first.start()
    try:
        act_as_admin(monkeypatch, data_dir, info.http_port)
        chhttp.query(info.http_port, f"CREATE DATABASE {DB} ENGINE = Atomic")

        def child(attempt: str, mode: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [
                    sys.executable,
                    "-c",
                    KILLER,
                    str(info.http_port),
                    str(info.tcp_port),
                    str(work),
                    str(path),
                    str(receipt),
                    attempt,
                    mode,
                    str(info.pid),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )

        died = child("died-1", "die")
        assert died.returncode == -9, died.stderr
        assert exists(info, "dpone_stage_died_h1")
        killed = child("killed-1", "kill")
        assert killed.returncode == 1, killed.stderr
        assert first.wait() == -signal.SIGKILL
    finally:
        first.stop()
    docs = [e.document for e in read_events(work / "killed-1")]
    assert docs[-1]["state"] == "retained_unknown"
    [returned] = [d["returned"] for d in docs if "returned" in d]
    assert returned["query_id"] == "dpone-b02-killed-1-insert"
    insert = next(d for d in docs if (d.get("query") or {}).get("kind") == "insert")
    assert insert["dispatch"]["not_after_ms"] - returned["at_ms"] > 500_000  # 600 s window
    # The server's start is bounded to whole seconds: it starts again a little later
    # than the return (the user's "immediate" restart), far before the 600 s window ends.
    while time.time() * 1000 < returned["at_ms"] + 2500:
        time.sleep(0.1)
    with LocalServer(data_dir) as second:
        info = second.info
        act_as_admin(monkeypatch, data_dir, info.http_port)
        assert exists(info, "dpone_stage_killed_h1")
        done = dpone("attempts", "cleanup", "killed-1", "--work-dir", str(work), *server_args(info))
        assert done.returncode == 0, done.stdout + done.stderr
        assert as_json(done)["state"] == "failed_cleaned"
        assert not exists(info, "dpone_stage_killed_h1")
        docs = [e.document for e in read_events(work / "killed-1")]
        [proof] = [
            d["remote"]
            for d in docs
            if d["outcome"] == "termination_observed"
            and d["remote"]["termination"] == "server_restart"
        ]
        assert (proof["query_id"], proof["window_closed_by"], proof["window_closed_ms"]) == (
            "dpone-b02-killed-1-insert",
            "returned",
            returned["at_ms"],
        )
        # The DROP came after the ownership check, with its own intent.
        assert [(d["state"], d["outcome"]) for d in docs[-3:]] == [
            ("cleanup", "termination_observed"),
            ("cleanup", "drop_intent"),
            ("failed_cleaned", "operator_cleanup"),
        ]
        # Ownership verified: the dropped table is the one the INSERT went to.
        assert docs[-2]["observed_ownership"] == insert["observed_ownership"]
        # The process that died while dispatching left no return record: still refused.
        before = listing(work)
        refused = dpone(
            "attempts", "cleanup", "died-1", "--work-dir", str(work), *server_args(info)
        )
        assert refused.returncode == 1
        assert as_json(refused)["error"]["code"] == "termination_unproven"
        assert exists(info, "dpone_stage_died_h1") and listing(work) == before


def test_finishing_command_repeats_the_server_options() -> None:
    """Item 16: the printed command reaches the server the stage used, the same way."""
    remote = {
        "host": "127.0.0.1",
        "http_port": 18123,
        "tcp_port": 19000,
        "data_dir": Path(".dpone/clickhouse"),
        "transport": "http",
        "client_path": "clickhouse-client",
    }
    assert finishing_command("retained_unknown", "a-1", Path("/w"), DB, remote) == (
        f"dpone attempts cleanup a-1 --work-dir /w --database {DB} "
        "--host 127.0.0.1 --http-port 18123 --tcp-port 19000"
    )
    managed = {
        "host": None,
        "http_port": None,
        "tcp_port": None,
        "data_dir": Path("/my data"),
        "transport": "client",
        "client_path": "/opt/ch client",
    }
    assert finishing_command("staged", "a-1", Path("/w"), DB, managed) == (
        f"dpone attempts discard a-1 --work-dir /w --database {DB} --data-dir '/my data' "
        "--transport client --client-path '/opt/ch client'"
    )
    default = {**managed, "data_dir": Path(".dpone/clickhouse"), "transport": "http"}
    assert finishing_command("cleanup_failed", "a-1", Path("/w"), DB, default) == (
        f"dpone attempts cleanup a-1 --work-dir /w --database {DB}"
    )


def test_sigterm_during_stage_says_what_remains(tmp_path: Path) -> None:
    """Item 16: a stage stopped by SIGTERM still names its journal (and what else remains)."""
    path, receipt, _ = export_hostile(tmp_path)
    work = tmp_path / "work"
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dpone",
                "stage",
                str(path),
                "--receipt",
                str(receipt),
                "--work-dir",
                str(work),
                "--attempt-id",
                "term-1",
                "--database",
                DB,
                "--host",
                "127.0.0.1",
                "--http-port",
                str(port),
                "--tcp-port",
                str(port),
                "--principal",
                "admin",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "DPONE_CLICKHOUSE_USER": "u", "DPONE_CLICKHOUSE_PASSWORD": "p"},
        )
        try:
            silent.settimeout(60)
            conn, _ = silent.accept()  # the stage journaled its start and now waits
            with conn:
                child.send_signal(signal.SIGTERM)
                _, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert child.returncode == 143, err
    assert "[terminated]" in err
    assert "the attempt term-1 ended " in err and f"journal: {work / 'term-1'}" in err
