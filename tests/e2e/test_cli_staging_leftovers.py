"""Staging leftovers of killed and interrupted commands, each with its command (issue 24, 11).

Real processes stopped by real signals at the point that matters (a stopped process
is frozen there with SIGSTOP first, so the point is exact, then sent its signal):

- ``dpone stage`` and ``dpone refresh`` killed (SIGKILL) after creating the attempt
  directory and before its first journal event: ``attempts list`` and ``dpone status``
  name ``attempts archive``, cleanup refuses naming it, the archive closes the lease
  the stage took and moves the directory aside, and the next stage or refresh works;
  the archive of an attempt whose process still runs is refused;
- ``dpone validate`` killed while writing its receipt: the next validate of the same
  output removes the stale temporary file and says so; one a live validate holds is
  kept; SIGINT and SIGTERM leave none;
- ``dpone stage --json`` stopped by SIGINT or SIGTERM: the JSON object says what it
  left (attempt, journal, lease) and the next command; after a second signal that
  cuts the lease's closure, that command is the lease's ``close-lease``.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dpone.project.leases import close_lease_command, judge_leases
from dpone.publication.store import SqliteSnapshotStore
from dpone.staging.journal import read_events
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import (
    DATABASE,
    SERVER_KINDS,
    converting,
    make_source,
    project,
    protected_server,
    rows_of,
    server_options,
    stage_argv,
)

SLOW = {"DPONE_NATIVE": "0"}  # the Python reference: phases last seconds, not milliseconds


@pytest.fixture(scope="module", params=SERVER_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "leftovers-ch", request.param)


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("leftovers-export")
    make_source(root / "shop.db", rows_of(150_000))
    out, receipt = root / "items.tsv", root / "items.receipt.json"
    done = dpone(
        "export",
        "--source",
        f"sqlite:{root / 'shop.db'}",
        "--table",
        "items",
        "--out",
        str(out),
        "--receipt-out",
        str(receipt),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out, receipt


def _spawn(argv: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"} | (extra_env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "dpone", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _stop_when(process: subprocess.Popen[str], ready: Callable[[], bool]) -> None:
    """Freeze ``process`` (SIGSTOP) as soon as ``ready()`` holds (polled every millisecond)."""
    deadline = time.monotonic() + 120
    while not ready() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert process.poll() is None, "the command ended before the point to stop it"
    process.send_signal(signal.SIGSTOP)


def _kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.communicate()


def _eventless(attempt: Path) -> bool:
    events = attempt / "events"
    return events.is_dir() and not any(events.iterdir())


def _run(command: str, *more: str) -> subprocess.CompletedProcess[str]:
    """Run a command exactly as dpone printed it."""
    argv = shlex.split(command)
    assert argv[0] == "dpone", command
    return dpone(*argv[1:], *more)


# ---------------------------------------------------------------- killed before event 1


def _stage_killed_before_its_first_event(
    tmp_path: Path, server: dict[str, Any], export: tuple[Path, Path]
) -> tuple[Path, Path, str]:
    """A pool stage SIGKILLed with its attempt directory made and no event: (work, store, id).

    The window is a few milliseconds (the preflight reads); a try that missed it is
    left in its own work directory and store, and another one is made.
    """
    for n in range(5):
        work, store, attempt = tmp_path / f"work-{n}", tmp_path / f"store-{n}.sqlite", f"early-{n}"
        process = _spawn(stage_argv(export, server, work, store, attempt))
        try:
            directory = work / attempt
            _stop_when(process, lambda: _eventless(directory))  # noqa: B023 (called here)
            if not _eventless(directory):
                continue  # its first event came before the stop
            # While its process lives (stopped, not dead), the attempt is never archived.
            argv = ["attempts", "archive", attempt, "--work-dir", str(work), "--store", str(store)]
            running = dpone(*argv, *server_options(server, tmp_path), "--json")
            assert running.returncode == 1, running.stdout + running.stderr
            error = as_json(running)["error"]
            assert error["code"] == "attempt_running", error
            assert error["details"]["pids"] == [process.pid]
            assert _eventless(work / attempt)
            return work, store, attempt
        finally:
            _kill(process)
    raise AssertionError("no try stopped the stage before its first journal event")


def test_stage_killed_before_its_first_event_is_archived_by_the_command_list_names(
    tmp_path: Path, server: dict[str, Any], export: tuple[Path, Path]
) -> None:
    work, store, attempt = _stage_killed_before_its_first_event(tmp_path, server, export)
    reach = server_options(server, tmp_path)
    archive = shlex.join(
        [
            *("dpone", "attempts", "archive", attempt, "--work-dir", str(work)),
            *reach,
            *("--store", str(store)),
        ]
    )
    # The lease the stage took before its journal existed is still active, its holder gone.
    (verdict,) = judge_leases(SqliteSnapshotStore(store, create=False), [work])
    assert (verdict.holder, verdict.reason) == ("gone", "process_gone")
    lease_id = verdict.lease_id

    options = ["--work-dir", str(work), "--store", str(store), *reach]
    listed = as_json(dpone("attempts", "list", *options, "--json"))
    (entry,) = listed["attempts"]
    assert (entry["attempt_id"], entry["state"], entry["needs_operator"]) == (
        attempt,
        "no_events",
        True,
    )
    assert entry["next_command"] == archive
    text = dpone("attempts", "list", *options)
    assert text.returncode == 0, text.stderr
    assert f"archive it with: {archive}" in text.stdout

    # Cleanup refuses an eventless journal (nothing to prove) and names the archive.
    refused = dpone("attempts", "cleanup", attempt, *options, "--database", DATABASE, "--json")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    error = as_json(refused)["error"]
    assert error["code"] == "journal_empty" and error["details"]["next_command"] == archive
    assert archive in error["message"]

    done = _run(archive, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    result = as_json(done)
    moved = work / ".archived" / attempt
    assert result == {
        "ok": True,
        "attempt_id": attempt,
        "state": "archived",
        "archived_to": str(moved),
        "leases_closed": [lease_id],
        "store": str(store),
    }
    # Moved aside whole, never deleted, with a note of what was done.
    assert not (work / attempt).exists() and (moved / "events").is_dir()
    note = json.loads((moved / "archived.json").read_bytes())
    assert (note["reason"], note["from"], note["leases_closed"]) == (
        "journal_empty",
        str(work / attempt),
        [lease_id],
    )
    opened = SqliteSnapshotStore(store, create=False)
    lease = opened.get_lease(lease_id)
    assert not lease.active and opened.closure_proven(lease)
    assert as_json(dpone("attempts", "list", *options, "--json"))["attempts"] == []
    leases = dpone("snapshot", "leases", "--store", str(store), "--work-dir", str(work))
    assert leases.returncode == 0, leases.stdout
    again = _run(archive, "--json")
    assert as_json(again)["error"]["code"] == "attempt_not_found"

    # The pool has its user back and the attempt id is free: the next stage works.
    staged = dpone(*stage_argv(export, server, work, store, attempt), "--json")
    assert staged.returncode == 0, staged.stdout + staged.stderr
    assert as_json(staged)["rows"] == 150_000
    # An attempt with events is never archived: its journal is the record.
    kept = dpone("attempts", "archive", attempt, *options, "--json")
    assert kept.returncode == 1 and as_json(kept)["error"]["code"] == "journal_not_empty"
    assert as_json(kept)["error"]["details"]["next_command"].startswith(
        f"dpone attempts discard {attempt} "
    )


def test_refresh_killed_before_its_first_event_status_names_archive_then_refresh_publishes(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    for n in range(5):
        root = tmp_path / f"try-{n}"
        root.mkdir()
        make_source(root / "shop.db", rows_of(150_000))
        config = project(root, server, f"t_early_{n}")
        attempts = root / "work" / "attempts"

        def eventless() -> bool:
            found = attempts  # noqa: B023 (called in this iteration only)
            return found.is_dir() and any(_eventless(a) for a in found.iterdir())

        process = _spawn(["refresh", "--config", str(config), "items"])
        try:
            _stop_when(process, eventless)
            hit = eventless()
        finally:
            _kill(process)
        if hit:
            break
    else:
        raise AssertionError("no try stopped the refresh before its first journal event")
    (attempt,) = [a for a in attempts.iterdir() if _eventless(a)]

    status = dpone("status", "--config", str(config), "--json")
    assert status.returncode == 1, status.stdout
    payload = as_json(status)
    # One item: the attempt, whose archive also closes the lease (listed as gone).
    (item,) = payload["needs_person"]
    store = root / "store.sqlite"
    assert (item["kind"], item["attempt_id"]) == ("no_events", attempt.name)
    assert shlex.split(item["command"]) == [
        "dpone",
        "attempts",
        "archive",
        attempt.name,
        "--work-dir",
        str(attempts),
        # The project's remote server is named by its project file.
        *(
            ["--config", str(config)]
            if server["kind"] == "remote"
            else server_options(server, root)
        ),
        "--store",
        str(store),
    ]
    (active,) = payload["active_leases"]
    assert (active["attempt_id"], active["holder"]) == (attempt.name, "gone")

    done = _run(item["command"], "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert as_json(done)["leases_closed"] == [active["lease_id"]]
    after = dpone("status", "--config", str(config), "--json")
    assert after.returncode == 0, after.stdout
    assert as_json(after)["needs_person"] == [] and as_json(after)["active_leases"] == []
    published = dpone("refresh", "--config", str(config), "items", "--json")
    assert published.returncode == 0, published.stdout + published.stderr
    (report,) = as_json(published)["tables"]
    assert (report["outcome"], report["rows"]) == ("published", 150_000)


# ---------------------------------------------------------------- validate's partial


def _partials(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(".partial"))


def test_a_killed_validates_partial_is_removed_by_the_next_one_a_live_ones_is_kept(
    tmp_path: Path, export: tuple[Path, Path]
) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(json.loads(export[1].read_bytes())["schema"]))
    out = tmp_path / "out" / "items.receipt.json"
    out.parent.mkdir()
    argv = ["validate", str(export[0]), "--schema", str(schema), "--receipt-out", str(out)]

    killed = _spawn(argv, SLOW)
    _stop_when(killed, lambda: bool(_partials(out.parent)))
    _kill(killed)
    (stale,) = _partials(out.parent)
    assert stale.name.startswith(f".{out.name}.")

    done = dpone(*argv, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    result = as_json(done)
    assert result["rows"] == 150_000 and result["receipt"] == str(out)
    (warning,) = result["warnings"]
    assert warning.startswith(f"removed {stale}: the temporary file of an earlier write")
    assert _partials(out.parent) == [] and sorted(out.parent.iterdir()) == [out]
    assert dpone("verify", str(export[0]), "--receipt", str(out)).returncode == 0

    # A partial that a running validate holds is its own: never removed.
    live = _spawn([*argv, "--force"], SLOW)
    try:
        _stop_when(live, lambda: bool(_partials(out.parent)))
        (held,) = _partials(out.parent)
        beside = dpone(*argv, "--force", "--json")
        assert beside.returncode == 0, beside.stdout + beside.stderr
        assert as_json(beside)["warnings"] == []
        assert _partials(out.parent) == [held]
    finally:
        _kill(live)
    # Its writer killed, it is stale: the text run says so on stderr.
    text = dpone(*argv, "--force")
    assert text.returncode == 0, text.stderr
    assert f"dpone: warning: removed {held}:" in text.stderr
    assert _partials(out.parent) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_validate_leaves_no_partial(
    tmp_path: Path, export: tuple[Path, Path], signum: int
) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(json.loads(export[1].read_bytes())["schema"]))
    out = tmp_path / "items.receipt.json"
    argv = ["validate", str(export[0]), "--schema", str(schema), "--receipt-out", str(out)]
    process = _spawn([*argv, "--json"], SLOW)
    _stop_when(process, lambda: bool(_partials(tmp_path)))
    process.send_signal(signum)
    process.send_signal(signal.SIGCONT)
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, stdout
    code = "interrupted" if signum == signal.SIGINT else "terminated"
    assert json.loads(stdout)["error"]["code"] == code
    assert _partials(tmp_path) == [] and not out.exists()


# ---------------------------------------------------------------- stage stopped by a signal


def _interrupted_stage(
    export: tuple[Path, Path],
    server: dict[str, Any],
    work: Path,
    store: Path,
    attempt: str,
    signum: int,
    *,
    as_json_flag: bool = True,
    second: int | None = None,
) -> subprocess.Popen[str]:
    """A pool stage sent ``signum`` while it converts its rows (nothing sent yet); with
    ``second``, that signal too, while its lease's closure proves the lease quiescent."""
    argv = stage_argv(export, server, work, store, attempt) + (["--json"] if as_json_flag else [])
    process = _spawn(argv, SLOW)
    _stop_when(process, lambda: converting(work / attempt))
    process.send_signal(signum)
    process.send_signal(signal.SIGCONT)
    if second is not None:
        opened = SqliteSnapshotStore(store, create=False)

        def closing() -> bool:  # the closure ended the lease and is proving it quiescent
            (lease,) = opened.leases_of(attempt)
            return not lease.active and not opened.closure_proven(lease)

        _stop_when(process, closing)
        process.send_signal(second)
        process.send_signal(signal.SIGCONT)
    process.wait(timeout=120)
    return process


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stage_stopped_by_a_signal_says_what_it_left_in_json(
    tmp_path: Path, server: dict[str, Any], export: tuple[Path, Path], signum: int
) -> None:
    work, store, attempt = tmp_path / "work", tmp_path / "store.sqlite", f"sig{int(signum)}-1"
    process = _interrupted_stage(export, server, work, store, attempt, signum)
    stdout, stderr = process.communicate()
    assert process.returncode == 128 + signum, stdout + stderr
    error = json.loads(stdout)["error"]
    assert error["code"] == ("interrupted" if signum == signal.SIGINT else "terminated")
    details = error["details"]
    (lease,) = details["leases"]
    # Closed on the way out, as refresh does: proven quiescent, the pool has the user.
    assert lease["state"] == "closed" and lease["command"] is None
    assert {k: details[k] for k in ("attempt_id", "journal", "state", "next_command")} == {
        "attempt_id": attempt,
        "journal": str(work / attempt),
        "state": "failed_cleaned",
        "next_command": None,
    }
    assert details["left_behind"] == {
        "journal": str(work / attempt),
        "lease": f"{lease['lease_id']} ({lease['user']}), closed (its closure proven)",
    }
    opened = SqliteSnapshotStore(store, create=False)
    record = opened.get_lease(lease["lease_id"])
    assert not record.active and opened.closure_proven(record)
    # Its journal is a record with events: not archived.
    kept = dpone("attempts", "archive", attempt, "--work-dir", str(work), "--json")
    assert kept.returncode == 1 and as_json(kept)["error"]["code"] == "journal_not_empty"
    assert as_json(kept)["error"]["details"]["next_command"] is None
    staged = dpone(*stage_argv(export, server, work, store, f"sig{int(signum)}-2"), "--json")
    assert staged.returncode == 0, staged.stdout + staged.stderr


