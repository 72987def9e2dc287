"""What the parent and the server process agree on: exit codes and the stop signal."""

from __future__ import annotations

import errno
import os

EXIT_OK = 0
EXIT_QUERY_FAILED = 1
EXIT_LOCKED = 3
EXIT_NO_CHDB = 4
EXIT_PARENT_GONE = 5
EXIT_NO_CREDENTIALS = 6

CHILD_MODULE = "dpone.localserver.child"


def request_stop(fifo: str) -> bool:
    """Ask the server reading ``fifo`` to stop cleanly; False if nobody is reading.

    The FIFO (0600 in the owner's 0700 ``run/``) is the only clean-stop channel: the
    server's control thread reads it and stops the engine as the administrator.
    """
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
