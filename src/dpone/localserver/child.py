"""Entry point of the server process: ``python -m dpone.localserver.child``.

Runs in a process of its own because the embedded engine allows one server per
process and nothing else of chdb beside it. It takes the data-directory lock, then
runs one batch: start both listeners, write the chosen ports, and block reading the
control FIFO. A line written to the FIFO ends the batch and the process exits cleanly.

Exit codes tell the parent what went wrong before readiness.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import importlib
import os
import sys
import threading
import time
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


def _take_lock(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            print(f"dpone-child: lock {path} is held by another server", file=sys.stderr)
            sys.exit(EXIT_LOCKED)
        raise
    return fd  # held until the process exits


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

    batch = "; ".join(
        [
            "SYSTEM START LISTEN HTTP",
            "SYSTEM START LISTEN TCP",
            "SELECT getServerPort('http_port'), getServerPort('tcp_port'), version() "
            f"INTO OUTFILE {quote_literal(args.ports_file)} TRUNCATE FORMAT TabSeparated",
            # Blocks until a writer sends a line and closes: the clean stop signal.
            f"SELECT count() FROM file({quote_literal(args.fifo)}, 'LineAsString')",
        ]
    )
    result = engine.query(batch, "TabSeparated", path=args.store_dir)
    if result.has_error():
        print(f"dpone-child: server failed: {result.error_message()}", file=sys.stderr)
        return EXIT_QUERY_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
