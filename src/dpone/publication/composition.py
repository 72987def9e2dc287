"""The one wiring point of publication on the managed local server.

``build_publication`` assembles :class:`ClickHouseAtomicSnapshotPublisher` from the
concrete adapters: the store, the catalog (as ``dpone_catalog``, trusting only the
administrator, the catalog and the closer, and the pool as :func:`lease_allowance`
answers), the executor (as the leased publisher, over HTTP) and the authority with the
local pool issuer (closure as ``dpone_closer``). Every password comes from the managed
server's credentials file, never from the environment, and nothing is printed.
``issue_ingest`` leases the ingest principal a staging attempt runs as, and
``ingest_session_notes`` is where staging's drain gate notes its session for that
principal's closure.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_tables import staging_table_name
from dpone.contracts.composition_snapshot import (
    DEFAULT_LIMITS,
    SnapshotLimits,
)
from dpone.errors import ConfigurationError, DponeError
from dpone.localserver.control import run_admin_sql
from dpone.localserver.credentials import admin_credentials
from dpone.localserver.principal_pool import (
    DEFAULT_POOL,
    IDENTITY_DATABASE,
    ROLE_INGEST,
    ROLE_PUBLISHER,
    PoolNames,
    check_databases,
)
from dpone.ports.clickhouse_request import Credentials, Endpoint
from dpone.ports.composition_snapshot import Admission, IssuedPrincipal, Lease, TargetSlot
from dpone.publication.authority.lease_scope import lease_scope, micros
from dpone.publication.authority.snapshot_authority import ClosurePolicy, SnapshotAuthority
from dpone.publication.catalog import ClickHouseSnapshotCatalog
from dpone.publication.catalog.allowance import accounted_pool_users, lease_allowance
from dpone.publication.ceilings.retained import recorded_table_uuids, recorded_target_names
from dpone.publication.ceilings.stream_ceilings import stored_bytes_bound, stream_bytes_bound
from dpone.publication.dispatch.dispatch_gate import gate_for
from dpone.publication.dispatch.dispatch_notes import DispatchGuard
from dpone.publication.dispatch.executor import (
    SESSION_MARGIN_SECONDS,
    SESSION_TIMEOUT_SECONDS,
    ClickHouseSnapshotExecutor,
)
from dpone.publication.principals.ownership import OwnedElsewhere, Owner, claim
from dpone.publication.principals.pool_databases import as_access, pool_remedy
from dpone.publication.principals.principal_issuers import LocalPoolIssuer, observe_user_ids
from dpone.publication.principals.server_access import RemoteServer, ServerAccess
from dpone.publication.publisher import ClickHouseAtomicSnapshotPublisher
from dpone.publication.sharing.run_sharing import RunSharing
from dpone.publication.store import (
    SnapshotStore,
    StoreLocation,
    lease_step_key,
    open_store,
    store_exists,
)
from dpone.publication.store.steps import STORE_IDENTITY_KEY
from dpone.sql import quote_identifier
from dpone.staging.contract import StagingPolicy
from dpone.staging.ingest_session import SessionNotes

DEFAULT_STORE = Path(".dpone/snapshots.sqlite")
REQUEST_SECONDS = 30.0


@dataclass(frozen=True)
class PublicationConfig:
    """Where the managed server and the store are, and the publication's ceilings.

    ``create_store``: False for a command that only continues existing records
    (publish, reconcile, cancel): a missing store is then ``store_missing``, never a
    new empty one at a mistyped path. ``session_timeout_seconds`` (T) and
    ``session_margin_seconds``: the drain-gate session's timeout and the margin closure
    waits beyond it (``[publication]`` of ``dpone.toml``).
    """

    data_dir: Path
    store_path: StoreLocation = DEFAULT_STORE
    limits: SnapshotLimits = DEFAULT_LIMITS
    claim_wait_seconds: float = 30.0
    create_store: bool = True
    session_timeout_seconds: int = SESSION_TIMEOUT_SECONDS
    session_margin_seconds: float = SESSION_MARGIN_SECONDS
    # Prepare accepts an ingest closure without a drain gate (the client transport).
    accept_ungated_ingest: bool = False
    # A server dpone did not start ([clickhouse] host = ...); None: the managed one.
    remote: RemoteServer | None = None
    # The project's pool on that server ([clickhouse] pool).
    pool: PoolNames = DEFAULT_POOL
    # The project file, when the command has one: named by an ownership refusal's command.
    project: Path | None = None
    # False for a read-only check: ownership markers are read, never created.
    claim_ownership: bool = True
    # A run whose tables go in threads: their observations and closures asked at once
    # are answered together, each its own (publication/sharing/).
    sharing: RunSharing | None = None
    # The caller's own claim of the pool (and its slots) for this store read every
    # marker its own just now: the issuer does not read the pool's marker again.
    pool_claimed: bool = False

    @property
    def access(self) -> ServerAccess:
        """The server and the logins dpone uses there."""
        return ServerAccess(self.data_dir, self.remote, self.pool)


@dataclass(frozen=True)
class PublicationComponents:
    """The publisher and the parts a command may need beside it."""

    publisher: ClickHouseAtomicSnapshotPublisher
    store: SnapshotStore
    issuer: LocalPoolIssuer
    endpoint: Endpoint


def staging_policy(
    limits: SnapshotLimits,
    base: StagingPolicy | None = None,
    *,
    session_timeout_seconds: int = SESSION_TIMEOUT_SECONDS,
) -> StagingPolicy:
    """The staging bounds that enforce a publication's ceilings while data streams.

    Source rows bound the preparation's record count, source bytes every verification
    scan of the file, and the smallest of wire bytes, generation storage and total
    transient storage the spool as it is written and the INSERT body as it is sent,
    and the smallest of the two storage ceilings what the staged table holds before
    it is recorded staged (:mod:`dpone.publication.ceilings.stream_ceilings`); the final values
    are checked again at ``prepare``. The ingest drain
    gate's T is the publication's (``[publication]`` ``session_timeout_seconds``).
    """
    return dataclasses.replace(
        base or StagingPolicy(),
        max_rows=max(limits.source_rows, 1),
        max_scan_bytes=max(limits.source_bytes, 1),
        max_spool_bytes=stream_bytes_bound(limits),
        max_stored_bytes=stored_bytes_bound(limits),
        session_timeout_seconds=session_timeout_seconds,
    )


def ingest_session_notes(store_path: StoreLocation, lease_id: str) -> SessionNotes:
    """Where staging's drain gate notes its session: the ingest lease's step notes.

    Pass it as :attr:`~dpone.staging.composition.StagingConfig.session_notes` of the
    attempt staged as that lease; the closure of the lease reads them
    (:func:`~dpone.publication.authority.lease_scope.lease_scope`).
    """
    key = lease_step_key(lease_id)
    store = open_store(store_path, create=False)

    def note(facts: Mapping[str, Any]) -> None:
        store.note_step(key, facts)

    return note


def managed_endpoint(data_dir: Path, database: str) -> Endpoint:
    """The running managed server's endpoint in ``database`` (``server_not_running``)."""
    return ServerAccess(data_dir).endpoint(database)


