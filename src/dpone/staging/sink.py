"""``ClickHouseSink``: the public entry point for staging validated files."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
from dpone.staging.composition import (
    RunnerFactory,
    StagingConfig,
    TransportFactory,
    build_clickhouse_staging_components,
)
from dpone.staging.service import JournalFactory, StagedTable


def new_attempt_id() -> str:
    """A fresh attempt id: UTC time plus randomness, safe in query ids and paths."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(4)


class ClickHouseSink:
    """Configured with an endpoint, credentials and a finite policy (in ``StagingConfig``).

    ``transport_factory``, ``runner_factory`` and ``journal_factory`` are the
    construction boundary's injection points (see :mod:`dpone.staging.composition`);
    left out, production composition chooses them.
    """

    def __init__(
        self,
        config: StagingConfig,
        *,
        progress: Callable[[str, int, int], None] | None = None,
        transport_factory: TransportFactory | None = None,
        runner_factory: RunnerFactory | None = None,
        journal_factory: JournalFactory | None = None,
    ) -> None:
        self.config = config
        components = build_clickhouse_staging_components(
            config,
            progress=progress,
            transport_factory=transport_factory,
            runner_factory=runner_factory,
            journal_factory=journal_factory,
        )
        self.validated_file = components.validated_file
        self.decoder = components.decoder
        self.finalizer = components.finalizer

    def stage_validated_file(
        self,
        path: str | os.PathLike[str],
        receipt_path: str | os.PathLike[str],
        *,
        attempt_id: str | None = None,
        overrides: dict[str, str] | None = None,
    ) -> StagedTable:
        """Stage ``path`` (described by its receipt) into a verified private table."""
        artifact = ContractValidatedFileArtifact(Path(path), Path(receipt_path))
        return self.validated_file.stage(
            artifact, attempt_id or new_attempt_id(), overrides=overrides
        )
