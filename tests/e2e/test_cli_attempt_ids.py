"""Attempt ids given to ``attempts cleanup|discard`` stay inside ``--work-dir`` (issue 26, item 8).

An id is one path component of the attempt id grammar and names a directory of its
own directly inside the work directory. ``../x``, ``a/b``, an absolute path and a
symbolic link to a journal elsewhere are refused with a coded error before anything
is asked of a server (none is running here) or written to any journal; the library
functions refuse them the same way.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.errors import DponeError
from dpone.ports.clickhouse_request import Credentials, Endpoint, check_attempt_id
from dpone.staging.journal import ClickHouseFileAttemptJournal
from dpone.staging.recovery import cleanup_attempt, discard_attempt
from tests.plugins.cli import ATTEMPTS_DATABASE, as_json, attempts_command, dpone

DB = ATTEMPTS_DATABASE


def journal(work: Path, attempt: str) -> Path:
    """A journal of ``attempt`` in ``work`` that needs an operator (an unsettled INSERT)."""
    now = int(time.time() * 1000)
    events = ClickHouseFileAttemptJournal(work, attempt)
    events.open()
    events.record(
        {
            "state": "loading",
            "outcome": "intent",
            "query": {"kind": "insert", "query_id": f"dpone-b02-{attempt}-insert"},
            "dispatch": {"not_before_ms": now, "not_after_ms": now + 600_000},
            "principal": {"user": "dpone_admin"},
            "planned_ownership": {"database": DB, "table": f"dpone_stage_{attempt}"},
            "cleanup_inventory": {},
        }
    )
    return events.attempt_dir


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A work dir and, for each way out of it, the id that takes it (all name journals)."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    journal(outside, "x")
    journal(work / "a", "b")  # two components, both inside the work dir
    (work / "link-1").symlink_to(outside / "x", target_is_directory=True)
    return work, {
        "../x": "invalid_attempt_id",
        "a/b": "invalid_attempt_id",
        str(outside / "x"): "invalid_attempt_id",
        "link-1": "attempt_outside_work_dir",
    }


# Nothing listens on port 1: an id that got through would fail there instead.
NOWHERE = HttpTransport(Endpoint("127.0.0.1", 1, 1, DB), Credentials("u", "p"))
OPERATIONS: dict[str, Callable[..., Any]] = {"cleanup": cleanup_attempt, "discard": discard_attempt}


def refusal(how: str, verb: str, work: Path, attempt: str) -> dict[str, Any]:
    """The error of ``verb`` on ``attempt`` through the library or the CLI (which must fail)."""
    if how == "library":
        with pytest.raises(DponeError) as caught:
            OPERATIONS[verb](NOWHERE, work, attempt, database=DB)
        assert attempt in caught.value.message
        return caught.value.to_dict()
    # No managed server runs there: a command that looked for one would say no_server.
    done = attempts_command(verb, attempt, work, work.parent / "no-server", "--json")
    assert done.returncode == 2, (attempt, done.stdout, done.stderr)
    text = attempts_command(verb, attempt, work, work.parent / "no-server")
    assert text.returncode == 2 and attempt in text.stderr
    error: dict[str, Any] = as_json(done)["error"]
    assert f"[{error['code']}]" in text.stderr
    return error


@pytest.mark.parametrize("how", ["library", "cli"])
@pytest.mark.parametrize("verb", ["cleanup", "discard"])
def test_ids_that_leave_the_work_dir_are_refused(
    layout: tuple[Path, dict[str, str]], tmp_path: Path, verb: str, how: str
) -> None:
    work, refused = layout
    before = files(tmp_path)
    for attempt, code in refused.items():
        error = refusal(how, verb, work, attempt)
        assert error["code"] == code, (attempt, error)
        assert error["details"]["attempt_id"] == attempt
        if code == "attempt_outside_work_dir":
            assert error["details"]["resolved"] == str((tmp_path / "outside" / "x").resolve())
    assert files(tmp_path) == before  # no journal anywhere changed


def test_a_renamed_attempt_directory_is_refused(tmp_path: Path) -> None:
    """A directory whose journal names another attempt: appending would break the journal."""
    work = tmp_path / "work"
    shutil.move(journal(work, "orig-1"), work / "renamed-1")
    before = files(work)
    with pytest.raises(DponeError) as caught:
        cleanup_attempt(NOWHERE, work, "renamed-1", database=DB)
    assert caught.value.code == "attempt_id_mismatch"
    assert caught.value.details["journal_attempt_id"] == "orig-1"
    assert files(work) == before


@pytest.mark.parametrize("attempt", ["a1\n", "a1\r\n", "\na1", "a1 "])
def test_an_attempt_id_with_a_line_feed_is_refused_everywhere(tmp_path: Path, attempt: str) -> None:
    """Before: a trailing line feed passed the grammar (``re.match`` with ``$``) and, over
    the client transport, staged a table whose name ends in one (issue 37, item 13)."""
    with pytest.raises(DponeError) as caught:
        check_attempt_id(attempt)
    assert caught.value.code == "invalid_attempt_id"
    assert check_attempt_id("a1") == "a1"
    (tmp_path / "f.tsv").write_bytes(b"")
    (tmp_path / "none.json").write_bytes(b"{}")
    done = dpone(
        *("stage", str(tmp_path / "f.tsv"), "--receipt", str(tmp_path / "none.json")),
        *("--database", DB, "--work-dir", str(tmp_path / "work")),
        *("--attempt-id", attempt, "--json"),
    )
    assert as_json(done)["error"]["code"] == "invalid_attempt_id", done.stdout
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").rglob("*"))
