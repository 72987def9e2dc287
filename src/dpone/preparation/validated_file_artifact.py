"""``ContractValidatedFileArtifact``: a source file bound to its genuine receipt.

``file_validation_attempt(attempt_id, verification_budget=None)`` binds a freshly
verified receipt for one attempt, under the busy guard: an attempt id is active at most
once in the process (``attempt_busy``), and one artifact object carries one active
attempt (``artifact_busy``). The receipt must stay byte-identical during the attempt;
``complete`` accepts one exact, non-boolean count equal to the receipt's rows while
active; an exceptional exit resets the latest summary. This grants no terminal source
authority. See docs/staging.md ("The sequence").
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dpone.contracts.receipt import FileReceipt
from dpone.errors import StateError
from dpone.preparation.artifact import ArtifactMismatch, FileVerificationBudget, HeldArtifact


@dataclass(frozen=True)
class AttemptSummary:
    """What the last completed attempt established."""

    attempt_id: str
    rows: int
    artifact_sha256: str
    receipt_sha256: str


class FileAttempt:
    """The binding of one attempt: the held file, the receipt bytes, completion."""

    def __init__(
        self,
        owner: ContractValidatedFileArtifact,
        attempt_id: str,
        held: HeldArtifact,
        receipt_bytes: bytes,
        budget: FileVerificationBudget | None,
    ) -> None:
        self._owner = owner
        self.attempt_id = attempt_id
        self.held = held
        self.receipt = held.receipt
        self._receipt_bytes = receipt_bytes
        self._budget = budget
        self.completed: AttemptSummary | None = None

    def verify(self, budget: FileVerificationBudget | None = None) -> None:
        """Re-check receipt bytes (before and after) and the file through the held fd.

        ``budget`` bounds this scan; by default the one the attempt was bound with.
        """
        self._owner.check_receipt_unchanged(self._receipt_bytes)
        self.held.verify(budget or self._budget)
        self._owner.check_receipt_unchanged(self._receipt_bytes)

    def complete(
        self, count: object, budget: FileVerificationBudget | None = None
    ) -> AttemptSummary:
        """Record completion with the exact row count; only while active, after checks.

        Completion re-scans the source; a caller whose phase has its own deadline (the
        staging service's verification deadline) passes that ``budget``.
        """
        if self._owner.active is not self:
            raise StateError("attempt is not active", code="attempt_not_active")
        if isinstance(count, bool) or not isinstance(count, int):
            raise StateError(
                f"count must be an integer, not {type(count).__name__}", code="invalid_count"
            )
        if count != self.receipt.rows_validated:
            raise StateError(
                f"count {count} differs from the receipt's {self.receipt.rows_validated} rows",
                code="count_mismatch",
            )
        self.verify(budget)
        self.completed = AttemptSummary(
            self.attempt_id, count, self.receipt.artifact_sha256, self.receipt.sha256
        )
        return self.completed


# The attempts active in this process: an attempt's id names its staging table and
# its query ids, so two entries of one attempt would share them whatever their files.
_ACTIVE_ATTEMPTS: dict[str, Path] = {}
_ACTIVE_LOCK = threading.Lock()


@contextlib.contextmanager
def _attempt_guard(attempt_id: str, path: Path) -> Iterator[None]:
    """Hold ``attempt_id`` active for the ``with`` block; refuse it if it already is."""
    with _ACTIVE_LOCK:
        holder = _ACTIVE_ATTEMPTS.get(attempt_id)
        if holder is not None:
            raise StateError(
                f"attempt {attempt_id} is already active (on {holder}); an attempt runs once: "
                "let it end, or start another attempt with a new attempt id",
                code="attempt_busy",
                attempt_id=attempt_id,
                active_on=str(holder),
            )
        _ACTIVE_ATTEMPTS[attempt_id] = path
    try:
        yield
    finally:
        with _ACTIVE_LOCK:
            del _ACTIVE_ATTEMPTS[attempt_id]


class ContractValidatedFileArtifact:
    """A bulk text file and the path of its receipt."""

    def __init__(self, path: str | os.PathLike[str], receipt_path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.receipt_path = Path(receipt_path)
        self.active: FileAttempt | None = None
        self.latest_summary: AttemptSummary | None = None
        self._lock = threading.Lock()

    def check_receipt_unchanged(self, expected: bytes) -> None:
        try:
            now = self.receipt_path.read_bytes()
        except OSError as exc:
            raise ArtifactMismatch(
                f"receipt {self.receipt_path} is gone", code="receipt_replaced"
            ) from exc
        if now != expected:
            raise ArtifactMismatch(
                f"receipt {self.receipt_path} was replaced during the attempt",
                code="receipt_replaced",
            )

    @contextlib.contextmanager
    def file_validation_attempt(
        self, attempt_id: str, *, verification_budget: FileVerificationBudget | None = None
    ) -> Iterator[FileAttempt]:
        """Bind a freshly verified receipt to ``attempt_id`` for the ``with`` block.

        Refused, changing nothing, while ``attempt_id`` is active anywhere in the process
        (``attempt_busy``) or another attempt is active on this object (``artifact_busy``).
        """
        with (
            _attempt_guard(attempt_id, self.path),
            self._entered(attempt_id, verification_budget) as attempt,
        ):
            yield attempt

    @contextlib.contextmanager
    def _entered(
        self, attempt_id: str, verification_budget: FileVerificationBudget | None
    ) -> Iterator[FileAttempt]:
        if not self._lock.acquire(blocking=False):
            busy = self.active.attempt_id if self.active else "another attempt"
            raise StateError(
                f"{self.path} is busy with attempt {busy}",
                code="artifact_busy",
                attempt_id=attempt_id,
                active_attempt=busy,
            )
        try:
            try:
                receipt_bytes = self.receipt_path.read_bytes()
            except OSError as exc:
                raise ArtifactMismatch(
                    f"receipt {self.receipt_path} cannot be read: {exc.strerror or exc}",
                    code="receipt_unreadable",
                    receipt=str(self.receipt_path),
                    errno=exc.errno,
                ) from exc
            receipt = FileReceipt.from_bytes(receipt_bytes)
            held = HeldArtifact(self.path, receipt)
            attempt = FileAttempt(self, attempt_id, held, receipt_bytes, verification_budget)
            try:
                attempt.verify()
                self.active = attempt
                yield attempt
            except BaseException:
                self.latest_summary = None
                raise
            else:
                self.latest_summary = attempt.completed
            finally:
                self.active = None
                held.close()
        finally:
            self._lock.release()
