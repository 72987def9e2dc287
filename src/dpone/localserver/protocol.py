"""What the parent and the server process agree on: exit codes and the stop signal."""

from __future__ import annotations

import errno
import os

EXIT_OK = 0
EXIT_QUERY_FAILED = 1
EXIT_LOCKED = 3
EXIT_NO_CHDB = 4
EXIT_PARENT_GONE = 5

CHILD_MODULE = "dpone.localserver.child"


def request_stop(fifo: str) -> bool:
    """Ask the server blocked on ``fifo`` to finish; False if nobody is reading."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ENOENT):
            return False
        raise
    try:
        os.write(fd, b"stop\n")
    finally:
        os.close(fd)
    return True
