"""Ingest leases of staging attempts: closed when the attempt is done with them.

A staging attempt of ``dpone stage`` holds an ingest lease of the publication pool
(in the store). Whatever ends it (success keeps the lease for ``prepare``), the lease
is closed (its closure proven quiescent and stored) by the step that is done with
the principal: a failed or stopped stage on its way out, ``attempts cleanup``,
``discard`` and ``archive``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpone.errors import DponeError, StateError
from dpone.localserver.principal_pool import ROLE_INGEST
from dpone.project.leases import GONE, close_lease, close_lease_command, judge_leases
from dpone.project.server import server_access
from dpone.publication.composition import DEFAULT_STORE, PublicationConfig, build_publication
from dpone.publication.principals.server_access import ServerAccess
from dpone.publication.store import StoreLocation, open_store, store_exists


def store_given(store_path: StoreLocation) -> StoreLocation | None:
    """``store_path`` when it is not the default store (commands then repeat it)."""
    return None if store_path == DEFAULT_STORE else store_path


def lease_ids(store_path: StoreLocation, attempt_id: str) -> set[str]:
    """Ids of every lease the store has issued to ``attempt_id`` (none without a store)."""
    if not store_exists(store_path):
        return set()
    store = open_store(store_path, create=False)
    return {lease.lease_id for lease in store.leases_of(attempt_id)}


def release_ingest_leases(
    store_path: StoreLocation,
    attempt_id: str,
    server: Mapping[str, object],
    database: str,
    only: str | None = None,
) -> list[str]:
    """Close the active ingest leases of ``attempt_id`` (or just ``only``); their ids.

    On the managed server each is closed as ``prepare`` closes it, and the proof is
    stored: a pool user whose last lease ended without a proven closure may not hold a
    write grant on a publication's tables (``writer_grant``). Where no closure can run
    (another server, no pool), the lease is only ended (:func:`end_ingest_leases`).
    """
    if not store_exists(store_path):
        return []
    store = open_store(store_path, create=False)
    mine = [lease for lease in store.leases_of(attempt_id) if only in (None, lease.lease_id)]
    # An ended lease whose closure was never proven (an interrupted stage, an operator's
    # end-lease) is closed too: until then its user blocks prepare as a writer.
    active = [
        lease.lease_id
        for lease in mine
        if lease.active or (lease.role == ROLE_INGEST and not store.closure_proven(lease))
    ]
    if not active or server.get("host") is not None:
        return end_ingest_leases(store_path, attempt_id, only)
    given = server.get("project_config")
    access = server_access(
        Path(str(server["data_dir"])), None if given is None else Path(str(given))
    )
    config = PublicationConfig(
        access.data_dir, store_path, create_store=False, remote=access.remote, pool=access.pool
    )
    parts = build_publication(config, database)
    for lease_id in active:
        close_lease(parts, lease_id)
    return active


def end_ingest_leases(
    store_path: StoreLocation, attempt_id: str, only: str | None = None
) -> list[str]:
    """End the active ingest leases of ``attempt_id`` (or just ``only``); their ids.

    A staged table that will never be published needs no principal: without this its
    lease stays active and the pool runs out (``pool_exhausted``). A store that does
    not exist holds no lease (and is not created).
    """
    if not store_exists(store_path):
        return []
    store = open_store(store_path, create=False)
    ended = []
    for lease in store.leases_of(attempt_id):
        if lease.active and only in (None, lease.lease_id):
            store.end_lease(lease.lease_id)
            ended.append(lease.lease_id)
    return ended


def release_after_failure(
    exc: BaseException,
    store_path: StoreLocation,
    attempt_id: str,
    lease_id: str,
    server: Mapping[str, object],
    database: str,
) -> dict[str, Any]:
    """A failed or stopped stage publishes nothing: its lease is closed, or at least ended.

    Closed as ``dpone refresh`` closes it on the way out, also after Ctrl-C or
    SIGTERM: the closure proves the principal quiescent in a moment, and the pool gets
    its user back. When the closure cannot run or fails (or a second signal cuts it),
    the lease is only ended; each failure is a note on the primary error. Returns what
    became of the lease (:func:`lease_outcome`).
    """
    try:
        release_ingest_leases(store_path, attempt_id, server, database, only=lease_id)
    except BaseException as close_exc:  # a second Ctrl-C too: the lease is ended below
        exc.add_note(f"the ingest lease {lease_id} could not be closed: {close_exc!r}")
        try:
            end_ingest_leases(store_path, attempt_id, only=lease_id)
        except (DponeError, OSError) as store_exc:
            exc.add_note(f"the ingest lease {lease_id} could not be ended: {store_exc}")
    return lease_outcome(store_path, lease_id, server)


def lease_outcome(
    store_path: StoreLocation, lease_id: str, server: Mapping[str, object]
) -> dict[str, Any]:
    """The lease as the store has it now: ``closed`` (ended, closure proven),
    ``closure_unproven`` (ended only) or ``active``, with the command that closes it."""
    try:
        store = open_store(store_path, create=False)
        lease = store.get_lease(lease_id)
        proven = store.closure_proven(lease)
    except (DponeError, OSError) as exc:
        return {"lease_id": lease_id, "state": "unknown", "error": str(exc), "command": None}
    state = "active" if lease.active else "closed" if proven else "closure_unproven"
    data_dir, config = server.get("data_dir"), server.get("project_config")
    command = None
    if state != "closed":
        # The server the stage reached: a project's remote one by its project file.
        reach: Path | list[str] | None = None
        if config is not None:
            reach = ["--config", str(config)]
        elif data_dir is not None:
            reach = Path(str(data_dir))
        command = close_lease_command(lease_id, store_path, reach)
    return {"lease_id": lease_id, "user": lease.user, "state": state, "command": command}


def close_abandoned_leases(
    store_path: StoreLocation, attempt_id: str, work_dir: Path, access: ServerAccess
) -> list[str]:
    """Close, with a stored proof, the leases of an eventless attempt; their ids.

    Those still active or ended without a proven closure (the stage took its lease
    before the journal existed). An active one is closed only when its holder process
    is proven gone. Raises ``closure_unproven`` when a proof is missing: the lease
    stays listed, and the command can run again.
    """
    if not store_exists(store_path):
        return []
    store = open_store(store_path, create=False)
    mine = [
        lease
        for lease in store.leases_of(attempt_id)
        if lease.active or (lease.role == ROLE_INGEST and not store.closure_proven(lease))
    ]
    if not mine:
        return []
    verdicts = {v.lease_id: v for v in judge_leases(store, [work_dir])}
    for lease in mine:
        verdict = verdicts.get(lease.lease_id)
        if lease.active and (verdict is None or verdict.holder != GONE):
            holder = "unknown" if verdict is None else verdict.holder
            raise StateError(
                f"the ingest lease {lease.lease_id} of attempt {attempt_id} ({lease.user}) "
                f"is held by a process not proven gone: "
                f"{verdict.reason if verdict else 'no verdict'}; nothing done",
                code=f"lease_holder_{holder}",
                lease_id=lease.lease_id,
                evidence=verdict.evidence if verdict else {},
            )
    parts = build_publication(
        PublicationConfig(
            access.data_dir, store_path, create_store=False, remote=access.remote, pool=access.pool
        ),
        "system",
    )
    for lease in mine:
        proof = close_lease(parts, lease.lease_id)
        if not proof.proven:
            unproven = list(proof.facts.get("unproven", []))
            raise StateError(
                f"the closure of the ingest lease {lease.lease_id} ({lease.user}) of attempt "
                f"{attempt_id} is not proven: {', '.join(unproven) or 'unknown'}; nothing was "
                "archived: run the command again once that is settled",
                code="closure_unproven",
                lease_id=lease.lease_id,
                unproven=unproven,
            )
    return [lease.lease_id for lease in mine]
