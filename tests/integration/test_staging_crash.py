"""SIGKILL the staging process at every boundary; the journal stays true to the server.

The stage runs in a child process whose journal kills the process right after event N
is durable (between an event and the next step, including between an intent and its
dispatch). Afterwards: the journal verifies, ``attempts list`` reports the attempt,
and ``attempts cleanup`` either finishes with proof or refuses; nothing is dropped
that was not owned.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpone.localserver import ServerInfo
from dpone.ports.clickhouse_request import Credentials
from dpone.staging.journal import read_events
from dpone.staging.recovery import list_attempts
from tests import chhttp
from tests.plugins.cli import dpone
from tests.plugins.staging import DB, create_databases, export_hostile

CHILD = textwrap.dedent(
    f"""
    import os, signal, sys
    from pathlib import Path
    from dpone.staging.journal import ClickHouseFileAttemptJournal, file_journals
    from dpone.ports.clickhouse_request import Credentials, Endpoint
    from dpone.staging.composition import StagingConfig
    from dpone.sinks import ClickHouseSink

    http, tcp, work, path, receipt, attempt, crash_after = sys.argv[1:]
    # The administrator, as the CLI gets it from the environment (never argv).
    admin = Credentials(os.environ["DPONE_CLICKHOUSE_USER"], os.environ["DPONE_CLICKHOUSE_PASSWORD"])

    class Crashing(ClickHouseFileAttemptJournal):
        def record(self, fields):
            event = super().record(fields)
            if event.sequence == int(crash_after):
                os.kill(os.getpid(), signal.SIGKILL)
            return event

    cfg = StagingConfig(Endpoint("127.0.0.1", int(http), int(tcp), "{DB}"), admin, Path(work))
    sink = ClickHouseSink(cfg, journal_factory=file_journals(Path(work), Crashing))
    sink.stage_validated_file(path, receipt, attempt_id=attempt)
    """
)


def admin_env(admin: Credentials) -> dict[str, str]:
    """The variables that make a ``--host`` command act as the administrator."""
    return {"DPONE_CLICKHOUSE_USER": admin.user, "DPONE_CLICKHOUSE_PASSWORD": admin.password}


# Events of a successful run: 1 checking, 2 prepared, 3 CREATE intent, 4 INSERT intent,
# 5 verifying, 6 staged.
@pytest.mark.parametrize("crash_after", [1, 2, 3, 4, 5, 6])
def test_crash_after_each_event(
    clickhouse: ServerInfo, admin_credentials: Credentials, tmp_path: Path, crash_after: int
) -> None:
    create_databases(clickhouse.http_port)
    path, receipt, _data = export_hostile(tmp_path)
    work = tmp_path / "work"
    attempt = f"crash-{crash_after}"
    table = f"dpone_stage_crash_h{crash_after}"
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(clickhouse.http_port),
            str(clickhouse.tcp_port),
            str(work),
            str(path),
            str(receipt),
            attempt,
            str(crash_after),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=os.environ | admin_env(admin_credentials),
    )
    assert child.returncode == -9, child.stderr
    events = read_events(work / attempt)  # verifies sequence, chain and canonical bytes
    assert len(events) == crash_after
    last = events[-1].document
    exists = chhttp.query(clickhouse.http_port, f"EXISTS TABLE {DB}.{table}") == "1\n"
    # The journal is true to the server: the table exists only after the CREATE intent.
    if crash_after < 3:
        assert not exists
    elif crash_after == 3:
        assert not exists  # killed between the CREATE intent and its dispatch
    else:
        assert exists
    listed = {a.attempt_id: a for a in list_attempts(work)}
    assert listed[attempt].needs_operator is (last["state"] != "staged")

    verified = dpone("journal", "verify", str(work / attempt), "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["events"] == crash_after
    if last["state"] == "staged":
        return
    listing = dpone("attempts", "list", "--work-dir", str(work), "--json")
    assert [a["attempt_id"] for a in json.loads(listing.stdout)["attempts"]] == [attempt]
    cleaned = dpone(
        "attempts",
        "cleanup",
        attempt,
        "--work-dir",
        str(work),
        "--database",
        DB,
        "--host",
        "127.0.0.1",
        "--http-port",
        str(clickhouse.http_port),
        "--tcp-port",
        str(clickhouse.tcp_port),
        "--json",
        extra_env=admin_env(admin_credentials),
    )
    if crash_after in (3, 4):
        # The intent is durable but its query was never dispatched: the query log has no
        # terminal event for it, so its state is unproven and cleanup must refuse.
        assert cleaned.returncode == 1, cleaned.stdout
        assert json.loads(cleaned.stdout)["error"]["code"] == "termination_unproven"
        return
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert json.loads(cleaned.stdout)["state"] == "failed_cleaned"
    assert chhttp.query(clickhouse.http_port, f"EXISTS TABLE {DB}.{table}") == "0\n"
    assert read_events(work / attempt)[-1].document["state"] == "failed_cleaned"
    assert not (work / attempt / "spool").exists()


def test_cleanup_refuses_a_table_that_is_not_owned(
    clickhouse: ServerInfo, admin_credentials: Credentials, tmp_path: Path
) -> None:
    create_databases(clickhouse.http_port)
    path, receipt, _ = export_hostile(tmp_path)
    work = tmp_path / "work"
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(clickhouse.http_port),
            str(clickhouse.tcp_port),
            str(work),
            str(path),
            str(receipt),
            "swap-1",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=os.environ | admin_env(admin_credentials),
    )
    assert child.returncode == -9
    # Someone replaces the staging table with their own under the same name.
    chhttp.query(clickhouse.http_port, f"DROP TABLE {DB}.dpone_stage_swap_h1")
    chhttp.query(
        clickhouse.http_port,
        f"CREATE TABLE {DB}.dpone_stage_swap_h1 (id Int64 COMMENT 'theirs') ENGINE = Memory",
    )
    cleaned = dpone(
        "attempts",
        "cleanup",
        "swap-1",
        "--work-dir",
        str(work),
        "--database",
        DB,
        "--host",
        "127.0.0.1",
        "--http-port",
        str(clickhouse.http_port),
        "--tcp-port",
        str(clickhouse.tcp_port),
        "--json",
        extra_env=admin_env(admin_credentials),
    )
    assert cleaned.returncode == 1
    assert json.loads(cleaned.stdout)["error"]["code"] == "ownership_unverified"
    assert chhttp.query(clickhouse.http_port, f"EXISTS TABLE {DB}.dpone_stage_swap_h1") == "1\n"
