"""``dpone snapshot``: prepare, publish, reconcile, cancel and show a publication;
list the pool's leases and end one whose holder is gone.

Thin over :mod:`dpone.publication.composition` (and
:mod:`dpone.project.leases`): each command parses, calls one publisher method
and prints one answer. Only ``prepare`` may create the store; every other command
needs it to exist (``store_missing``). Every JSON answer carries ``state`` and
``revision``; a publication that did not reach PUBLISHED exits 1 and names the
command that finishes it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from dpone.cli.connection import project_server_option
from dpone.cli.output import emit_json, json_option, reported_errors
from dpone.cli.server import data_dir_option
from dpone.cli.staging_options import STORE
from dpone.contracts.composition_snapshot import (
    TERMINAL,
    SnapshotIntent,
    SnapshotRecord,
    SnapshotState,
)
from dpone.errors import ConfigurationError, StateError
from dpone.ports.composition_snapshot import AttemptRef, HistoryEntry, TargetSlot
from dpone.project.leases import (
    GONE,
    close_lease,
    close_lease_command,
    end_gone_lease,
    end_lease_command,
    judge_leases,
    unproven_closures,
)
from dpone.project.server import server_access
from dpone.publication.composition import (
    DEFAULT_STORE,
    PublicationConfig,
    build_publication,
    check_ownership,
    claim_slots,
)
from dpone.publication.publisher import PublicationReceipt
from dpone.publication.publisher.abandon import Abandonment
from dpone.publication.publisher.receipts import historical_receipt
from dpone.publication.store import StoreLocation, open_store
from dpone.staging.journal import read_events

_SHA256 = re.compile(r"^[0-9a-f]{64}$")

store_option = click.option(
    "--store",
    "store_path",
    type=STORE,
    default=DEFAULT_STORE,
    show_default=True,
    help="The publication store: records, history, admissions, leases (a SQLite file, "
    "or postgresql://USER@HOST:PORT/DB).",
)


def _intent_argument(value: str) -> str:
    if not _SHA256.fullmatch(value):
        raise ConfigurationError(
            "INTENT must be the 64 lowercase hex digits `dpone snapshot prepare` printed",
            code="invalid_intent_id",
        )
    return value


def _target(value: str) -> TargetSlot:
    database, dot, table = value.partition(".")
    if not dot or not database or not table or "." in table:
        raise ConfigurationError(
            f"--target {value!r} must be DATABASE.TABLE", code="invalid_target", target=value
        )
    return TargetSlot(database, table)


def _answer(receipt: PublicationReceipt, as_json: bool, verb: str) -> None:
    """Print the receipt; exit 1 when the publication is not (or not known to be) done."""
    document = receipt.to_document()
    state = receipt.state
    finished = state is SnapshotState.PUBLISHED or (
        verb in ("prepare", "show", "cancel")
        and state in (SnapshotState.PREPARED, SnapshotState.NOT_PUBLISHED)
    )
    next_command = _next_command(state, receipt.intent_sha256)
    if as_json:
        payload: dict[str, Any] = {"ok": finished, **document}
        if next_command:
            payload["next_command"] = next_command
        if not finished:
            payload["error"] = {
                "code": state.value,
                "message": f"the publication is {state.value} at revision {receipt.revision}",
                "details": {"intent_sha256": receipt.intent_sha256},
            }
        emit_json(payload)
    else:
        click.echo(f"intent {receipt.intent_sha256}")
        click.echo(
            f"state {state.value} (revision {receipt.revision})"
            + (" [historical replay]" if receipt.historical else "")
        )
        if receipt.target_uuid is not None:
            click.echo(
                f"target uuid {receipt.target_uuid}, generation-name uuid "
                f"{receipt.generation_uuid}, rows {receipt.target_rows}"
            )
        if next_command:
            click.echo(f"next: {next_command}")
    if not finished:
        raise SystemExit(1)


def _next_command(state: SnapshotState, intent: str) -> str | None:
    if state is SnapshotState.PREPARED:
        return f"dpone snapshot publish {intent}"
    if state in (SnapshotState.EXCHANGE_INTENT, SnapshotState.COMMIT_UNKNOWN):
        return f"dpone snapshot reconcile {intent}"
    return None


@click.group()
def snapshot() -> None:
    """Publish a staged generation into its target with one atomic EXCHANGE."""


@snapshot.command()
@click.option(
    "--journal",
    "journal_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="The staging attempt's directory (its journal ends in `staged`).",
)
@click.option("--target", required=True, help="The protected target: DATABASE.TABLE.")
@click.option(
    "--generation",
    "generation_ref",
    help="The journal head `dpone stage` printed (default: the journal's final event).",
)
@click.option(
    "--accept-ungated-ingest",
    is_flag=True,
    help="Publish a generation staged without a drain gate (the client transport): its "
    "closure rests on process samples and the query log alone.",
)
@store_option
@data_dir_option
@project_server_option
@json_option
def prepare(
    journal_dir: Path,
    target: str,
    generation_ref: str | None,
    accept_ungated_ingest: bool,
    store_path: StoreLocation,
    data_dir: Path,
    project_config: Path | None,
    as_json: bool,
) -> None:
    """Reopen a staged attempt's evidence and record a PREPARED publication intent."""
    with reported_errors(as_json):
        slot = _target(target)
        if generation_ref is None:
            events = read_events(journal_dir)
            if not events:
                raise StateError(f"journal {journal_dir} has no events", code="evidence_unverified")
            generation_ref = events[-1].sha256
        access = server_access(data_dir, project_config)
        config = PublicationConfig(
            access.data_dir,
            store_path,
            remote=access.remote,
            pool=access.pool,
            accept_ungated_ingest=accept_ungated_ingest,
            project=project_config,
        )
        parts = build_publication(config, slot.database)
        # The slot's owner, before the publisher leases or claims anything for it.
        claim_slots(access, parts.store, [slot], project=project_config)
        receipt = parts.publisher.prepare(AttemptRef(journal_dir, slot), generation_ref)
        _answer(receipt, as_json, "prepare")


