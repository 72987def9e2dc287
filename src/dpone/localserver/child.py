"""Entry point of the server process: ``python -m dpone.localserver.child``.

Runs in a process of its own because the embedded engine allows one server per
process and nothing else of chdb beside it. It takes the data-directory lock, then
runs one batch: start both listeners, restore the saved query log, write the chosen
ports, and block reading the control FIFO. A line written to the FIFO ends the wait;
the batch then flushes the server's logs and saves the query log, and the process
exits cleanly.

The query log is saved because this engine keeps its ``system`` database in memory:
at the next start ``system.query_log`` is created anew and the parts on disk are
removed. Recovery needs the log of queries run before a restart (a query found
there has ended), so a clean stop exports it and the next start inserts it back.

Exit codes tell the parent what went wrong before readiness.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import importlib
import importlib.metadata
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dpone.localserver.protocol import (
    EXIT_LOCKED,
    EXIT_NO_CHDB,
    EXIT_OK,
    EXIT_PARENT_GONE,
    EXIT_QUERY_FAILED,
    request_stop,
)
from dpone.sql import quote_literal

# After the parent is gone, how long a clean stop may take before a hard exit.
ORPHAN_GRACE_SECONDS = 3.0
PARENT_POLL_SECONDS = 0.2


# Days of query log carried across a restart.
QUERY_LOG_KEEP_DAYS = 30
# The batch's last answer: everything before it, the query-log save included, ran.
SAVED_MARKER = "dpone-query-log-saved"


def _take_lock(path: str) -> int:
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


def _batch(args: argparse.Namespace, saved_log: Path) -> str:
    partial = saved_log.with_name(saved_log.name + ".partial")
    restore = (
        [
            f"INSERT INTO system.query_log SELECT * FROM file({quote_literal(str(saved_log))}, 'Native')"
        ]
        if saved_log.is_file() and saved_log.stat().st_size > 0
        else []
    )
    return "; ".join(
        [
            "SYSTEM START LISTEN HTTP",
            "SYSTEM START LISTEN TCP",
            # Creates system.query_log now, so the restore and the save find it.
            "SYSTEM FLUSH LOGS",
            *restore,
            "SELECT getServerPort('http_port'), getServerPort('tcp_port'), version() "
            f"INTO OUTFILE {quote_literal(args.ports_file)} TRUNCATE FORMAT TabSeparated",
            # Blocks until a writer sends a line and closes: the clean stop signal.
            f"SELECT count() FROM file({quote_literal(args.fifo)}, 'LineAsString')",
            "SYSTEM FLUSH LOGS",
            f"INSERT INTO FUNCTION file({quote_literal(str(partial))}, 'Native') "
            f"SELECT * FROM system.query_log WHERE event_date >= today() - {QUERY_LOG_KEEP_DAYS} "
            "SETTINGS engine_file_truncate_on_insert = 1",
            f"SELECT {quote_literal(SAVED_MARKER)}",
        ]
    )


def _watch_parent(parent_pid: int, fifo: str) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_SECONDS)
    print("dpone-child: parent process is gone, stopping", file=sys.stderr, flush=True)
    deadline = time.monotonic() + ORPHAN_GRACE_SECONDS
    while time.monotonic() < deadline:
        try:
            if request_stop(fifo):
                break
        except OSError:
            break
        time.sleep(PARENT_POLL_SECONDS)
    time.sleep(max(0.0, deadline - time.monotonic()))
    os._exit(EXIT_PARENT_GONE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dpone.localserver.child")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--store-dir", required=True)
    parser.add_argument("--lock-file", required=True)
    parser.add_argument("--fifo", required=True)
    parser.add_argument("--ports-file", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--watch-parent", type=int, default=0)
    args = parser.parse_args(argv)

    _take_lock(args.lock_file)
    if args.watch_parent:
        threading.Thread(
            target=_watch_parent, args=(args.watch_parent, args.fifo), daemon=True
        ).start()
    # The engine reads config.xml from the working directory, already at import.
    os.chdir(args.run_dir)
    try:
        # Only the module-level query of _chdb runs the program that can listen.
        engine: Any = importlib.import_module("chdb._chdb")
    except ImportError as exc:
        print(f"dpone-child: cannot import chdb: {exc}", file=sys.stderr)
        return EXIT_NO_CHDB

    saved_log = Path(args.log_dir) / f"query_log.{_engine_version()}.native"
    result = engine.query(_batch(args, saved_log), "TabSeparated", path=args.store_dir)
    if result.has_error():
        print(f"dpone-child: server failed: {result.error_message()}", file=sys.stderr)
        return EXIT_QUERY_FAILED
    # A failed statement ends the batch early, sometimes without has_error().
    if not result.bytes().rstrip(b"\n").endswith(SAVED_MARKER.encode("ascii")):
        print("dpone-child: the batch ended early; query log not saved", file=sys.stderr)
        return EXIT_QUERY_FAILED
    os.replace(saved_log.with_name(saved_log.name + ".partial"), saved_log)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
