"""Ranges of a stream through the compiled converter, on every core, joined in order.

The stream is read once, in whole-record ranges (:class:`RecordRanges`); each range is
hashed in order before it is converted, so the bytes converted are provably the bytes
hashed, and converted by :func:`dpone.preparation.native.rowbinary.convert_range` on a worker
thread (the call releases the GIL). A few ranges are in flight at a time, so memory
stays flat whatever the file's size. Parts come back in file order.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from dpone.preparation.native import rowbinary
from dpone.preparation.native.rowbinary import MODE_NATIVE, NativePart, NativeUnavailable
from dpone.preparation.ranges import ReadsInto, RecordRanges, default_workers, range_bytes
from dpone.typepolicy import ColumnPlan

__all__ = ["MODE_NATIVE", "NativeRanges", "NativeUnavailable", "library", "not_taken", "takes"]

# Bounds of a range's length: short enough that the ranges in flight stay small in
# memory (each holds its bytes and its RowBinary), long enough that a call's fixed
# cost (a SHA-256 context, a locale) is nothing.
MIN_RANGE_BYTES = 1 << 20
MAX_RANGE_BYTES = 8 << 20


def library() -> tuple[Path, str | None]:
    """Where the compiled converter's library is looked for, and why it is not in use
    ("is not built (...)", "cannot be loaded (...)"), or None when it loaded and runs here."""
    return rowbinary.LIBRARY, rowbinary.unavailable_reason()


def takes(plans: tuple[ColumnPlan, ...]) -> bool:
    """Whether the compiled converter is available and takes columns like ``plans``."""
    return not_taken(plans) is None


def not_taken(plans: tuple[ColumnPlan, ...]) -> str | None:
    """Why the compiled converter takes no file of ``plans`` ("is switched off (...)",
    "does not take Decimal(76, 40)"), or None when it takes them."""
    reason = rowbinary.unavailable_reason()
    if reason is not None:
        return reason
    if rowbinary.column_spec(plans) is not None:
        return None
    # Which column: the first one it would not take alone (none for no columns at all).
    odd = [p.clickhouse_type for p in plans if rowbinary.column_spec((p,)) is None]
    return f"does not take {odd[0]}" if odd else "takes no file without columns"


class NativeRanges:
    """The converted parts of ``stream``, in order (:meth:`parts`); None once a range is declined.

    A fault of the converter itself (out of memory, say) counts as declining: the
    reference decides, as for any range this one does not take.

    ``on_bytes`` sees every byte handed to the converter, in order (to hash them). After
    iteration, ``size`` is the bytes converted, and ``too_long`` and ``trailing`` say
    what :class:`RecordRanges` says (a record too long to hold, bytes after the last
    LF): both are for the reference to name. ``keep`` False drops the RowBinary
    (validation needs only the verdict).
    """

    def __init__(
        self,
        stream: ReadsInto,
        plans: tuple[ColumnPlan, ...],
        *,
        total_bytes: int,
        carry_limit: int,
        max_record_bytes: int | None,
        on_bytes: Callable[[bytes], object],
        keep: bool = True,
        workers: int | None = None,
    ) -> None:
        spec = rowbinary.column_spec(plans)
        if spec is None or not rowbinary.available():
            raise NativeUnavailable("the compiled converter cannot take these columns")
        self._spec = spec
        self._max_record_bytes = max_record_bytes
        self._on_bytes = on_bytes
        self._keep = keep
        self.workers = workers or default_workers()
        chunk = range_bytes(total_bytes, self.workers, (MIN_RANGE_BYTES, MAX_RANGE_BYTES))
        self._ranges = RecordRanges(stream, chunk, carry_limit)
        self.size = 0

    @property
    def too_long(self) -> bool:
        return self._ranges.too_long

    @property
    def trailing(self) -> bytes:
        return self._ranges.trailing

    def _convert(self, data: bytes) -> NativePart | None:
        try:
            return rowbinary.convert_range(
                self._spec, data, self._max_record_bytes, keep=self._keep
            )
        except NativeUnavailable:
            return None

    @contextlib.contextmanager
    def parts(self) -> Iterator[Iterator[NativePart | None]]:
        """The parts, as an iterator that is closed (its threads joined) on leaving."""
        with contextlib.closing(self._parts()) as parts:
            yield parts

    def _parts(self) -> Generator[NativePart | None, None, None]:
        pending: collections.deque[Future[NativePart | None]] = collections.deque()
        # Two ranges per worker in flight: one converting, one read and waiting.
        in_flight = 2 * self.workers
        executor = ThreadPoolExecutor(self.workers, thread_name_prefix="dpone-native")
        try:
            for data, end in self._ranges:
                piece = bytes(memoryview(data)[:end])
                self._on_bytes(piece)
                self.size += end
                pending.append(executor.submit(self._convert, piece))
                del piece
                while len(pending) >= in_flight:
                    part = pending.popleft().result()
                    yield part
                    if part is None:
                        return
            while pending:
                part = pending.popleft().result()
                yield part
                if part is None:
                    return
        finally:
            # A range being converted finishes (a call cannot be stopped); the rest
            # never start.
            executor.shutdown(wait=True, cancel_futures=True)
