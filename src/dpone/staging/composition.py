"""Construction of the staging collaborators; the one place a transport is chosen.

``build_clickhouse_staging_components`` returns an immutable bundle of the
validated-file service, the decoder and the finalizer, calling nothing remote. It
selects exactly one controlled transport, ``http`` or ``client`` (``auto`` is refused),
through the injected ``transport_factory`` (:func:`build_transport`), ``runner_factory``
and ``journal_factory``, each with its production default; on HTTP, every write of the
service and the finalizer goes through the attempt's drain-gate session
(:func:`ingest_gate`). See docs/staging.md.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dpone.connectors.clickhouse_client import ClientTransport
from dpone.connectors.clickhouse_client import client_version as client_version  # re-exported
from dpone.connectors.clickhouse_http import HttpTransport
from dpone.contracts.receipt import FileReceipt
from dpone.errors import ConfigurationError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import Credentials, Endpoint
from dpone.preparation.modes import DEFAULT_MODE, refuse_removed_mode
from dpone.staging.contract import (
    PhysicalDesign,
    StagingPolicy,
)
from dpone.staging.ingest_session import IngestSessionGate, SessionNotes
from dpone.staging.journal import file_journals
from dpone.staging.recovery import discard_attempt
from dpone.staging.service import ClickHouseValidatedFileService, JournalFactory, StagedTable
from dpone.typepolicy import ColumnPlan, plan_columns

TRANSPORTS = ("http", "client")
# The clickhouse-client release that first parses each type on the client side (it
# parses INSERT data itself; Debian's 18.16 fails on all of these).
CLIENT_TYPE_SINCE: dict[str, tuple[int, int]] = {
    "DateTime64": (20, 1),
    "Date32": (21, 9),
    "Bool": (21, 12),
}


@dataclass(frozen=True)
class StagingConfig:
    """Everything composition needs; credentials stay inside, never printed."""

    endpoint: Endpoint
    credentials: Credentials
    work_dir: Path
    transport: str = "http"
    client_path: str = "clickhouse-client"
    policy: StagingPolicy = field(default_factory=StagingPolicy)
    design: PhysicalDesign = field(default_factory=PhysicalDesign)
    preparation_mode: str = DEFAULT_MODE
    # system.users id of the staging user, observed by an administrator, for a user
    # whose own grants do not let it read system.users (recorded in the journal).
    principal_uuid: str | None = None
    # Where the ingest drain gate notes its session (the lease's step notes in the
    # publication store, :mod:`dpone.staging.ingest_session`); None: gated, unnoted.
    session_notes: SessionNotes | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Refused here, before any attempt starts, with the error naming the replacement.
        refuse_removed_mode(self.preparation_mode)


class ReceiptDecoder:
    """Reads receipts and resolves their schema under the type policy."""

    def load(self, path: str | Path) -> FileReceipt:
        return FileReceipt.from_bytes(Path(path).read_bytes())

    def plans(
        self, receipt: FileReceipt, overrides: dict[str, str] | None = None
    ) -> tuple[ColumnPlan, ...]:
        return plan_columns(receipt.schema.columns, overrides)


class StagingFinalizer:
    """Removes a staged table after proving it is the one the handle names.

    The same operation as ``dpone attempts discard``: ownership verified (the handle's
    UUID, the journal's, the ownership mark), a durable intent in the attempt's
    journal, the query id ``dpone-b02-<attempt>-discard``, removal verified.
    """

    def __init__(self, transport: QueryPort, request_seconds: float) -> None:
        self._transport = transport
        self._request_seconds = request_seconds

    def discard(self, staged: StagedTable) -> None:
        """DROP the staged table if it is still the handle's; refuse otherwise."""
        discard_attempt(
            self._transport,
            staged.journal_path.parent,
            staged.journal_path.name,
            seconds=self._request_seconds,
            database=staged.database,
            expected_uuid=staged.uuid,
        )


@dataclass(frozen=True)
class StagingComponents:
    """The immutable bundle: service, decoder, finalizer."""

    validated_file: ClickHouseValidatedFileService
    decoder: ReceiptDecoder
    finalizer: StagingFinalizer


def build_transport(config: StagingConfig) -> QueryPort:
    """The one controlled transport the configuration names."""
    if config.transport == "http":
        return HttpTransport(config.endpoint, config.credentials)
    if config.transport == "client":
        return ClientTransport(config.endpoint, config.credentials, client_path=config.client_path)
    raise ConfigurationError(
        f"transport must be one of {', '.join(TRANSPORTS)} (chosen explicitly; 'auto' is refused), "
        f"not {config.transport!r}",
        code="invalid_transport",
    )


def ingest_gate(config: StagingConfig, transport: QueryPort) -> QueryPort:
    """``transport`` with every write in its attempt's drain-gate session (HTTP only).

    The ``client`` transport (native protocol) has no sessions: it is returned as it
    is, and a closure of its principal records that no drain gate exists.
    """
    if config.transport != "http" or isinstance(transport, IngestSessionGate):
        return transport
    return IngestSessionGate(
        transport,
        session_timeout=config.policy.session_timeout_seconds,
        notes=config.session_notes,
    )


TransportFactory = Callable[[StagingConfig], QueryPort]
RunnerFactory = Callable[[StagingConfig, StagingPolicy], QueryPort]


def build_clickhouse_staging_components(
    config: StagingConfig,
    *,
    progress: Callable[[str, int, int], None] | None = None,
    transport_factory: TransportFactory | None = None,
    runner_factory: RunnerFactory | None = None,
    journal_factory: JournalFactory | None = None,
) -> StagingComponents:
    """Build service, decoder and finalizer in order, around one transport.

    The factories are called once each, here; ``None`` takes the production default.
    """
    transport = ingest_gate(config, (transport_factory or build_transport)(config))
    runner = (
        transport
        if runner_factory is None
        else ingest_gate(config, runner_factory(config, config.policy))
    )
    service = ClickHouseValidatedFileService(
        runner,
        config.endpoint.database,
        journal_factory=journal_factory or file_journals(config.work_dir),
        policy=config.policy,
        design=config.design,
        progress=progress,
        preparation_mode=config.preparation_mode,
        user=config.credentials.user,
        user_uuid=config.principal_uuid,
        check_types=client_type_check(config.client_path) if config.transport == "client" else None,
    )
    return StagingComponents(
        service, ReceiptDecoder(), StagingFinalizer(transport, config.policy.request_seconds)
    )


def client_type_check(
    client_path: str,
    *,
    seconds: float = StagingPolicy.preparation_seconds,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[Sequence[tuple[str, str]]], None]:
    """Refuses, before anything is created, target types this client cannot send.

    Each check asks the client its version within ``seconds`` (the caller's bound).
    """

    def check(columns: Sequence[tuple[str, str]]) -> None:
        version = client_version(client_path, deadline=clock() + seconds, clock=clock)
        refused = [
            f"{name} {type_}"
            for name, type_ in columns
            for family, since in CLIENT_TYPE_SINCE.items()
            if re.search(rf"\b{family}\b", type_) and version < since
        ]
        if refused:
            raise ConfigurationError(
                f"clickhouse-client {version[0]}.{version[1]} cannot send {', '.join(refused)} "
                "(it parses INSERT data itself and predates these types); stage with "
                "--transport http, or use a newer clickhouse-client",
                code="transport_cannot_carry_type",
                columns=refused,
            )

    return check