def test_a_stage_stopped_by_a_signal_says_what_it_left_in_text(
    tmp_path: Path, server: dict[str, Any], export: tuple[Path, Path]
) -> None:
    work, store, attempt = tmp_path / "work", tmp_path / "store.sqlite", "sig-text"
    process = _interrupted_stage(
        export, server, work, store, attempt, signal.SIGINT, as_json_flag=False
    )
    _, stderr = process.communicate()
    assert process.returncode == 130, stderr
    lines = stderr.splitlines()
    start = lines.index(f"the attempt {attempt} ended failed_cleaned; it left behind:")
    assert lines[start + 1] == f"  journal: {work / attempt}"
    assert lines[start + 2].startswith("  lease: ") and lines[start + 2].endswith(
        ", closed (its closure proven)"
    )
    assert lines[start + 3 :] == ["nothing to finish", "dpone: error: [interrupted] interrupted"]


def test_a_second_signal_in_the_lease_closure_names_close_lease_which_resolves_it(
    tmp_path: Path, server: dict[str, Any], export: tuple[Path, Path]
) -> None:
    work, store, attempt = tmp_path / "work", tmp_path / "store.sqlite", "twice-1"
    process = _interrupted_stage(
        export, server, work, store, attempt, signal.SIGTERM, second=signal.SIGINT
    )
    stdout, stderr = process.communicate()
    assert process.returncode == 143, stdout + stderr
    details = json.loads(stdout)["error"]["details"]
    (lease,) = details["leases"]
    command = close_lease_command(lease["lease_id"], store, server_options(server, tmp_path))
    assert (lease["state"], lease["command"], details["next_command"]) == (
        "closure_unproven",
        command,
        command,
    )
    assert details["left_behind"]["lease"].endswith(", ended, its closure not proven")
    opened = SqliteSnapshotStore(store, create=False)
    assert not opened.get_lease(lease["lease_id"]).active
    assert not opened.closure_proven(opened.get_lease(lease["lease_id"]))
    done = _run(command, "--json")
    assert done.returncode == 0 and as_json(done)["proven"] is True, done.stdout + done.stderr
    assert opened.closure_proven(opened.get_lease(lease["lease_id"]))
    staged = dpone(*stage_argv(export, server, work, store, "twice-2"), "--json")
    assert staged.returncode == 0, staged.stdout + staged.stderr


