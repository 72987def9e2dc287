"""The shape of one table's run, shared by the refresh and the rollback.

A run is one attempt for one table in named, timed phases. It never raises a
:class:`DponeError`: its report names the phase that failed and carries the error.
Both runs end in the same ``publish`` step and name the same ``dpone snapshot``
commands for what a cut-short publication leaves.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from dpone.connectors.http_connections import POOL
from dpone.contracts.composition_snapshot import SnapshotState
from dpone.errors import DponeError, StateError, interruption_signal
from dpone.project.config import Project, TableConfig
from dpone.publication.composition import (
    PublicationComponents,
    PublicationConfig,
    build_publication,
)
from dpone.publication.sharing.run_sharing import RunSharing

REQUEST_SECONDS = 60.0


@dataclass
class RunReport:
    """What one table's run did, for people (text) and programs (``to_dict``)."""

    table: str
    target: str
    attempt_id: str
    ok: bool = False
    # published, not_published, failed, skipped, or how a cut-short publication ended
    outcome: str = "failed"
    phase: str | None = None  # the phase that failed
    rows: int | None = None
    journal: str | None = None
    intent_sha256: str | None = None
    state: str | None = None
    revision: int | None = None
    target_uuid_before: str | None = None
    target_uuid_after: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    # Per phase: HTTP requests sent and new connections opened by this process meanwhile
    # (one table per process: the table's own; with tables run side by side in one
    # process, the phase's share of them all).
    traffic: dict[str, dict[str, int]] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    next_commands: list[str] = field(default_factory=list)
    # The signal that stopped the run (SIGINT, SIGTERM, SIGHUP), and what it left then:
    # each item as `dpone status` names it, with the command that resolves it.
    interrupted: str | None = None
    left_behind: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Every field; timings rounded to the millisecond, lists copied."""
        document: dict[str, Any] = {}
        for member in fields(self):
            value = getattr(self, member.name)
            document[member.name] = list(value) if isinstance(value, list) else value
        document["timings"] = {k: round(v, 3) for k, v in self.timings.items()}
        return document


# Every run begins with it: the phase a report names when nothing had begun.
FIRST_PHASE = "check"


class Phases:
    """Times each phase, counts its requests and remembers which one is running."""

    def __init__(
        self, timings: dict[str, float], traffic: dict[str, dict[str, int]] | None = None
    ) -> None:
        self.timings = timings
        self.traffic = {} if traffic is None else traffic
        self.current: str | None = None
        self.last: str | None = None  # the last phase begun, running or done

    @property
    def reported(self) -> str:
        """The phase a report names: the running one, else the last one begun (a
        signal between two phases), else the first (nothing begun yet)."""
        return self.current or self.last or FIRST_PHASE

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.current = self.last = name
        started, sent = time.monotonic(), POOL.thread_traffic()
        try:
            yield
        finally:
            self.timings[name] = time.monotonic() - started
            self.traffic[name] = POOL.thread_traffic().since(sent).to_dict()
        self.current = None


R = TypeVar("R", bound=RunReport)


def run_phases(
    report: R,
    run: Callable[[R, Phases], None],
    failed: Callable[[R, DponeError], None] | None = None,
    interrupted: Callable[[R], None] | None = None,
) -> R:
    """``run`` the phases into ``report``; a :class:`DponeError` ends up in the report.

    ``failed`` sees the report once the failed phase and the error are in it. A signal
    (Ctrl-C, SIGTERM, SIGHUP) ends the run too, after the phase's own cleanup ran on
    the way out: the report names the signal and the phase (``interrupted``), and
    ``interrupted`` then accounts for what the run left. A second signal during that
    account cuts it short, never the report. The caller stops after such a report.
    """
    phase = Phases(report.timings, report.traffic)
    try:
        run(report, phase)
    except DponeError as exc:
        report.phase = phase.reported
        report.error = exc.to_dict()
        if failed is not None:
            failed(report, exc)
    except BaseException as exc:
        signum = interruption_signal(exc)
        if signum is None:
            raise
        report.phase, report.interrupted = phase.reported, signum.name
        if not report.ok:
            report.outcome = "interrupted"
        details: dict[str, Any] = {"signal": signum.name, "phase": phase.reported}
        when = f"during {phase.current}" if phase.current else f"after {phase.last}"
        report.error = {
            "code": "interrupted",
            "message": f"stopped by {signum.name} "
            + (when if phase.last else f"before {FIRST_PHASE}"),
            "details": details,
        }
        if interrupted is not None:
            try:
                interrupted(report)
            except BaseException as cut:  # a second signal, or a read that failed
                cut_by = interruption_signal(cut)
                if cut_by is None and not isinstance(cut, Exception):
                    raise
                details["account_cut"] = cut_by.name if cut_by else type(cut).__name__
    return report


def publication_for(
    project: Project,
    table: TableConfig,
    *,
    claim_ownership: bool = True,
    sharing: RunSharing | None = None,
    pool_claimed: bool = False,
) -> PublicationComponents:
    """The publisher, store and issuer that publish into ``table``'s database
    (``claim_ownership=False``: a read-only check, which makes no ownership marker;
    ``sharing``: the run's, when its tables go in threads; ``pool_claimed``: the
    caller's claim of the pool for the project's store has just read its marker)."""
    return build_publication(
        PublicationConfig(
            project.clickhouse.data_dir,
            project.store,
            table.limits,
            remote=project.clickhouse.remote,
            pool=project.clickhouse.access.pool,
            project=project.path,
            claim_ownership=claim_ownership,
            session_timeout_seconds=project.publication.session_timeout_seconds,
            session_margin_seconds=project.publication.session_margin_seconds,
            accept_ungated_ingest=project.publication.accept_ungated_ingest,
            sharing=sharing,
            pool_claimed=pool_claimed,
        ),
        table.database,
    )


@dataclass(frozen=True)
class PublishStep:
    """The ``publish`` phase of one kind of run, and how it reports an unfinished end."""

    what: str  # what the error message calls the publication
    error: type[StateError]
    # The states in which `dpone snapshot reconcile` is named as the next command.
    reconcile_in: frozenset[SnapshotState]

    def run(self, project: Project, parts: PublicationComponents, report: RunReport) -> None:
        """Publish the report's PREPARED intent; raise ``error`` unless it ends PUBLISHED."""
        assert report.intent_sha256 is not None
        published = parts.publisher.publish(report.intent_sha256)
        report.state, report.revision = published.state.value, published.revision
        report.target_uuid_after = published.target_uuid
        if published.state is SnapshotState.PUBLISHED:
            report.ok, report.outcome = True, "published"
            return
        report.outcome = published.state.value.lower()
        if published.state in self.reconcile_in:
            report.next_commands = [snapshot_command(project, "reconcile", report.intent_sha256)]
        raise self.error(
            f"the {self.what} ended {published.state.value} at revision "
            f"{published.revision}; the target is as the record says",
            code=f"publication_{published.state.value.lower()}",
            intent_sha256=report.intent_sha256,
        )


def snapshot_command(project: Project, verb: str, intent_sha256: str) -> str:
    """The ``dpone snapshot VERB`` command line for one of the project's intents."""
    return shlex.join(
        [
            "dpone",
            "snapshot",
            verb,
            intent_sha256,
            "--store",
            str(project.store),
            *project.server_arguments(),
        ]
    )