def _call(
    verb: str,
    intent: str,
    store_path: StoreLocation,
    data_dir: Path,
    as_json: bool,
    project_config: Path | None = None,
) -> None:
    with reported_errors(as_json):
        intent = _intent_argument(intent)
        # One read of the store (``store_missing`` when it is not there) serves both the
        # replay and the choice of the database to publish into.
        stored = open_store(store_path, create=False).load(intent)
        record = SnapshotRecord.from_bytes(stored.record_bytes)
        if verb == "publish" and record.state in TERMINAL:
            # Replay of a decided publication: the store alone answers it, so it needs
            # no running server (reconcile and cancel still need authority).
            _answer(historical_receipt(record), as_json, verb)
            return
        loaded = SnapshotIntent.from_bytes(stored.intent_bytes)
        database = loaded.database
        access = server_access(data_dir, project_config)
        # Another store's target: refused before anything is closed or sent.
        slot = TargetSlot(loaded.database, loaded.target_table)
        check_ownership(access, store_path, [slot], project=project_config)
        config = PublicationConfig(
            access.data_dir, store_path, create_store=False, remote=access.remote, pool=access.pool
        )
        publisher = build_publication(config, database).publisher
        if verb == "abandon":
            _abandoned(publisher.abandon(intent), as_json)
            return
        calls = {
            "publish": publisher.publish,
            "reconcile": publisher.reconcile,
            "cancel": publisher.cancel,
        }
        _answer(calls[verb](intent), as_json, verb)


def _intent_verb(func: Callable[..., None]) -> click.Command:
    """A ``snapshot`` command on one stored INTENT, with ``--store``, ``--data-dir``, ``--json``.

    The one argument and option set of ``publish``, ``reconcile``, ``cancel`` and
    ``abandon``.
    """
    return snapshot.command()(
        click.argument("intent")(
            store_option(data_dir_option(project_server_option(json_option(func))))
        )
    )


@_intent_verb
def publish(
    intent: str,
    store_path: StoreLocation,
    data_dir: Path,
    as_json: bool,
    project_config: Path | None,
) -> None:
    """Claim once, dispatch at most one EXCHANGE, then reconcile."""
    _call("publish", intent, store_path, data_dir, as_json, project_config)


@_intent_verb
def reconcile(
    intent: str,
    store_path: StoreLocation,
    data_dir: Path,
    as_json: bool,
    project_config: Path | None,
) -> None:
    """Close the publisher and decide the outcome from what the server shows."""
    _call("reconcile", intent, store_path, data_dir, as_json, project_config)


@_intent_verb
def cancel(
    intent: str,
    store_path: StoreLocation,
    data_dir: Path,
    as_json: bool,
    project_config: Path | None,
) -> None:
    """Cancel a PREPARED publication (NOT_PUBLISHED at revision 2); nothing is sent."""
    _call("cancel", intent, store_path, data_dir, as_json, project_config)