def _small_files() -> None:
    """In the child: files may grow to 1 MiB only; a write past it fails with EFBIG
    (SIGXFSZ ignored) instead of killing the process. The export's 150,000 rows make a
    spool of several MiB; the journal, the store and the lease notes stay far below."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))


def test_a_spool_write_that_fails_is_a_coded_error_with_the_attempts_journal(
    tmp_path: Path, server: dict[str, Any], export: tuple[Path, Path]
) -> None:
    """Before: the raw OSError reached the caller and the CLI printed a bare os_error with
    no attempt, journal or next command (issue 37, item 12)."""
    work, store, attempt = tmp_path / "work", tmp_path / "store.sqlite", "fsize-1"
    argv = [sys.executable, "-m", "dpone", *stage_argv(export, server, work, store, attempt)]
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"}
    done = subprocess.run(
        [*argv, "--json"],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=_small_files,
        timeout=180,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "local_io_failed", error
    assert attempt in error["message"] and "File too large" in error["message"], error
    details = error["details"]
    assert (details["attempt_id"], details["journal"]) == (attempt, str(work / attempt))
    assert details["state"] == "failed_cleaned" and details["next_command"] is None, details
    events = [e.document for e in read_events(work / attempt)]
    assert (events[-1]["state"], events[-1]["error_code"]) == ("failed_cleaned", "local_io_failed")
    assert not (work / attempt / "spool").exists() or not any((work / attempt / "spool").iterdir())
