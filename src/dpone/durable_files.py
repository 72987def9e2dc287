"""File durability: a file appears under its final name only complete and synced."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def fsync_directory(path: Path) -> None:
    """fsync a directory so a rename or create inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], *, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Write to a temporary sibling; on success fsync, rename over ``path``, fsync the dir.

    On any exception the temporary file is removed and ``path`` is untouched, so an
    interrupted writer never leaves a file that looks finished.
    """
    final = Path(path)
    tmp = final.with_name(f".{final.name}.{secrets.token_hex(6)}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(final.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically and durably."""
    with atomic_output(path, mode=mode) as stream:
        stream.write(data)
