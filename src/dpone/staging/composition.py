"""Construction of the staging collaborators; the one place a transport is chosen.

``build_clickhouse_staging_components`` returns an immutable bundle of three
collaborators, built in order: the validated-file service, the decoder (receipt
documents and their schema plans) and the finalizer (ownership-checked removal of a
staged table). Assembly calls nothing remote. Production composition selects exactly
one controlled transport, ``http`` or ``client``; ``auto`` is refused.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dpone.connectors.clickhouse_client import ClientTransport
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
from dpone.staging.recovery import discard_attempt
from dpone.staging.service import ClickHouseValidatedFileService, StagedTable
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


def build_clickhouse_staging_components(
    config: StagingConfig, *, progress: Callable[[str, int, int], None] | None = None
) -> StagingComponents:
    """Build service, decoder and finalizer in order, around one transport."""
    transport = build_transport(config)
    service = ClickHouseValidatedFileService(
        transport,
        config.endpoint.database,
        config.work_dir,
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


def client_version(client_path: str) -> tuple[int, int]:
    """``clickhouse-client --version`` as (major, minor)."""
    try:
        done = subprocess.run(
            [client_path, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigurationError(
            f"clickhouse-client at {client_path!r} cannot run: {exc}", code="client_missing"
        ) from exc
    found = re.search(rb"version (\d+)\.(\d+)", done.stdout)
    if done.returncode != 0 or found is None:
        raise ConfigurationError(
            f"clickhouse-client at {client_path!r} does not say its version", code="client_missing"
        )
    return int(found[1]), int(found[2])


def client_type_check(client_path: str) -> Callable[[Sequence[tuple[str, str]]], None]:
    """Refuses, before anything is created, target types this client cannot send."""

    def check(columns: Sequence[tuple[str, str]]) -> None:
        version = client_version(client_path)
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
