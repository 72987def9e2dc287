"""What an interrupted run left, and the command that resolves each piece.

A refresh or rollback stopped by Ctrl-C, SIGTERM or SIGHUP runs its phase's own cleanup,
then ends what it still holds (a PREPARED intent cancelled, a claimed one reconciled, a
generation nothing will publish discarded); a second signal cuts that short. What
remains is read back, not guessed: the store says how far the run's intent got, and
:func:`~dpone.project.status.project_status` names each leftover of this run with the
one command that resolves it, exactly as ``dpone status`` does. See docs/cli.md
(``dpone refresh``) and docs/operations.md.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from dpone.contracts.composition_snapshot import SnapshotIntent, SnapshotState
from dpone.errors import DponeError, interruption_signal
from dpone.project.config import Project, TableConfig
from dpone.project.status import project_status
from dpone.project.table_run import RunReport
from dpone.publication.composition import PublicationComponents
from dpone.publication.store import open_store, store_exists


def account_for_interruption(
    project: Project,
    table: TableConfig,
    report: RunReport,
    verb: str,
    settle: Callable[[RunReport], object] | None = None,
) -> None:
    """Fill ``left_behind`` and ``next_commands`` of an interrupted run's report.

    ``verb`` is the command that runs it again (``refresh`` or ``rollback``).
    ``settle`` first ends what the run still holds (see :func:`settle_intent`); a
    second signal or a failure there only leaves more for the commands named.
    """
    _read_intent(project, report)
    assert report.error is not None
    details = report.error["details"]
    if settle is not None:
        try:
            settle(report)
        except DponeError as exc:
            details["settle_failed"] = exc.code
        except BaseException as cut:
            signum = interruption_signal(cut)
            if signum is None:
                raise
            details["settle_cut"] = signum.name
        _read_intent(project, report)
    try:
        status = project_status(project)
    except DponeError as exc:  # the server went away too: status will say more later
        report.next_commands = [shlex.join(["dpone", "status", "--config", str(project.path)])]
        details["status_unreadable"] = exc.code
        return
    mine = [item for item in status.needs_person if _belongs(item, report)]
    report.left_behind = mine
    commands = [str(item["command"]) for item in mine if item.get("command")]
    if not commands and not mine and not report.ok:
        commands = [shlex.join(["dpone", verb, table.name, "--config", str(project.path)])]
    report.next_commands = list(dict.fromkeys(commands))


def settle_intent(parts: PublicationComponents, report: RunReport) -> SnapshotState | None:
    """Decide the run's intent now: PREPARED is cancelled (nothing was sent), a claimed
    one is reconciled from what the server shows (its EXCHANGE may have run). The
    state it ends in, or None without an intent."""
    if report.intent_sha256 is None or report.state is None:
        return None
    state = SnapshotState(report.state)
    if state is SnapshotState.PREPARED:
        state = parts.publisher.cancel(report.intent_sha256).state
    elif state in (SnapshotState.EXCHANGE_INTENT, SnapshotState.COMMIT_UNKNOWN):
        state = parts.publisher.reconcile(report.intent_sha256).state
    return state


def nothing_will_publish(state: SnapshotState | None) -> bool:
    """Whether a run's generation may be let go once its intent reached ``state``.

    Only without an intent or with NOT_PUBLISHED (nothing was sent, or the EXCHANGE is
    proven not to have run). PUBLISHED made it the target; EXCHANGE_INTENT or
    COMMIT_UNKNOWN (a closure that could not be proven) may still be published by an
    EXCHANGE in flight, so it stays for the reconcile that decides it.
    """
    return state is None or state is SnapshotState.NOT_PUBLISHED


def _read_intent(project: Project, report: RunReport) -> None:
    """The run's intent as the store has it now (a prepare cut short may have stored it)."""
    if not store_exists(project.store):
        return
    store = open_store(project.store, create=False)
    for summary in store.list_snapshots():
        intent = SnapshotIntent.from_bytes(summary.intent_bytes)
        if intent.attempt_id != report.attempt_id:
            continue
        report.intent_sha256 = summary.intent_sha256
        report.state, report.revision = summary.state, summary.revision
        report.target_uuid_before = intent.target_uuid
        if summary.state == SnapshotState.PUBLISHED.value:
            # The EXCHANGE ran and was reconciled before the signal: the target is new.
            report.ok, report.outcome = True, "published"
            report.target_uuid_after = intent.generation_uuid


def _belongs(item: dict[str, Any], report: RunReport) -> bool:
    if item.get("attempt_id") == report.attempt_id:
        return True
    if report.intent_sha256 is not None and item.get("intent_sha256") == report.intent_sha256:
        return True
    # An unfinished drop of a rollback copy is the retention's, which names no target.
    return report.phase == "retention" and item.get("kind") == "retention_unfinished"
