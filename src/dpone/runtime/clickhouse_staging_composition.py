"""Construction of the staging collaborators; the one place a transport is chosen.

``build_clickhouse_staging_components`` returns an immutable bundle of three
collaborators, built in order: the validated-file service, the decoder (receipt
documents and their schema plans) and the finalizer (ownership-checked removal of a
staged table). Assembly calls nothing remote. Production composition selects exactly
one controlled transport, ``http`` or ``client``; ``auto`` is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dpone.connectors.clickhouse_client import ClientTransport
from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_request import (
    Credentials,
    Endpoint,
    mutation,
    mutation_query_id,
    read,
    read_query_id,
)
from dpone.contracts.receipt import FileReceipt
from dpone.errors import ConfigurationError
from dpone.ports.clickhouse import QueryPort
from dpone.runtime.clickhouse_file_stage_contract import (
    PhysicalDesign,
    StagingError,
    StagingPolicy,
)
from dpone.runtime.preparation import MODE_PYTHON
from dpone.runtime.validated_file_service import ClickHouseValidatedFileService, StagedTable
from dpone.sql import quote_identifier, quote_literal
from dpone.typepolicy import ColumnPlan, plan_columns

TRANSPORTS = ("http", "client")


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
    preparation_mode: str = MODE_PYTHON


class ReceiptDecoder:
    """Reads receipts and resolves their schema under the type policy."""

    def load(self, path: str | Path) -> FileReceipt:
        return FileReceipt.from_bytes(Path(path).read_bytes())

    def plans(
        self, receipt: FileReceipt, overrides: dict[str, str] | None = None
    ) -> tuple[ColumnPlan, ...]:
        return plan_columns(receipt.schema.columns, overrides)


class StagingFinalizer:
    """Removes a staged table after proving it is the one the handle names."""

    def __init__(self, transport: QueryPort, request_seconds: float) -> None:
        self._transport = transport
        self._request_seconds = request_seconds

    def discard(self, staged: StagedTable, attempt_id: str) -> None:
        """DROP the staged table if its UUID is still the handle's; refuse otherwise."""
        deadline = time.monotonic() + self._request_seconds
        rows = self._transport.execute(
            read("SELECT toString(uuid) AS uuid FROM system.tables "
                 f"WHERE database = {quote_literal(staged.database)} AND name = {quote_literal(staged.table)} "
                 "FORMAT JSONEachRow", read_query_id(attempt_id, "discard", 1)),
            deadline=deadline,
        ).json_rows()  # fmt: skip
        if rows != [{"uuid": staged.uuid}]:
            raise StagingError(
                f"{staged.database}.{staged.table} is not the staged table {staged.uuid}; nothing dropped",
                code="ownership_unverified",
            )
        self._transport.execute(
            mutation(f"DROP TABLE {quote_identifier(staged.database)}.{quote_identifier(staged.table)}",
                     mutation_query_id(attempt_id, "drop")),
            deadline=deadline,
        )  # fmt: skip


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
    )
    return StagingComponents(
        service, ReceiptDecoder(), StagingFinalizer(transport, config.policy.request_seconds)
    )
