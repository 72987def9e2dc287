"""The immutable attempt journal: one directory per attempt, one event per sequence.

Layout: ``<work_dir>/<attempt_id>/events/<six-digit-sequence>/attempt.json``. Each
event is canonical JSON. It is published create-only: the sequence directory is
created exclusively, the bytes go to a private partial file that is fsynced and then
hard-linked to ``attempt.json`` (a link never replaces), and the directories are
fsynced. The sequence and the previous event's SHA-256 advance only after all of
that succeeded. A visible file whose writer failed is not an event: ``verify`` and
``read_events`` stop at the first sequence whose publication did not complete.

A publication that did not complete (a crash, a failed write) leaves a torn
``events/<n>/`` directory. The next ``record`` repairs it instead of being blocked by
it: a torn directory (no ``attempt.json``) is moved to ``<attempt>/torn/`` and the
new event says what was found there (``journal_repair``); a complete event whose
writer could not confirm it (its take-back failed) verifies like any other and is
adopted, and the next event says so. The attempt id of a journal is the one its
events carry, so an archived (renamed) attempt directory still verifies.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpone.contracts import canonical_json
from dpone.durable_files import fsync_directory
from dpone.errors import JournalError

JOURNAL_VERSION = 1
EVENT_FILE = "attempt.json"
PARTIAL_FILE = ".attempt.json.partial"
TORN_DIR = "torn"
_SEQUENCE = re.compile(r"^[0-9]{6}$")
# Members every event has; the rest of an event is the service's business.
ENVELOPE = ("journal_version", "attempt_id", "sequence", "previous_sha256")


@dataclass(frozen=True)
class JournalEvent:
    """One published event: its document, canonical bytes' digest and path."""

    sequence: int
    document: dict[str, Any]
    sha256: str
    path: Path


class ClickHouseFileAttemptJournal:
    """Writes the events of one attempt; refuses to reuse an existing attempt."""

    def __init__(self, work_dir: str | os.PathLike[str], attempt_id: str) -> None:
        self.work_dir = Path(work_dir)
        self.attempt_id = attempt_id
        self.attempt_dir = self.work_dir / attempt_id
        self.events_dir = self.attempt_dir / "events"
        self.sequence = 0
        self.last_sha256: str | None = None

    def open(self) -> None:
        """Create the attempt directory (exclusively) and its events directory."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.attempt_dir.mkdir(mode=0o700)
        except FileExistsError as exc:
            raise JournalError(
                f"attempt {self.attempt_id} already exists in {self.work_dir}",
                code="attempt_exists",
                attempt_id=self.attempt_id,
            ) from exc
        self.events_dir.mkdir(mode=0o700)
        fsync_directory(self.attempt_dir)
        fsync_directory(self.work_dir)

    def resume(self) -> list[JournalEvent]:
        """Continue an existing, verified journal (for recovery); returns its events."""
        events = read_events(self.attempt_dir)
        if events:
            self.sequence = events[-1].sequence
            self.last_sha256 = events[-1].sha256
        return events

    def record(self, fields: Mapping[str, Any]) -> JournalEvent:
        """Publish the next event durably; only then advance sequence and hash."""
        try:
            repair = self._clear_the_way()
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
        directory = self.events_dir / f"{sequence:06d}"
        try:
            directory.mkdir(mode=0o700)
            partial = directory / PARTIAL_FILE
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(
                        f"short write of event {sequence}: {written} of {len(data)} bytes"
                    )
                os.fsync(fd)
            finally:
                os.close(fd)
            os.link(partial, directory / EVENT_FILE)
            os.unlink(partial)
            fsync_directory(directory)
            fsync_directory(self.events_dir)
        except OSError as exc:
            # A visible file whose writer failed is not an event: take it back if we can.
            try:
                (directory / EVENT_FILE).unlink(missing_ok=True)
            except OSError as cleanup:
                exc.add_note(f"the unconfirmed event file could not be removed: {cleanup}")
            raise JournalError(
                f"event {sequence} of attempt {self.attempt_id} was not published: {exc}",
                code="journal_write_failed",
                attempt_id=self.attempt_id,
                sequence=sequence,
            ) from exc
        digest = hashlib.sha256(data).hexdigest()
        self.sequence = sequence
        self.last_sha256 = digest
        return JournalEvent(sequence, document, digest, directory / EVENT_FILE)

    def _clear_the_way(self) -> dict[str, Any] | None:
        """Repair what an earlier publication of the next sequence left; say what it was."""
        sequence = self.sequence + 1
        directory = self.events_dir / f"{sequence:06d}"
        if not os.path.lexists(directory):
            return None
        if os.path.lexists(directory / EVENT_FILE):
            # Written completely and linked, but its writer could not confirm it (the
            # take-back failed too). If it verifies it is an event like any other.
            events = read_events(self.attempt_dir)
            if not events or events[-1].sequence != sequence:
                raise JournalError(
                    f"{directory} is neither an event nor a torn publication",
                    code="journal_diverged",
                    event=str(directory),
                )
            self.sequence, self.last_sha256 = sequence, events[-1].sha256
            return {"adopted_unconfirmed_event": sequence}
        found = {p.name: p.stat().st_size for p in sorted(directory.iterdir())}
        torn = self.attempt_dir / TORN_DIR
        torn.mkdir(mode=0o700, exist_ok=True)
        target = torn / f"{sequence:06d}"
        n = 1
        while os.path.lexists(target):
            n += 1
            target = torn / f"{sequence:06d}.{n}"
        os.rename(directory, target)
        fsync_directory(torn)
        fsync_directory(self.events_dir)
        return {
            "torn_publication": {
                "sequence": sequence,
                "found": found,
                "moved_to": f"{TORN_DIR}/{target.name}",
            }
        }


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
        if not _SEQUENCE.match(name) or int(name) != expected:
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
        try:
            document = canonical_json.loads(data, what=str(path))
        except JournalError:
            raise
        except Exception as exc:
            raise JournalError(
                f"{path}: {exc}", code="journal_noncanonical", event=str(path)
            ) from exc
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