def pool_credentials(server: ServerAccess | Path) -> dict[str, Credentials]:
    """Credentials of every pool user on the server (``pool_missing``)."""
    access = as_access(server)
    known = access.known_credentials()
    missing = [name for name in access.members_in_use() if name not in known]
    if missing:
        remedy, command = pool_remedy(access)
        raise ConfigurationError(
            f"{access.describe()} has no publication pool for {access.pool.describe()} "
            f"({', '.join(missing[:3])}...): {remedy}",
            code="pool_missing",
            missing=missing,
            next_command=command,
        )
    return known


def build_issuer(
    server: ServerAccess | Path,
    store: SnapshotStore,
    endpoint: Endpoint,
    *,
    project: Path | None = None,
    create: bool = True,
    claimed: bool = False,
) -> LocalPoolIssuer:
    """The pool issuer: credentials from the file, user ids observed by the operator.

    Nothing leases a principal without it, so it first makes sure the server records
    ``store`` as the pool's owner (``pool_owned_elsewhere``: publication/principals/ownership.py;
    ``create=False``: only refused when another store owns it), unless the caller's
    claim for ``store`` just found the pool's marker its own (``claimed``).
    """
    access = as_access(server)
    credentials = pool_credentials(access)
    if not claimed:
        claim_slots(access, store, (), project=project, create=create)
    operator = HttpTransport(endpoint, access.operator())
    in_use = access.members_in_use()  # a retired principal is never leased again
    ids = observe_user_ids(
        operator,
        in_use,
        query_id=f"dpone-s00-pool-ids-{time.time_ns()}",
        deadline=time.monotonic() + REQUEST_SECONDS,
    )
    return LocalPoolIssuer(store, credentials, ids, pool=access.pool, members=in_use)


