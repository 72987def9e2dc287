"""Whole-record ranges of a stream, and how long they are, for converting on every core.

A converter that works range by range (the compiled one) reads the source once, in
ranges that end at an LF, so each range holds whole records and can be converted on a
worker thread of its own while the next one is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Protocol

# Worker threads: one per core, at most this many.
MAX_WORKERS = 4
# A record with no LF within this many bytes (or the record budget) is handed over.
MAX_CARRY_BYTES = 64 << 20


def default_workers() -> int:
    """One worker per core, at most :data:`MAX_WORKERS`."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


class ReadsInto(Protocol):
    """A binary stream that reads into a caller's buffer (a file opened ``rb``)."""

    def readinto(self, buffer: memoryview, /) -> int | None: ...


class RecordRanges:
    """Whole-record ranges of a stream: iterate for ``(data, end)``, ``data[:end]`` the range.

    A range is about ``chunk_bytes`` long and ends at an LF; ``data`` is reused, so a
    range is valid only until the next one is asked for. After iteration,
    ``too_long`` says a record grew past ``carry_limit`` bytes without an LF (iteration
    stopped there) and ``trailing`` holds the bytes after the last LF (a final record
    without its LF): both are for the reference to name exactly.
    """

    def __init__(self, stream: ReadsInto, chunk_bytes: int, carry_limit: int) -> None:
        self.stream = stream
        self.chunk_bytes = chunk_bytes
        self.carry_limit = max(carry_limit, chunk_bytes)
        self.too_long = False
        self.trailing = b""

    def __iter__(self) -> Iterator[tuple[bytearray, int]]:
        # One buffer, read into and reused: a range valid until the next step costs its
        # length in memory once (joining carry and chunk as bytes held it twice).
        buffer = bytearray()
        carry = 0  # bytes of an unfinished record at the start of the buffer
        while True:
            need = carry + self.chunk_bytes
            if len(buffer) < need:
                buffer.extend(bytes(need - len(buffer)))
            with memoryview(buffer) as view:
                got = self.stream.readinto(view[carry:need])
            if got is None:
                raise BlockingIOError("record ranges need a blocking stream")
            if not got:
                break
            filled = carry + got
            end = buffer.rfind(b"\n", carry, filled) + 1  # the carry holds no LF
            if end == 0:
                carry = filled  # inside one long record: read on until its LF
                if carry > self.carry_limit:
                    self.too_long = True
                    return
                continue
            yield buffer, end
            carry = filled - end
            buffer[:carry] = buffer[end:filled]
        self.trailing = bytes(buffer[:carry])


def range_bytes(total: int, workers: int, bounds: tuple[int, int]) -> int:
    """How long the ranges of a ``total``-byte file are: two per worker, within ``bounds``.

    Two per worker keep every worker busy on a small file; the bounds keep the ranges
    in flight small in memory and each call's fixed cost negligible (the caller reads
    them at each call, so a test can make ranges tiny).
    """
    low, high = bounds
    return min(high, max(low, -(-total // (2 * workers))))