@_intent_verb
def abandon(
    intent: str,
    store_path: StoreLocation,
    data_dir: Path,
    as_json: bool,
    project_config: Path | None,
) -> None:
    """Free the target of a publication whose database was dropped on this server.

    Its tables went with the database, so no outcome can be proven: the record ends
    (or stays) commit_unknown with its publisher closed, and a note in the store stops
    it from blocking the target. Refused unless the database and both tables are
    proven gone from the server the publication was staged on.
    """
    _call("abandon", intent, store_path, data_dir, as_json, project_config)


def _abandoned(done: Abandonment, as_json: bool) -> None:
    if as_json:
        emit_json({"ok": True, **done.to_document()})
        return
    click.echo(f"intent {done.intent_sha256}")
    click.echo(
        f"state {done.state.value} (revision {done.revision}), abandoned at {done.note.at}"
        + (" [earlier]" if done.historical else "")
    )
    click.echo("its database was dropped: the target is free for a new publication")


@snapshot.command()
@click.argument("intent")
@store_option
@json_option
def show(intent: str, store_path: StoreLocation, as_json: bool) -> None:
    """State, revision, history, UUID pair, counts and digests of one publication."""
    with reported_errors(as_json):
        intent = _intent_argument(intent)
        store = open_store(store_path, create=False)
        stored = store.load(intent)
        parsed = SnapshotIntent.from_bytes(stored.intent_bytes)
        record = SnapshotRecord.from_bytes(stored.record_bytes)
        history = store.history(intent)
        document: dict[str, Any] = {
            "intent_sha256": intent,
            "state": record.state.value,
            "revision": record.revision,
            "target": f"{parsed.database}.{parsed.target_table}",
            "generation": parsed.generation_table,
            "a_uuid": parsed.target_uuid,
            "b_uuid": parsed.generation_uuid,
            "source_rows": parsed.source_rows,
            "content_digest": parsed.content_digest,
            "record": record.to_document(),
            "history": [_history_entry(h) for h in history],
        }
        if as_json:
            emit_json({"ok": True, **document})
            return
        click.echo(f"intent {intent}: {record.state.value} (revision {record.revision})")
        click.echo(f"target {document['target']}, generation {parsed.generation_table}")
        click.echo(f"A {parsed.target_uuid}  B {parsed.generation_uuid}")
        click.echo(f"rows {parsed.source_rows}, content digest {parsed.content_digest}")
        for h in history:
            click.echo(f"  #{h.sequence} {h.at} {h.state}@{h.revision} {dict(h.facts)}")


@snapshot.command()
@click.argument("intent")
@store_option
@json_option
def verify(intent: str, store_path: StoreLocation, as_json: bool) -> None:
    """Re-verify one publication's record chain from the exact bytes its history keeps.

    Exit 0 when every revision's bytes hash to their digest, name the revision before
    them and follow the state table, and the last is the current record; otherwise
    ``history_unverified`` names each problem.
    """
    with reported_errors(as_json):
        intent = _intent_argument(intent)
        check = open_store(store_path, create=False).verify_chain(intent)
        if not check.verified:
            unverifiable = [f"revision {n} has no kept bytes" for n in check.unverifiable]
            raise StateError(
                f"the record chain of {intent} does not verify from its bytes: "
                + "; ".join([*check.problems, *unverifiable]),
                code="history_unverified",
                **check.to_dict(),
            )
        if as_json:
            emit_json({"ok": True, **check.to_dict()})
            return
        click.echo(f"intent {intent}: {check.revisions} revisions verified from their bytes")


def _history_entry(entry: HistoryEntry) -> dict[str, Any]:
    return {
        "sequence": entry.sequence,
        "revision": entry.revision,
        "state": entry.state,
        "record_sha256": entry.record_sha256,
        "at": entry.at,
        "facts": dict(entry.facts),
    }


journal_dirs_option = click.option(
    "--work-dir",
    "journal_dirs",
    multiple=True,
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="A directory of attempt journals (repeatable): a project's WORK/attempts and "
    "WORK/rollbacks, or the --work-dir given to `dpone stage`.",
)