def claim_slots(
    server: ServerAccess | Path,
    store: SnapshotStore,
    slots: Iterable[TargetSlot],
    *,
    project: Path | None = None,
    create: bool = True,
) -> bool:
    """The server records ``store`` as the owner of the pool and of ``slots``, or this
    refuses (``pool_owned_elsewhere``, ``slot_owned_elsewhere``) before anything is done.
    True when its one read found every marker already ``store``'s (see :func:`claim`)."""
    me = Owner.of_store(store)
    return claim(as_access(server), me, slots, project=project, create=create)


def check_ownership(
    server: ServerAccess | Path,
    location: StoreLocation,
    slots: Iterable[TargetSlot] = (),
    *,
    project: Path | None = None,
) -> bool:
    """Refuse when another store owns the pool or one of ``slots``; read-only: it makes
    no store and no marker (a project whose store is not made yet owns nothing). Asked
    before anything signs in as the pool's principals. True when every marker is there,
    the store's (see :func:`claim`)."""
    me = None
    if store_exists(location):
        # Opened as the publication opens it: another of the project's refreshes may be
        # creating it this very moment, and the store's own transaction settles who does.
        store = open_store(location)
        me = Owner.of_store(store)
    try:
        return claim(as_access(server), me, slots, project=project, create=False)
    except OwnedElsewhere as exc:
        owner = exc.details.get("owner") or {}
        here = location if isinstance(location, str) else str(Path(location).absolute())
        if me is not None or owner.get("path") != here:
            raise
        # The owner is a store at this very location that is not there any more: moved
        # or lost, not another project's.
        raise ConfigurationError(
            f"the server records the store {owner.get('store')} at {here} as the owner of "
            f"what this project publishes, but there is no store at {here}: point `store` "
            "in [project] at the store its refreshes used; if that store is lost, start a "
            f"new one and hand over: `{exc.details.get('next_command')}`",
            code="store_missing",
            store=here,
            owner=owner,
            next_command=exc.details.get("next_command"),
        ) from exc


def issue_ingest(
    server: ServerAccess | Path,
    store_path: StoreLocation,
    database: str,
    attempt_id: str,
    *,
    project: Path | None = None,
) -> IssuedPrincipal:
    """Lease an ingest principal for one staging attempt (its lease lives in the store)."""
    access = as_access(server)
    endpoint = access.endpoint(database)
    store = open_store(store_path)
    return build_issuer(access, store, endpoint, project=project).issue(ROLE_INGEST, attempt_id)


def build_publication(config: PublicationConfig, database: str) -> PublicationComponents:
    """Assemble the publisher for ``database`` on the configured server."""
    access = config.access
    endpoint = access.endpoint(database)
    store = open_store(config.store_path, create=config.create_store)
    issuer = build_issuer(
        access,
        store,
        endpoint,
        project=config.project,
        create=config.claim_ownership,
        claimed=config.pool_claimed,
    )
    credentials = pool_credentials(access)
    # One gate beside the store, across processes: a dispatch and a closure never
    # overlap, and a closure's end of a lease is seen by every later dispatch.
    gate = gate_for(config.store_path)
    policy = ClosurePolicy(
        session_timeout=config.session_timeout_seconds,
        session_margin_seconds=config.session_margin_seconds,
        accept_unobserved_logins=config.accept_ungated_ingest,
    )

    authority = SnapshotAuthority(
        registry=store,
        issuer=issuer,
        closer=HttpTransport(endpoint, credentials[access.pool.closer]),
        endpoint=endpoint,
        probe_credentials=issuer.role_credentials,
        scope_of=lambda principal: lease_scope(store, principal),
        dispatch_gate=gate,
        policy=policy,
        note_step=store.note_step,
    )
    catalog = _catalog(access, store, endpoint, credentials)
    if config.sharing is not None:
        config.sharing.attach(catalog, authority, database)
    executor = ClickHouseSnapshotExecutor(
        endpoint,
        dispatch_gate=gate,
        # The last look under the gate, before the EXCHANGE's session: what blocks it now.
        guard=DispatchGuard(
            store,
            side_effects=lambda intent: catalog.side_effects_now(
                TargetSlot(intent.database, intent.target_table), intent.generation_table
            ),
        ),
        session_timeout=policy.session_timeout,
    )
    publisher = ClickHouseAtomicSnapshotPublisher(
        authority=authority,
        store=store,
        catalog=catalog,
        executor=executor,
        limits=config.limits,
        claim_wait_seconds=config.claim_wait_seconds,
        accept_ungated_ingest=config.accept_ungated_ingest,
    )
    return PublicationComponents(publisher, store, issuer, endpoint)


