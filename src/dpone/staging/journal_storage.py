"""The journal's storage preflight: room and writability, checked before a write.

Before the attempt directory is created and before each event is published, the journal
asks :class:`StoragePreflightService` (the source document's ``storage=`` of the file
journal) whether its file system can take the write: not read-only, writable, with the
free space (the write plus a reserve: the policy's ``free_space_reserve_bytes`` at
``open``, none per record) and inodes it needs. A refusal is a coded
:class:`JournalError` raised before anything is written, so a full disk never leaves a
torn publication. See docs/staging.md ("The journal").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dpone.errors import JournalError

# Entries one event creates: its sequence directory, attempt.json and its mark.
_ENTRIES = 3


@dataclass(frozen=True)
class StoragePreflightService:
    """Checks a journal's file system before it writes; refuses with a coded error."""

    admission_reserve_bytes: int = 0  # free space required to open an attempt
    record_reserve_bytes: int = 0  # free space required beyond each event's own

    def before_open(self, directory: int, where: Path, attempt_id: str) -> None:
        """``directory`` (the work directory's descriptor) can take a new attempt."""
        self._check(directory, where, attempt_id, 0, self.admission_reserve_bytes)

    def before_record(self, directory: int, where: Path, attempt_id: str, size: int) -> None:
        """``directory`` (the events directory's descriptor) can take a ``size``-byte event."""
        self._check(directory, where, attempt_id, size, self.record_reserve_bytes)

    def _check(self, fd: int, where: Path, attempt_id: str, size: int, reserve: int) -> None:
        try:
            stats = os.fstatvfs(fd)
            # Through the descriptor itself (no /proc needed): may this process write in it.
            writable = os.access(".", os.W_OK, dir_fd=fd)
        except OSError as exc:
            raise JournalError(
                f"the journal's storage at {where} cannot be examined: {exc.strerror or exc}; "
                "nothing was written",
                code="journal_storage_unknown",
                attempt_id=attempt_id,
                path=str(where),
            ) from exc
        if stats.f_flag & os.ST_RDONLY or not writable:
            why = "is mounted read-only" if stats.f_flag & os.ST_RDONLY else "is not writable"
            raise JournalError(
                f"the journal's storage at {where} {why}; nothing was written (give a "
                "--work-dir this process can write, or remount it read-write)",
                code="journal_storage_unwritable",
                attempt_id=attempt_id,
                path=str(where),
            )
        block = stats.f_frsize or stats.f_bsize or 4096
        need = size + _ENTRIES * block + reserve
        free = stats.f_bavail * block
        # A file system that reports no inode count (f_files == 0) has no inode limit.
        inodes_short = stats.f_files > 0 and stats.f_favail < _ENTRIES
        if free < need or inodes_short:
            raise JournalError(
                f"the journal's storage at {where} has {free} bytes"
                + (f" and {stats.f_favail} inodes" if inodes_short else "")
                + f" free; this write needs {need} bytes (the write {size}, reserve {reserve})"
                " and 3 inodes; nothing was written (free space there, then run again)",
                code="journal_storage_low",
                attempt_id=attempt_id,
                path=str(where),
                free_bytes=free,
                need_bytes=need,
                reserve_bytes=reserve,
                free_inodes=stats.f_favail,
            )
