"""Validation that follows a file while it is being written, on the other core.

:class:`FollowingValidation` runs the compiled check (:func:`native_check`, the GIL
released while it converts) in a thread of its own that reads the file through its own
descriptor as the writer flushes whole records into it, instead of reading the whole
file back after the export. Only the compiled converter's acceptance of the whole file
is taken from it: when it cannot decide, :meth:`FollowingValidation.finish` returns None
and the caller validates the finished file with ``validate_file``, so the verdict never
depends on which of the two ran. See docs/bulk-text-format.md (what an export
guarantees).
"""

from __future__ import annotations

import io
import os
import threading

from dpone.contracts.receipt import FileReceipt
from dpone.contracts.schema import SourceSchema
from dpone.preparation.file_validation import native_check, receipt_for
from dpone.preparation.native_conversion import MAX_RANGE_BYTES, not_taken
from dpone.preparation.ranges import default_workers
from dpone.typepolicy import ColumnPlan, plan_columns

__all__ = ["FollowingValidation"]

# Converter threads: one, beside the writer's thread (which renders) and this check's
# own (which reads and hashes). Measured on the 2-core machine, 1M rows, medians of 5
# alternating: one worker 0.97 s (reader) and 1.65 s (tuples), two 0.98 s and 1.68 s.
WORKERS = 1


class FollowingValidation:
    """The compiled check of a file that a writer is still appending whole records to.

    The writer calls :meth:`flushed` with the size of what is in the file (whole
    records, flushed), then :meth:`finish` with the final size, or :meth:`abandon` when
    it gives up or starts the file again.
    """

    def __init__(self, path: str, schema: SourceSchema, plans: tuple[ColumnPlan, ...]) -> None:
        self._schema = schema
        self._plans = plans
        self._changed = threading.Condition()
        self._flushed = 0
        self._final: int | None = None
        self._abandoned = False
        self._position = 0
        self._result: tuple[int, str, int] | None = None
        self._error: BaseException | None = None
        self._file = io.FileIO(path, "rb")  # closed by finish or abandon
        self._thread = threading.Thread(target=self._run, name="dpone-validate", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            self._file.close()
            raise

    @classmethod
    def start(cls, path: str, schema: SourceSchema) -> FollowingValidation | None:
        """Follow ``path`` (readable by that name while it is written); None when the
        compiled converter takes no file of ``schema``: ``validate_file`` then decides."""
        plans = plan_columns(schema.columns)
        if not_taken(plans) is not None:
            return None
        try:
            return cls(path, schema, plans)
        except (OSError, RuntimeError):  # cannot open it, or no thread: decided afterwards
            return None

    def flushed(self, size: int) -> None:
        """The file holds ``size`` bytes of whole records now."""
        with self._changed:
            self._flushed = size
            self._changed.notify()

    def finish(self, size: int) -> FileReceipt | None:
        """The receipt of the whole file of ``size`` bytes, or None when the check could
        not decide it (then ``validate_file`` must)."""
        with self._changed:
            self._final = size
            self._changed.notify()
        self._end()
        # A failure of the check itself (no memory, a read error) decides nothing either.
        if self._abandoned or self._error is not None or self._result is None:
            return None
        rows, sha256, read = self._result
        if read != size:
            return None
        return receipt_for(self._schema, sha256, read, rows)

    def abandon(self) -> None:
        """Stop following (the writer failed, or truncated the file to begin again)."""
        with self._changed:
            self._abandoned = True
            self._changed.notify()
        self._end()

    def readinto(self, buffer: memoryview, /) -> int:
        """Read what the writer has flushed; wait for a full buffer until it finished."""
        with self._changed:
            while True:
                if self._abandoned:
                    return 0
                end = self._flushed if self._final is None else self._final
                if self._final is not None or end - self._position >= len(buffer):
                    break
                self._changed.wait()
        want = min(len(buffer), max(end - self._position, 0))
        got = self._file.readinto(buffer[:want]) if want else 0
        self._position += got or 0
        return got or 0

    def _run(self) -> None:
        try:
            # Ranges of the longest length: the file's size is not known yet.
            total = 2 * default_workers() * MAX_RANGE_BYTES
            self._result = native_check(
                self, self._plans, None, None, None, total_bytes=total, workers=WORKERS
            )
        except BaseException as exc:  # handed to the writer's thread by finish
            self._error = exc

    def _end(self) -> None:
        if self._thread.is_alive():
            self._thread.join()
        if self._file.closed:
            return
        try:
            # The file must not have changed under the check: the same size on disk.
            read = None if self._result is None else self._result[2]
            if read is not None and os.fstat(self._file.fileno()).st_size != read:
                self._result = None
        except OSError:
            self._result = None
        finally:
            self._file.close()