def _catalog(
    access: ServerAccess,
    store: SnapshotStore,
    endpoint: Endpoint,
    credentials: Mapping[str, Credentials],
) -> ClickHouseSnapshotCatalog:
    """The catalog of a publication: what it trusts, allows and accounts for."""
    # The pool is not trusted as a whole: a pool user may hold a write grant only while
    # it holds a lease, once its last lease's closure is proven, or when it was never
    # leased (catalog/allowance.py); a retired principal is none of these: its password
    # may be in other hands, so its grants are an outside writer's until the operator's
    # render leaves it out. What a user ran against either table blocks unless the
    # observed publication's own lease holds it (catalog/pool_queries.py). Retained
    # storage counts every table whose UUID the store recorded (publication/ceilings/retained.py).
    pool = access.pool
    in_use = access.members_in_use()
    return ClickHouseSnapshotCatalog(
        HttpTransport(endpoint, credentials[pool.catalog]),
        trusted_users=access.trusted_writers() | {pool.catalog, pool.closer},
        allowed_writers=lease_allowance(
            lambda: [r.lease for r in store.last_lease_records()],
            closure_proven=store.closure_proven,
            pool=in_use,
        ),
        recorded_uuids=recorded_table_uuids(store),
        live_targets=recorded_target_names(store),
        pool_members=frozenset(in_use),
        # Whether a replaced database's tables are anywhere: read by who sees every
        # database, in one that always exists (the recorded one may be gone).
        operator=HttpTransport(access.endpoint("system"), access.operator()),
        # Every pool user (a retired one too) but the observed publication's own ingest
        # and publisher is accounted for by what it ran: one without an active lease,
        # and one another run's active lease holds.
        idle_pool=lambda slot, generation_table: accounted_pool_users(
            [
                (r.lease, None if r.ended_at is None else micros(r.ended_at))
                for r in store.last_lease_records()
            ],
            pool.members(),
            store_made_us(store),
            own=lambda lease: is_slots_own_lease(lease, generation_table),
            ended_us={u: micros(at) for u, at in store.last_lease_ends().items()},
            peer=lambda lease: is_slot_peer_publisher(lease, slot, store.admission),
        ),
    )


def is_slots_own_lease(lease: Lease, generation_table: str) -> bool:
    """Whether ``lease`` is the observed publication's own: a lease of the attempt that
    staged ``generation_table`` (its ingest) and publishes it (its publisher: prepare
    runs as the staging attempt). Its user is not accounted for by the observation.

    Staging names its table after its attempt, one name per attempt id
    (``staging_table_name``); an attempt id that names no table is no publication's.
    """
    try:
        return staging_table_name(lease.attempt_id) == generation_table
    except DponeError:
        return False


def is_slot_peer_publisher(
    lease: Lease, slot: TargetSlot, admission_of: Callable[[str], Admission | None]
) -> bool:
    """Whether ``lease`` is the publisher of another attempt admitted for ``slot``.

    Two attempts of one slot may prepare at once (the newer fences the older when its
    intent is stored): what their publishers send to the target as the protocol's
    statements (a first publication's CREATE, the EXCHANGE) is decided between them by
    the slot's epochs, its one claim and the target UUID each intent binds; anything
    else such a publisher writes into the slot's tables (an INSERT into A, which keeps
    A's UUID) is a blocker like any other run's (``slot_peer``).
    """
    if lease.role != ROLE_PUBLISHER:
        return False
    admitted = admission_of(lease.attempt_id)
    return admitted is not None and admitted.slot == slot


def store_made_us(store: SnapshotStore) -> int:
    """When the store's identity was made (Unix microseconds; 0: not yet)."""
    notes = store.step_notes(STORE_IDENTITY_KEY)
    return micros(notes[0].at) if notes else 0


def provision_protected_databases(
    data_dir: Path, http_port: int, databases: tuple[str, ...]
) -> None:
    """As the administrator: the identity database and each protected Atomic database.

    The pool can only read ``_dpone_identity`` and cannot create databases, so the
    administrator creates them once, right after the server starts.
    """
    credentials = admin_credentials(data_dir)
    for name in (IDENTITY_DATABASE, *check_databases(databases)):
        run_admin_sql(
            http_port,
            f"CREATE DATABASE IF NOT EXISTS {quote_identifier(name)} ENGINE = Atomic",
            credentials=credentials,
        )
