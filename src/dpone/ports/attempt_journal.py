"""The attempt journal port: what the staging service may do with an attempt's journal.

The source document names it ``ClickHouseFileJournalResource``: a resource bound to one
attempt by a ``journal_factory(policy, attempt_id)``, whose capabilities are limited to
the attempt's id and directory, opening and closing it, the private spool's place,
making its entry durable and releasing it, and recording events. It cannot choose how a file is
prepared, and it cannot rewrite or skip an event: ``record`` publishes the next event
durably or raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class JournalEvent:
    """One published event: its document, canonical bytes' digest and path."""

    sequence: int
    document: dict[str, Any]
    sha256: str
    path: Path


class ClickHouseFileJournalResource(Protocol):
    """The journal of one attempt, as the staging service uses it."""

    @property
    def attempt_id(self) -> str:
        """The attempt this journal records (one path component)."""
        ...

    @property
    def attempt_dir(self) -> Path:
        """Where the attempt's journal and spool are, for the handle and for operators."""
        ...

    @property
    def spool_dir(self) -> Path:
        """Where the private spool is prepared; it must not exist before preparation.

        A path that reaches the attempt's own directory whatever its name leads to now
        (a file journal: through the directory's descriptor). Records name the spool
        by :attr:`attempt_dir` instead.
        """
        ...

    def open(self) -> None:
        """Create the attempt's storage exclusively; refuse an attempt that exists."""
        ...

    def resume(self) -> list[JournalEvent]:
        """Continue an existing, verified journal (a later actor's); its events in order."""
        ...

    def record(self, fields: Mapping[str, Any]) -> JournalEvent:
        """Publish the next event durably and return it; raise if it was not published."""
        ...

    def spool_prepared(self) -> None:
        """Make the prepared spool directory's entry durable (before an event names it);
        refuse a spool that is not where :attr:`attempt_dir` says it is."""
        ...

    def release_spool(self) -> None:
        """Remove the spool (the staged table, or a proven clean failure, needs it no more)."""
        ...

    def close(self) -> None:
        """Release what the journal holds open (the attempt ends; its files stay)."""
        ...
