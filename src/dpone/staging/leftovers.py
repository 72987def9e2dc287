"""What an attempt left behind, the command that finishes it, and archiving an empty one.

:func:`finishing_command` names ``attempts cleanup``, ``attempts discard`` or, for a
journal without any event, ``attempts archive``, and :func:`attempt_directory` resolves
an attempt id to one directory directly inside the work directory. An attempt with no
event sent nothing (every mutation follows its durable intent), so
:func:`archive_attempt` moves its directory aside, whole, into ``<work_dir>/.archived/``
once no process has it open; nothing is deleted. See docs/operations.md (``no_events``).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dpone.contracts import canonical_json
from dpone.durable_files import atomic_write_bytes, fsync_directory
from dpone.errors import ConfigurationError, StateError
from dpone.localserver.layout import DEFAULT_DATA_DIR
from dpone.ports.clickhouse_request import check_attempt_id
from dpone.staging.journal import read_events

# The state ``summarize`` gives a journal without any event.
NO_EVENTS = "no_events"
# Where archived attempt directories go: inside the work directory, under a name the
# attempt id grammar refuses (it cannot start with a dot), so no attempt ever uses it
# and ``survey_attempts`` (which looks for ``<dir>/events``) never lists it.
ARCHIVE_DIR = ".archived"
ARCHIVE_NOTE = "archived.json"
_PROC = Path("/proc")


def attempt_directory(work_dir: Path, attempt_id: str) -> Path:
    """The directory of ``attempt_id`` in ``work_dir``; refuses an id that leaves it.

    The id follows the attempt id grammar (one path component: ``invalid_attempt_id``)
    and names a directory directly inside ``work_dir``, not a symbolic link
    (``attempt_outside_work_dir``): nothing acts on a journal ``work_dir`` does not hold.
    """
    try:
        check_attempt_id(attempt_id)
    except ConfigurationError as exc:
        exc.add_details(attempt_id=attempt_id, work_dir=str(work_dir))
        raise
    path = Path(work_dir) / attempt_id
    resolved = path.resolve()
    if path.is_symlink() or resolved.parent != Path(work_dir).resolve():
        raise ConfigurationError(
            f"attempt {attempt_id}: {path} is a link to {resolved}, not a directory of its own "
            f"in the work directory {work_dir}; nothing done",
            code="attempt_outside_work_dir",
            attempt_id=attempt_id,
            path=str(path),
            resolved=str(resolved),
            work_dir=str(work_dir),
        )
    return path


def left_behind(last: dict[str, Any], journal: Path) -> dict[str, str]:
    """What a failed attempt left, from its last event: table, spool, journal."""
    remains: dict[str, str] = {}
    inventory = last.get("cleanup_inventory") or {}
    table = inventory.get("table")
    if isinstance(table, dict):
        uuid = f" (uuid {table['uuid']})" if table.get("uuid") else ""
        remains["table"] = f"{table.get('database')}.{table.get('table')}{uuid}, may exist"
    if inventory.get("table_not_owned"):
        remains["table not proven ours"] = str(inventory["table_not_owned"])
    if inventory.get("spool"):
        remains["spool"] = str(inventory["spool"])
    remains["journal"] = str(journal)
    return remains


def finishing_command(
    state: str,
    attempt_id: str,
    work_dir: Path,
    database: str,
    server: Mapping[str, object] | None = None,
    *,
    store: Path | str | None = None,
) -> str | None:
    """The command that finishes what an attempt in ``state`` left (None: nothing to do).

    ``server`` holds the server options the stage used (``host``, ``http_port``,
    ``tcp_port``, ``data_dir``, ``project_config``, ``transport``, ``client_path``, as
    the CLI names them):
    those that differ from their defaults are repeated, so the command reaches the
    same server the same way. ``store`` (the publication store holding the attempt's
    lease, when it is not the default one) is repeated as ``--store``.

    A journal without events (``no_events``) is finished by ``attempts archive``,
    which asks no server for anything but the closure of the attempt's lease: only
    ``--work-dir``, ``--data-dir`` (of the managed server) and ``--store`` are given.
    """
    # A discard cut short (``discarding``) is finished by the discard, never by a cleanup.
    verb = {
        "staged": "discard",
        "discarding": "discard",
        "failed_cleaned": None,
        "discarded": None,
        NO_EVENTS: "archive",
    }.get(state, "cleanup")
    if verb is None:
        return None
    argv = ["dpone", "attempts", verb, attempt_id, "--work-dir", str(work_dir)]
    given = server or {}
    if verb == "archive":
        if given.get("host") is None:
            argv += _data_dir_option(given)
    else:
        argv += ["--database", database]
        if given.get("host") is not None:
            argv += ["--host", str(given["host"])]
            for key in ("http_port", "tcp_port"):
                if given.get(key) is not None:
                    argv += [f"--{key.replace('_', '-')}", str(given[key])]
        else:
            argv += _data_dir_option(given)
        if given.get("transport") not in (None, "http"):
            argv += ["--transport", str(given["transport"])]
            if given.get("client_path") not in (None, "clickhouse-client"):
                argv += ["--client-path", str(given["client_path"])]
    if store is not None:
        argv += ["--store", str(store)]
    return shlex.join(argv)


def _data_dir_option(given: Mapping[str, object]) -> list[str]:
    # A project's remote server is named by its project file, which holds its host,
    # ports and credentials file.
    if given.get("project_config") is not None:
        return ["--config", str(given["project_config"])]
    data_dir = given.get("data_dir")
    if data_dir is None or Path(str(data_dir)) == DEFAULT_DATA_DIR:
        return []
    return ["--data-dir", str(data_dir)]


def refuse_empty_journal(attempt_dir: Path, attempt_id: str, command: str) -> None:
    """Refuse (``journal_empty``) an attempt whose journal holds no event, naming
    ``command`` (its ``attempts archive``); return when it has events.

    Cleanup and discard act on what a journal records; a journal without events
    records nothing to act on, because nothing was sent.
    """
    if read_events(attempt_dir):
        return
    raise StateError(
        f"attempt {attempt_id} has no journal event: it sent nothing and created no table "
        f"(its process stopped before its first event); archive it with `{command}`",
        code="journal_empty",
        attempt_id=attempt_id,
        journal=str(attempt_dir),
        next_command=command,
    )


def holders_of(directory: Path) -> list[int]:
    """Pids of the processes that have ``directory`` (or anything in it) open.

    Read from ``/proc/<pid>/fd``. A running stage keeps its attempt directory open
    from the journal's creation to its end, so an empty list proves no stage of this
    attempt still runs on this machine. Processes whose descriptors cannot be read
    belong to other users, who cannot open a 0700 attempt directory of ours. Raises
    :class:`StateError` (``holders_unknown``) without ``/proc``.
    """
    if not (_PROC / "self" / "fd").is_dir():
        raise StateError(
            f"whether a process still uses {directory} cannot be told here (no /proc)",
            code="holders_unknown",
            path=str(directory),
        )
    target = str(directory.resolve())
    inside = target + os.sep
    me = os.getpid()
    found: list[int] = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            descriptors = list((entry / "fd").iterdir())
        except OSError:
            continue  # gone meanwhile, or another user's
        for fd in descriptors:
            try:
                opened = os.readlink(fd)
            except OSError:
                continue
            if opened == target or opened.startswith(inside):
                found.append(int(entry.name))
                break
    return found


def empty_attempt(work_dir: Path, attempt_id: str) -> Path:
    """The directory of ``attempt_id``, checked to be an abandoned attempt without events.

    Refuses, changing nothing: an id outside the work directory (as
    :func:`attempt_directory`), a missing directory (``attempt_not_found``), a journal
    with events (``journal_not_empty``, naming the command that finishes it), a
    directory a process still has open (``attempt_running``, naming the pids).
    """
    path = attempt_directory(work_dir, attempt_id)
    if not (path / "events").is_dir():
        raise StateError(
            f"attempt {attempt_id}: {path} is not an attempt directory (no events directory); "
            "nothing done",
            code="attempt_not_found",
            attempt_id=attempt_id,
            path=str(path),
        )
    events = read_events(path)
    if events:
        state = str(events[-1].document.get("state"))
        planned = events[-1].document.get("planned_ownership") or {}
        command = finishing_command(state, attempt_id, work_dir, str(planned.get("database")))
        raise StateError(
            f"attempt {attempt_id} has {len(events)} journal event(s), last state {state}: "
            "its journal is the record of what it did and is not archived; "
            + (f"finish it with `{command}`" if command else "it needs nothing"),
            code="journal_not_empty",
            attempt_id=attempt_id,
            state=state,
            next_command=command,
        )
    holders = holders_of(path)
    if holders:
        raise StateError(
            f"attempt {attempt_id} is still running: process(es) {', '.join(map(str, holders))} "
            f"have {path} open; let it end (or stop it) and run the command again; nothing done",
            code="attempt_running",
            attempt_id=attempt_id,
            pids=holders,
        )
    return path


def archive_attempt(work_dir: Path, attempt_id: str, facts: Mapping[str, Any]) -> Path:
    """Move the abandoned, eventless attempt ``attempt_id`` aside; its new path.

    Checked by :func:`empty_attempt` first (again, right before the move). The whole
    directory is renamed into ``<work_dir>/.archived/`` (as ``ATTEMPT``, or
    ``ATTEMPT.2`` ... when that name is taken), never deleted, and ``archived.json``
    in it records when, from where and ``facts`` (the caller's: the leases it closed).
    The attempt id is free again afterwards.
    """
    path = empty_attempt(work_dir, attempt_id)
    root = Path(work_dir) / ARCHIVE_DIR
    root.mkdir(mode=0o700, exist_ok=True)
    target, n = root / attempt_id, 1
    while True:
        try:
            # Claimed exclusively: rename() then replaces only this empty directory.
            target.mkdir(mode=0o700)
            break
        except FileExistsError:
            n += 1
            target = root / f"{attempt_id}.{n}"
    os.rename(path, target)
    fsync_directory(root)
    fsync_directory(Path(work_dir))
    note = {
        "archived_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "attempt_id": attempt_id,
        "from": str(path),
        "reason": "journal_empty",
        **facts,
    }
    atomic_write_bytes(target / ARCHIVE_NOTE, canonical_json.dumps(note))
    return target