@snapshot.command("leases")
@store_option
@journal_dirs_option
@data_dir_option
@json_option
def leases(
    store_path: StoreLocation, journal_dirs: tuple[Path, ...], data_dir: Path, as_json: bool
) -> None:
    """Every active lease of the principal pool and whether its holder is gone.

    A lease whose holder is gone (proven from the store, the journals and the kernel)
    is listed with the `dpone snapshot end-lease` command that ends it. Exit 0 when no
    lease is abandoned, 1 otherwise.
    """
    with reported_errors(as_json):
        verdicts = judge_leases(open_store(store_path, create=False), journal_dirs)
        found = []
        for verdict in verdicts:
            entry = verdict.to_dict()
            if verdict.holder == GONE:
                entry["command"] = end_lease_command(verdict.lease_id, store_path, journal_dirs)
            found.append(entry)
        abandoned = [e for e in found if e["holder"] == GONE]
        unproven = [
            {
                "lease_id": r.lease.lease_id,
                "user": r.lease.user,
                "role": r.lease.role,
                "attempt_id": r.lease.attempt_id,
                "ended_at": r.ended_at,
                "command": close_lease_command(r.lease.lease_id, store_path, data_dir),
            }
            for r in unproven_closures(open_store(store_path, create=False))
        ]
        if as_json:
            emit_json({"ok": not abandoned and not unproven, "leases": found, "unproven": unproven})
        else:
            if not found:
                click.echo("no active lease")
            for u in unproven:
                click.echo(
                    f"{u['lease_id']} {u['user']} ({u['role']}, attempt {u['attempt_id']}) ended "
                    f"{u['ended_at']} without a proven closure: it blocks prepare of what it "
                    f"can write\n  run: {u['command']}"
                )
            for e in found:
                click.echo(
                    f"{e['lease_id']} {e['user']} ({e['role']}, attempt {e['attempt_id']}, "
                    f"issued {e['issued_at']}): holder {e['holder']}, {e['reason']}"
                )
                if e.get("command"):
                    click.echo(f"  run: {e['command']}")
        if abandoned or unproven:
            raise SystemExit(1)


@snapshot.command("close-lease")
@click.argument("lease_id")
@store_option
@data_dir_option
@project_server_option
@json_option
def close_lease_verb(
    lease_id: str,
    store_path: StoreLocation,
    data_dir: Path,
    project_config: Path | None,
    as_json: bool,
) -> None:
    """Prove LEASE_ID's pool user closed and quiescent, and store the proof.

    Ends the lease if it is active, stops the lease's own queries, waits out its
    drain-gate sessions and accounts for its queries in the query log. A proven closure
    lets the user hold write grants on publications again (exit 0); an unproven one is
    stored too and named (exit 1, ``closure_unproven`` with what was not proven).
    """
    with reported_errors(as_json):
        store = open_store(store_path, create=False)
        lease = store.get_lease(lease_id)
        access = server_access(data_dir, project_config)
        parts = build_publication(
            PublicationConfig(
                access.data_dir,
                store_path,
                create_store=False,
                remote=access.remote,
                pool=access.pool,
            ),
            "system",
        )
        proof = close_lease(parts, lease_id)
        unproven = list(proof.facts.get("unproven", []))
        if not proof.proven:
            raise StateError(
                f"the closure of lease {lease_id} ({lease.user}) is not proven: "
                f"{', '.join(unproven) or 'unknown'}; run the command again once that is settled",
                code="closure_unproven",
                lease_id=lease_id,
                user=lease.user,
                unproven=unproven,
            )
        payload = {"ok": True, "lease_id": lease_id, "user": lease.user, "proven": True}
        if as_json:
            emit_json(payload)
        else:
            click.echo(f"lease {lease_id} of {lease.user}: closure proven and stored")


@snapshot.command("end-lease")
@click.argument("lease_id")
@store_option
@journal_dirs_option
@json_option
def end_lease(
    lease_id: str, store_path: StoreLocation, journal_dirs: tuple[Path, ...], as_json: bool
) -> None:
    """End LEASE_ID, only when its holder is proven gone; recorded in the store.

    Refuses (exit 1, nothing written) with `lease_holder_live` or
    `lease_holder_unknown`; a lease that already ended is reported as such (exit 0).
    """
    with reported_errors(as_json):
        store = open_store(store_path, create=False)
        verdict, ended = end_gone_lease(store, lease_id, journal_dirs)
        lease = store.get_lease(lease_id)
        payload: dict[str, Any] = {
            "ok": True,
            "lease_id": lease_id,
            "user": lease.user,
            "role": lease.role,
            "attempt_id": lease.attempt_id,
            "active": lease.active,
            "ended_now": ended,
            "reason": None if verdict is None else verdict.reason,
            "evidence": None if verdict is None else verdict.evidence,
        }
        if as_json:
            emit_json(payload)
        elif ended:
            click.echo(f"lease {lease_id} of {lease.user} ended: {payload['reason']}")
        else:
            click.echo(f"lease {lease_id} of {lease.user} had already ended")
