"""The immutable attempt journal: one directory per attempt, one event per sequence.

Events live at ``<work_dir>/<attempt_id>/events/<six-digit-sequence>/attempt.json``,
canonical JSON written through the attempt directory's descriptor and published
create-only (a fsynced partial file hard-linked into place, the directories fsynced),
then confirmed by an empty ``confirmed`` mark; readers adopt only confirmed events
(:func:`read_events`), and the sequence and the previous event's SHA-256 advance only
after that. A torn or unconfirmed publication ends the journal for readers
(:func:`pending_publication` names it) and is moved to ``<attempt>/torn/`` by the next
``record``. See docs/staging.md ("The journal").
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dpone.contracts import canonical_json
from dpone.durable_files import OutputError, private_directories
from dpone.errors import JournalError
from dpone.ports.attempt_journal import ClickHouseFileJournalResource, JournalEvent
from dpone.staging.contract import StagingPolicy
from dpone.staging.journal_storage import StoragePreflightService

__all__ = [
    "ClickHouseFileAttemptJournal",
    "ClickHouseFileJournalResource",
    "JournalEvent",
    "file_journals",
    "pending_publication",
    "read_events",
    "verify_journal",
]

JOURNAL_VERSION = 2
EVENT_FILE = "attempt.json"
CONFIRMED = "confirmed"  # the writer's durable confirmation of the event beside it
PARTIAL_FILE = ".attempt.json.partial"
TORN_DIR = "torn"
SPOOL_DIR = "spool"
_SEQUENCE = re.compile(r"^[0-9]{6}$")
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
# Members every event has; the rest of an event is the service's business.
ENVELOPE = ("journal_version", "attempt_id", "sequence", "previous_sha256")


def _close_all(fds: list[int]) -> None:
    while fds:
        os.close(fds.pop())


class ClickHouseFileAttemptJournal:
    """Writes the events of one attempt; refuses to reuse an existing attempt."""

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        attempt_id: str,
        *,
        storage: StoragePreflightService | None = None,
    ) -> None:
        """``storage`` checks the file system before each write (default: room for the
        write itself, no reserve; :func:`file_journals` binds the policy's reserve)."""
        self.work_dir = Path(work_dir)
        self.storage = storage or StoragePreflightService()
        self.attempt_id = attempt_id
        self.attempt_dir = self.work_dir / attempt_id
        self.events_dir = self.attempt_dir / "events"
        self.sequence = 0
        self.last_sha256: str | None = None
        # The attempt and events directories, opened once; closed by close() or with
        # the journal.
        self._fds: list[int] = []
        self._closer = weakref.finalize(self, _close_all, self._fds)
        self._unconfirmed: dict[str, Any] | None = None  # an event that could not be taken back

    @property
    def spool_dir(self) -> Path:
        """The private spool's directory inside the attempt directory, reached through
        the directory's descriptor (``/proc/self/fd``): what is written there lands in
        the directory this journal created, even if its path was replaced since."""
        through = Path(f"/proc/self/fd/{self._descriptors()[0]}")
        return (through if through.is_dir() else self.attempt_dir) / SPOOL_DIR

    def open(self) -> None:
        """Create the attempt directory (exclusively) and its events directory."""
        try:
            private_directories(self.work_dir)  # 0700, each parent it makes too
            work_fd = os.open(self.work_dir, _DIRECTORY & ~os.O_NOFOLLOW)
        except OutputError as exc:
            raise self._failed("the work directory cannot be made", exc) from exc
        except OSError as exc:
            raise self._failed("the work directory cannot be opened", exc) from exc
        try:
            self.storage.before_open(work_fd, self.work_dir, self.attempt_id)
            try:
                os.mkdir(self.attempt_id, 0o700, dir_fd=work_fd)
            except FileExistsError as exc:
                raise JournalError(
                    f"attempt {self.attempt_id} already exists in {self.work_dir}",
                    code="attempt_exists",
                    attempt_id=self.attempt_id,
                ) from exc
            attempt_fd = self._keep(os.open(self.attempt_id, _DIRECTORY, dir_fd=work_fd))
            os.mkdir("events", 0o700, dir_fd=attempt_fd)
            self._keep(os.open("events", _DIRECTORY, dir_fd=attempt_fd))
            os.fsync(attempt_fd)
            os.fsync(work_fd)
        except OSError as exc:
            raise self._failed("the attempt directory cannot be created", exc) from exc
        finally:
            os.close(work_fd)

    def resume(self) -> list[JournalEvent]:
        """Continue an existing, verified journal (for recovery); returns its events."""
        self._descriptors()
        events = read_events(self.attempt_dir)
        if events:
            self.sequence = events[-1].sequence
            self.last_sha256 = events[-1].sha256
        return events

    def close(self) -> None:
        """Release the directory descriptors (a later record opens them again)."""
        _close_all(self._fds)

    def spool_prepared(self) -> None:
        """fsync the attempt directory: the spool directory's entry in it is durable.

        The spool must be where :attr:`attempt_dir` names it: a path that now leads to
        another directory (moved, or replaced by a symbolic link) is ``spool_moved``.
        """
        attempt_fd = self._descriptors()[0]
        try:
            os.fsync(attempt_fd)
            written = os.stat(SPOOL_DIR, dir_fd=attempt_fd, follow_symlinks=False)
        except OSError as exc:
            raise self._failed("the spool directory's entry could not be synced", exc) from exc
        try:
            named = os.stat(self.attempt_dir / SPOOL_DIR)
        except OSError:
            named = None
        if named is None or (named.st_dev, named.st_ino) != (written.st_dev, written.st_ino):
            raise JournalError(
                f"{self.attempt_dir} is no longer the directory attempt {self.attempt_id} "
                "wrote its spool in (moved, or replaced by a symbolic link): its records "
                "would name another spool",
                code="spool_moved",
                attempt_id=self.attempt_id,
                path=str(self.attempt_dir),
            )

    def release_spool(self) -> None:
        """Remove the spool directory (if any) and make its removal durable."""
        attempt_fd = self._descriptors()[0]
        try:
            shutil.rmtree(SPOOL_DIR, dir_fd=attempt_fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._failed("the spool could not be removed", exc) from exc
        try:
            os.fsync(attempt_fd)
        except OSError as exc:
            raise self._failed("the spool's removal could not be synced", exc) from exc

    def record(self, fields: Mapping[str, Any]) -> JournalEvent:
        """Publish the next event durably; only then advance sequence and hash."""
        if self._unconfirmed is not None:
            raise JournalError(
                f"event {self._unconfirmed['sequence']} of attempt {self.attempt_id} was "
                "written, its publication failed and it could not be taken back: it is not "
                "an event, and this journal records nothing after it (an operator looks)",
                code="journal_unconfirmed_event",
                attempt_id=self.attempt_id,
                **self._unconfirmed,
            )
        attempt_fd, events_fd = self._descriptors()
        try:
            repair = self._clear_the_way(attempt_fd, events_fd)
        except OSError as exc:
            raise JournalError(
                f"the torn event {self.sequence + 1} of attempt {self.attempt_id} could not be "
                f"moved aside: {exc}",
                code="journal_write_failed",
                attempt_id=self.attempt_id,
            ) from exc
        sequence = self.sequence + 1
        document = {
            **fields,
            **({"journal_repair": repair} if repair else {}),
            "journal_version": JOURNAL_VERSION,
            "attempt_id": self.attempt_id,
            "sequence": sequence,
            "previous_sha256": self.last_sha256,
        }
        data = canonical_json.dumps(document)
        self.storage.before_record(events_fd, self.events_dir, self.attempt_id, len(data))
        self._publish(events_fd, sequence, data)
        digest = hashlib.sha256(data).hexdigest()
        self.sequence = sequence
        self.last_sha256 = digest
        return JournalEvent(
            sequence, document, digest, self.events_dir / f"{sequence:06d}" / EVENT_FILE
        )

    def _publish(self, events_fd: int, sequence: int, data: bytes) -> None:
        """Create ``events/<sequence>/attempt.json`` with ``data``, durably, and confirm
        it (``confirmed``), or raise: an event without its mark is never adopted."""
        name = f"{sequence:06d}"
        directory: int | None = None
        marked = False
        try:
            os.mkdir(name, 0o700, dir_fd=events_fd)
            directory = os.open(name, _DIRECTORY, dir_fd=events_fd)
            _write_synced(directory, PARTIAL_FILE, data)
            os.link(PARTIAL_FILE, EVENT_FILE, src_dir_fd=directory, dst_dir_fd=directory)
            os.unlink(PARTIAL_FILE, dir_fd=directory)
            os.fsync(directory)
            os.fsync(events_fd)
            # Through the events directory: a sequence directory another writer moved
            # aside meanwhile is not confirmed (ENOENT), its writer fails.
            os.close(_create(f"{name}/{CONFIRMED}", events_fd))
            marked = True
            os.fsync(directory)
        except OSError as exc:
            if marked and directory is not None:
                self._take_back(directory, sequence, exc)
            raise JournalError(
                f"event {sequence} of attempt {self.attempt_id} was not published: {exc}",
                code="journal_write_failed",
                attempt_id=self.attempt_id,
                sequence=sequence,
            ) from exc
        finally:
            if directory is not None:
                os.close(directory)

    def _take_back(self, directory: int, sequence: int, exc: OSError) -> None:
        """A mark whose sync failed does not confirm: remove it, or stop here."""
        try:
            os.unlink(CONFIRMED, dir_fd=directory)
            os.fsync(directory)
        except OSError as cleanup:
            exc.add_note(f"the unconfirmed event's mark could not be removed: {cleanup}")
            self._unconfirmed = {
                "sequence": sequence,
                "event": str(self.events_dir / f"{sequence:06d}" / EVENT_FILE),
            }

    def _clear_the_way(self, attempt_fd: int, events_fd: int) -> dict[str, Any] | None:
        """Repair what an earlier publication of the next sequence left; say what it was."""
        name = f"{self.sequence + 1:06d}"
        try:
            directory = os.open(name, _DIRECTORY, dir_fd=events_fd)
        except FileNotFoundError:
            return None
        try:
            found = {e.name: e.stat(follow_symlinks=False).st_size for e in os.scandir(directory)}
        finally:
            os.close(directory)
        if CONFIRMED in found:
            # A confirmed event this journal did not publish (another writer's, or one
            # read back by a stale resume): never replaced, never adopted.
            raise JournalError(
                f"{self.events_dir / name} holds an event this journal did not publish",
                code="journal_diverged",
                event=str(self.events_dir / name),
            )
        with contextlib.suppress(FileExistsError):
            os.mkdir(TORN_DIR, 0o700, dir_fd=attempt_fd)
        torn = os.open(TORN_DIR, _DIRECTORY, dir_fd=attempt_fd)
        try:
            target, n = name, 1
            while _exists(target, torn):
                n += 1
                target = f"{name}.{n}"
            os.rename(name, target, src_dir_fd=events_fd, dst_dir_fd=torn)
            os.fsync(torn)
            os.fsync(events_fd)
            os.fsync(attempt_fd)
        finally:
            os.close(torn)
        return {
            "torn_publication": {
                "sequence": self.sequence + 1,
                "found": dict(sorted(found.items())),
                "moved_to": f"{TORN_DIR}/{target}",
            }
        }

    def _descriptors(self) -> tuple[int, int]:
        """The attempt and events directories' descriptors, opened once."""
        if not self._fds:
            try:
                attempt_fd = self._keep(os.open(self.attempt_dir, _DIRECTORY))
                self._keep(os.open("events", _DIRECTORY, dir_fd=attempt_fd))
            except FileNotFoundError as exc:
                self.close()
                raise JournalError(
                    f"{self.attempt_dir} has no events directory",
                    code="journal_missing",
                    attempt_id=self.attempt_id,
                ) from exc
            except OSError as exc:
                self.close()
                raise self._failed("the attempt directory cannot be opened", exc) from exc
        return self._fds[0], self._fds[1]

    def _keep(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def _failed(self, what: str, exc: OSError | OutputError) -> JournalError:
        return JournalError(
            f"journal of attempt {self.attempt_id} in {self.work_dir}: {what}: {exc}",
            code="journal_write_failed",
            attempt_id=self.attempt_id,
        )


def file_journals(
    work_dir: str | os.PathLike[str],
    journal: Callable[..., ClickHouseFileAttemptJournal] = ClickHouseFileAttemptJournal,
) -> Callable[[StagingPolicy, str], ClickHouseFileAttemptJournal]:
    """The service's ``journal_factory(policy, attempt_id)``: file journals in ``work_dir``.

    The storage is bound here: the work directory, and its preflight, which opens an
    attempt only with the policy's ``free_space_reserve_bytes`` free
    (:class:`StoragePreflightService`). ``journal`` builds one journal from ``(work_dir,
    attempt_id, storage=...)`` (a subclass, for a test that injects a fault).
    """
    bound = Path(work_dir)

    def factory(policy: StagingPolicy, attempt_id: str) -> ClickHouseFileAttemptJournal:
        storage = StoragePreflightService(admission_reserve_bytes=policy.free_space_reserve_bytes)
        return journal(bound, attempt_id, storage=storage)

    return factory


def _create(name: str, directory: int) -> int:
    """Create ``name`` (relative to ``directory``) exclusively, private; its descriptor."""
    return os.open(
        name,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
        0o600,
        dir_fd=directory,
    )


def _write_synced(directory: int, name: str, data: bytes) -> None:
    """Create ``name`` in ``directory`` exclusively with ``data``, fsynced."""
    fd = _create(name, directory)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            if written <= 0:
                raise OSError(f"write of {name} made no progress ({len(view)} bytes left)")
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def _exists(name: str, directory: int) -> bool:
    try:
        os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def verify_journal(
    attempt_dir: str | os.PathLike[str], *, head: str | None = None
) -> list[JournalEvent]:
    """``read_events`` for a person: an empty journal fails, and ``head`` (the SHA-256
    of the final event, as ``dpone stage`` printed it) must be the last event's.

    Without ``head`` a journal whose trailing events were deleted still verifies: the
    chain only proves what precedes each event.
    """
    events = read_events(attempt_dir)
    if not events:
        raise JournalError(f"{attempt_dir} holds no event", code="journal_empty")
    if head is not None and events[-1].sha256 != head.lower():
        raise JournalError(
            f"{attempt_dir} ends at event {events[-1].sequence} with SHA-256 "
            f"{events[-1].sha256}, not at {head}",
            code="journal_head_mismatch",
            events=len(events),
            last_sha256=events[-1].sha256,
        )
    return events


def read_events(attempt_dir: str | os.PathLike[str]) -> list[JournalEvent]:
    """Read and verify every event of an attempt: sequence, chain and canonical bytes.

    Raises :class:`JournalError` naming the first event that breaks the journal.
    """
    events_dir = Path(attempt_dir) / "events"
    if not events_dir.is_dir():
        raise JournalError(f"{attempt_dir} has no events directory", code="journal_missing")
    names = sorted(p.name for p in events_dir.iterdir())
    events: list[JournalEvent] = []
    previous: str | None = None
    attempt_id: str | None = None  # the first event's; the directory may be renamed
    for expected, name in enumerate(names, start=1):
        where = events_dir / name
        if not _SEQUENCE.fullmatch(name) or int(name) != expected:
            raise JournalError(
                f"{where}: expected event {expected:06d}",
                code="journal_sequence_gap",
                event=str(where),
            )
        path = where / EVENT_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            if expected == len(names):
                break  # a publication that did not complete is not an event
            raise JournalError(
                f"{path} is missing", code="journal_sequence_gap", event=str(path)
            ) from exc
        confirmed = _is_mark(where / CONFIRMED)
        try:
            document = canonical_json.loads(data, what=str(path))
        except Exception as exc:
            if not confirmed and expected == len(names):
                break  # not confirmed: not an event, whatever it holds
            if isinstance(exc, JournalError):
                raise
            raise JournalError(
                f"{path}: {exc}", code="journal_noncanonical", event=str(path)
            ) from exc
        if not confirmed and not _legacy(document):
            if expected == len(names):
                break  # written, never confirmed by its writer: not an event
            raise JournalError(
                f"{path} was never confirmed by its writer, yet events follow it",
                code="journal_unconfirmed_event",
                event=str(path),
            )
        if not isinstance(document, dict) or any(k not in document for k in ENVELOPE):
            raise JournalError(
                f"{path} lacks the event envelope", code="journal_invalid", event=str(path)
            )
        if document["sequence"] != expected or isinstance(document["sequence"], bool):
            raise JournalError(
                f"{path} says sequence {document['sequence']}",
                code="journal_sequence_gap",
                event=str(path),
            )
        if attempt_id is None:
            attempt_id = document["attempt_id"]
        if document["attempt_id"] != attempt_id:
            raise JournalError(
                f"{path} belongs to attempt {document['attempt_id']}",
                code="journal_invalid",
                event=str(path),
            )
        if document["previous_sha256"] != previous:
            raise JournalError(
                f"{path} does not chain to event {expected - 1}",
                code="journal_chain_broken",
                event=str(path),
            )
        previous = hashlib.sha256(data).hexdigest()
        events.append(JournalEvent(expected, document, previous, path))
    return events


def _legacy(document: object) -> bool:
    """An event of journal version 1, written before events carried their mark."""
    return isinstance(document, dict) and document.get("journal_version") == 1


def pending_publication(
    attempt_dir: str | os.PathLike[str], events: list[JournalEvent]
) -> dict[str, Any] | None:
    """What follows the last confirmed event of ``events`` (read from ``attempt_dir``):
    None, or the publication that no writer confirmed (``sequence``; ``written``: its
    event file is visible, its writer failed or died before confirming it; else it was
    torn before that). It is not an event: the attempt is what ``events`` say, and the
    next record of the journal moves it aside."""
    sequence = len(events) + 1
    where = Path(attempt_dir) / "events" / f"{sequence:06d}"
    if not where.is_dir():
        return None
    return {
        "sequence": sequence,
        "written": (where / EVENT_FILE).exists(),
        "path": str(where),
    }


def _is_mark(path: Path) -> bool:
    """Whether ``path`` is a confirmation mark: a regular file, never a link followed to
    one, nor a directory of that name."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False
