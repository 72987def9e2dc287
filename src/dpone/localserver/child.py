"""Entry point of the server process: ``python -m dpone.localserver.child``.

Runs in a process of its own because the embedded engine allows one server per process
and nothing else of chdb beside it. The engine's own batch, as the passwordless
``default``, only opens the listeners, writes their ports to the listen file and blocks
in a sleep named with a random tag; everything else is done over HTTP by a control
thread as the administrator: restoring the saved query log and writing the ports file
(the parent's readiness signal) at start, and at a line in the control FIFO flushing
and saving the query log and killing the blocking statement, after which the process
exits. Exit codes tell the parent what went wrong before readiness. See
docs/local-server.md ("How the server runs", "The query log across restarts").
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import importlib
import importlib.metadata
import os
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dpone.errors import DponeError, TransportError
from dpone.localserver.control import run_admin_sql
from dpone.localserver.credentials import admin_credentials
from dpone.localserver.layout import DataDirLayout, write_private_file
from dpone.localserver.protocol import (
    EXIT_LOCKED,
    EXIT_NO_CHDB,
    EXIT_NO_CREDENTIALS,
    EXIT_OK,
    EXIT_PARENT_GONE,
    EXIT_QUERY_FAILED,
    request_stop,
)
from dpone.ports.clickhouse_request import Credentials
from dpone.sql import quote_literal

# After the parent is gone, how long a clean stop may take before a hard exit.
ORPHAN_GRACE_SECONDS = 3.0
PARENT_POLL_SECONDS = 0.2
POLL_SECONDS = 0.05

# Days of query log carried across a restart.
QUERY_LOG_KEEP_DAYS = 30
# The blocking statement sleeps this long per row, one row per block: a KILL ends
# it within that time. Below the engine's 3 s cap per block (function_sleep_max_
# microseconds_per_block), so no setting is needed; the rows last for millennia.
WAIT_SECONDS_PER_ROW = 0.25
WAIT_ROWS = 10**12
# How long the blocking statement may take to appear in system.processes.
WAIT_QUERY_APPEARS_SECONDS = 10.0


def _take_lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            print(f"dpone-child: lock {path} is held by another server", file=sys.stderr)
            sys.exit(EXIT_LOCKED)
        raise
    # The pid finds this server again when state.json is missing or corrupt.
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode("ascii"))
    return fd  # held until the process exits


def _engine_version() -> str:
    # A saved query log is restored only into the engine that wrote it: another
    # version may have another query_log structure, and a failed restore would
    # keep the server from starting.
    for package in ("chdb-core", "chdb"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(package)
    return "unknown"


def _say(message: str) -> None:
    print(f"dpone-child: {message}", file=sys.stderr, flush=True)


class _Control:
    """The administrator's side of the server's life, run from a thread."""

    def __init__(self, layout: DataDirLayout, admin: Credentials, saved_log: Path) -> None:
        self.layout = layout
        self.admin = admin
        self.saved_log = saved_log
        # Known only to this process; `default` cannot read system.processes anyway.
        self.wait_tag = f"dpone_engine_wait_{secrets.token_hex(8)}"
        self.http_port = 0
        self.engine_done = threading.Event()
        self.stop_requested = threading.Event()
        self.log_saved = False

    def batch(self) -> str:
        """The engine session's statements: each one allowed by ``SYSTEM LISTEN`` alone."""
        return "; ".join(
            [
                "SYSTEM START LISTEN HTTP",
                "SYSTEM START LISTEN TCP",
                "SELECT getServerPort('http_port'), getServerPort('tcp_port'), version() "
                f"INTO OUTFILE {quote_literal(str(self.layout.listen_file))} "
                "TRUNCATE FORMAT TabSeparated",
                f"SELECT count() AS {self.wait_tag} FROM numbers({WAIT_ROWS}) "
                f"WHERE sleepEachRow({WAIT_SECONDS_PER_ROW}) = 0 SETTINGS max_block_size = 1",
            ]
        )

    def run(self, fifo_fd: int) -> None:
        """Make the server ready, then serve one stop request."""
        try:
            listening = self._wait_listening()
            if listening is None:
                return  # the batch ended before listening; main reports it
            self.http_port = int(listening[0])
            self._restore_query_log()
            write_private_file(self.layout.ports_file, "\t".join(listening) + "\n")
        except (DponeError, OSError, ValueError) as exc:
            _say(f"start failed: {exc}")
            self._end_batch()
            return
        while b"\n" not in os.read(fifo_fd, 64):
            pass
        self.stop()

    def stop(self) -> None:
        """Save the query log, then end the engine's batch: a clean stop."""
        try:
            self._sql("SYSTEM FLUSH LOGS")
            partial = self.saved_log.with_name(self.saved_log.name + ".partial")
            self._sql(
                f"INSERT INTO FUNCTION file({quote_literal(str(partial))}, 'Native') "
                "SELECT * FROM system.query_log "
                f"WHERE event_date >= today() - {QUERY_LOG_KEEP_DAYS} "
                "SETTINGS engine_file_truncate_on_insert = 1"
            )
            os.replace(partial, self.saved_log)
            self.log_saved = True
        except (DponeError, OSError) as exc:
            _say(f"the query log was not saved: {exc}")
        self.stop_requested.set()
        self._end_batch()

    def _sql(self, sql: str) -> str:
        return run_admin_sql(self.http_port, sql, credentials=self.admin)

    def _wait_listening(self) -> list[str] | None:
        """The listen file's fields (HTTP port, TCP port, version) once complete."""
        while not self.engine_done.wait(POLL_SECONDS):
            try:
                text = self.layout.listen_file.read_text(encoding="utf-8")
            except FileNotFoundError:
                continue
            fields = text.rstrip("\n").split("\t")
            if text.endswith("\n") and len(fields) == 3 and fields[0].isdigit():
                return fields
        return None

    def _restore_query_log(self) -> None:
        # Creates system.query_log now, so that the restore finds it.
        self._sql("SYSTEM FLUSH LOGS")
        if self.saved_log.is_file() and self.saved_log.stat().st_size > 0:
            try:
                self._sql(
                    "INSERT INTO system.query_log SELECT * FROM "
                    f"file({quote_literal(str(self.saved_log))}, 'Native')"
                )
            except TransportError as exc:
                raise TransportError(
                    f"cannot restore the saved query log {self.saved_log} "
                    f"(delete it to start without the old log): {exc.message}",
                    code="query_log_restore_failed",
                    path=str(self.saved_log),
                ) from exc

    def _end_batch(self) -> None:
        """KILL the blocking statement by its query id; without it, exit hard."""
        try:
            query_id = self._wait_query_id()
            self._sql(f"KILL QUERY WHERE query_id = {quote_literal(query_id)} ASYNC")
        except (DponeError, OSError) as exc:
            # Nothing else ends the engine's batch (a `default` may have closed the
            # HTTP listener): exit as a signal would.
            _say(f"cannot end the engine's batch, exiting hard: {exc}")
            os._exit(EXIT_QUERY_FAILED)

    def _wait_query_id(self) -> str:
        sql = (
            "SELECT query_id FROM system.processes WHERE is_initial_query AND "
            f"startsWith(query, {quote_literal(f'SELECT count() AS {self.wait_tag} ')}) "
            "FORMAT TabSeparated"
        )
        deadline = time.monotonic() + WAIT_QUERY_APPEARS_SECONDS
        while True:
            found = self._sql(sql).split()
            if len(found) == 1:
                return found[0]
            if time.monotonic() >= deadline:
                raise TransportError(
                    f"the engine's waiting statement is not running ({len(found)} found)",
                    code="engine_wait_not_found",
                )
            time.sleep(POLL_SECONDS)


