"""A source file held open by descriptor and verified against its receipt.

Verification hashes the bytes through the held descriptor with ``pread`` (so a shared
descriptor keeps its position) and compares size and SHA-256 with the receipt. A file
replaced under the same name (another inode) or modified in place is detected, also
between two verifications.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from dpone.contracts.receipt import FileReceipt
from dpone.errors import DeadlineError, DponeError

VERIFY_CHUNK_BYTES = 1 << 20


class ArtifactMismatch(DponeError):
    """The file is not the one the receipt describes (anymore)."""

    code = "artifact_mismatch"


@dataclass(frozen=True)
class FileObservation:
    """What one scan saw: size and SHA-256 of the bytes, and the file's identity."""

    size: int
    sha256: str
    device: int
    inode: int


@dataclass
class FileVerificationBudget:
    """Bounds for verification scans: one absolute deadline and a per-scan byte cap.

    The clock is injected (monotonic). Checks run before and after every fixed-size
    read, including the read that finds EOF. These are cooperative limits checked
    between reads, not preemption of a blocked system call.
    """

    deadline: float
    max_scan_bytes: int
    clock: Callable[[], float] = time.monotonic

    def check(self, scanned: int, when: str) -> None:
        if self.clock() >= self.deadline:
            raise DeadlineError(
                f"verification deadline expired {when}", code="verification_deadline"
            )
        if scanned > self.max_scan_bytes:
            raise ArtifactMismatch(
                f"verification scan passed its cap of {self.max_scan_bytes} bytes",
                code="verification_budget_exceeded",
            )


def scan_descriptor(
    fd: int, *, chunk_bytes: int = VERIFY_CHUNK_BYTES, budget: FileVerificationBudget | None = None
) -> FileObservation:
    """Hash every byte of ``fd`` with ``pread``; the size must not change meanwhile."""
    before = os.fstat(fd)
    if budget is not None:
        budget.check(before.st_size, "before the scan (file size)")
    digest = hashlib.sha256()
    offset = 0
    while True:
        if budget is not None:
            budget.check(offset, f"before reading at offset {offset}")
        chunk = os.pread(fd, chunk_bytes, offset)
        if budget is not None:
            budget.check(offset + len(chunk), f"after reading at offset {offset}")
        if not chunk:
            break
        digest.update(chunk)
        offset += len(chunk)
    after = os.fstat(fd)
    if offset != before.st_size or after.st_size != before.st_size:
        raise ArtifactMismatch(
            f"file changed size while it was read ({before.st_size} -> {offset} bytes read, "
            f"{after.st_size} now)",
            code="artifact_changed_during_scan",
        )
    return FileObservation(offset, digest.hexdigest(), before.st_dev, before.st_ino)


class DescriptorStream(io.RawIOBase):
    """A read-only stream over a shared descriptor that reads with ``pread``.

    It keeps its own offset, so the descriptor's position (shared with others who
    hold it) never moves.
    """

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._offset = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        read = os.preadv(self._fd, [buffer], self._offset)  # straight into the caller's buffer
        self._offset += read
        return read


class HeldArtifact:
    """An open, read-only descriptor on a source file, checked against a receipt."""

    def __init__(self, path: str | os.PathLike[str], receipt: FileReceipt) -> None:
        self.path = Path(path)
        self.receipt = receipt
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            info = os.fstat(self.fd)
            if not stat.S_ISREG(info.st_mode):
                raise ArtifactMismatch(f"{self.path} is not a regular file", code="not_a_file")
            self._identity = (info.st_dev, info.st_ino)
        except BaseException:
            os.close(self.fd)
            raise

    def verify(self, budget: FileVerificationBudget | None = None) -> FileObservation:
        """Re-hash through the held descriptor; refuse a replaced or modified file."""
        observed = scan_descriptor(self.fd, budget=budget)
        try:
            current = os.stat(self.path)
        except FileNotFoundError as exc:
            raise ArtifactMismatch(
                f"{self.path} was removed or renamed", code="artifact_replaced", path=str(self.path)
            ) from exc
        if (current.st_dev, current.st_ino) != self._identity:
            raise ArtifactMismatch(
                f"{self.path} was replaced by another file",
                code="artifact_replaced",
                path=str(self.path),
            )
        if observed.size != self.receipt.artifact_size:
            raise ArtifactMismatch(
                f"{self.path} has {observed.size} bytes, the receipt says "
                f"{self.receipt.artifact_size}",
                code="artifact_size_mismatch",
                path=str(self.path),
            )
        if observed.sha256 != self.receipt.artifact_sha256:
            raise ArtifactMismatch(
                f"{self.path} SHA-256 {observed.sha256} differs from the receipt's "
                f"{self.receipt.artifact_sha256}",
                code="artifact_hash_mismatch",
                path=str(self.path),
            )
        return observed

    def stream(self) -> io.BufferedReader:
        """A fresh buffered stream from the start of the held file (position-neutral)."""
        return io.BufferedReader(DescriptorStream(self.fd), buffer_size=VERIFY_CHUNK_BYTES)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> HeldArtifact:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