def _watch_parent(parent_pid: int, fifo: str) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_SECONDS)
    _say("parent process is gone, stopping")
    deadline = time.monotonic() + ORPHAN_GRACE_SECONDS
    with contextlib.suppress(OSError):
        request_stop(fifo)
    time.sleep(max(0.0, deadline - time.monotonic()))
    os._exit(EXIT_PARENT_GONE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dpone.localserver.child")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--watch-parent", type=int, default=0)
    args = parser.parse_args(argv)
    layout = DataDirLayout.at(args.data_dir)

    _take_lock(layout.lock_file)
    try:
        admin = admin_credentials(layout.root)
    except DponeError as exc:
        _say(f"no administrator credentials: {exc}")
        return EXIT_NO_CREDENTIALS
    layout.listen_file.unlink(missing_ok=True)
    # Read and write: the open never blocks, and reads wait for a line, never for EOF.
    fifo_fd = os.open(layout.control_fifo, os.O_RDWR)
    control = _Control(layout, admin, layout.log_dir / f"query_log.{_engine_version()}.native")
    threading.Thread(target=control.run, args=(fifo_fd,), daemon=True).start()
    if args.watch_parent:
        threading.Thread(
            target=_watch_parent, args=(args.watch_parent, str(layout.control_fifo)), daemon=True
        ).start()
    # The engine reads config.xml from the working directory, already at import.
    os.chdir(layout.run_dir)
    try:
        # Only the module-level query of _chdb runs the program that can listen.
        engine: Any = importlib.import_module("chdb._chdb")
    except ImportError as exc:
        _say(f"cannot import chdb: {exc}")
        return EXIT_NO_CHDB

    # Standard input must not be a file: the engine would load it into a table.
    result = engine.query(control.batch(), "TabSeparated", path=str(layout.store_dir))
    control.engine_done.set()
    if result.has_error():
        _say(f"server failed: {result.error_message()}")
    # The engine prints a statement's error (the KILL's "Query was cancelled"
    # included) without has_error(): only our own stop request tells a stop apart.
    if not control.stop_requested.is_set():
        _say("the engine's batch ended without a stop request")
        return EXIT_QUERY_FAILED
    return EXIT_OK if control.log_saved else EXIT_QUERY_FAILED


if __name__ == "__main__":
    sys.exit(main())
