"""Contracts of validated file staging: the finite policy, the design, the errors.

The service depends on these, on the query port of :mod:`dpone.ports.clickhouse`
and nothing concrete: a policy whose every bound is finite, and the physical design the
staging table is created with (so it can later equal a publication target's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dpone.connectors.bulk_text_codec import CODEC_ID, CODEC_VERSION
from dpone.contracts.receipt import FileReceipt
from dpone.errors import ConfigurationError, DponeError
from dpone.typepolicy import POLICY_ID, POLICY_VERSION

_KEY_EXPRESSION = re.compile(r"^[A-Za-z0-9_`(), ]*$")


class StagingError(DponeError):
    """Staging did not produce a verified table; ``details['last_event']`` is the last confirmed record."""

    code = "staging_failed"


def check_receipt_versions(receipt: FileReceipt) -> None:
    """Refuse a receipt made with another codec or type policy than this build's
    (``receipt_codec_mismatch``, ``receipt_policy_mismatch``): validate the file again."""
    used = {"codec": (CODEC_ID, CODEC_VERSION), "policy": (POLICY_ID, POLICY_VERSION)}
    found = {
        "codec": (receipt.codec_id, receipt.codec_version),
        "policy": (receipt.policy_id, receipt.policy_version),
    }
    for what, expected in used.items():
        if found[what] != expected:
            raise StagingError(
                f"the receipt was made with {what} {found[what][0]} version {found[what][1]}; "
                f"this dpone uses {expected[0]} version {expected[1]}: validate the file again",
                code=f"receipt_{what}_mismatch",
                receipt=list(found[what]),
                used=list(expected),
            )


def local_io_failed(attempt_id: str, exc: OSError) -> StagingError:
    """A local file operation of the attempt (its spool: a write over the size limit, a
    directory gone) as a coded error naming the attempt and the file; ``exc`` is its
    cause. The caller records it as the attempt's failure and attaches the journal."""
    where = f" ({exc.filename})" if exc.filename else ""
    return StagingError(
        f"attempt {attempt_id}: a local file operation failed: {exc.strerror or exc}{where}",
        code="local_io_failed",
        attempt_id=attempt_id,
        path=exc.filename if isinstance(exc.filename, str) else None,
        errno=exc.errno,
    )


@dataclass(frozen=True)
class StagingPolicy:
    """Finite admission policy: every bound is set, none is unlimited."""

    preparation_seconds: float = 600.0
    verification_seconds: float = 300.0
    request_seconds: float = 600.0
    max_rows: int = 100_000_000
    max_record_bytes: int = 64 * 1024 * 1024
    max_spool_bytes: int = 64 * 1024**3
    free_space_reserve_bytes: int = 256 * 1024 * 1024
    max_scan_bytes: int = 256 * 1024**3
    # What the staged table may hold on the server (``system.tables.total_bytes``),
    # checked once its rows are in and before it is recorded staged: over it, the
    # attempt fails and its table is dropped like any failure's.
    max_stored_bytes: int = 64 * 1024**3
    # T of the ingest drain-gate session (HTTP only, :mod:`dpone.staging.ingest_session`):
    # a write arriving T after the last request in it ended fails with 372. The
    # publication's closure waits T plus its margin, so it is kept short (the
    # shortest the server takes, whole seconds).
    session_timeout_seconds: int = 1

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigurationError(
                    f"staging policy {name} must be a positive finite number",
                    code="invalid_policy",
                    field=name,
                )
            if value == float("inf"):
                raise ConfigurationError(
                    f"staging policy {name} must be finite", code="invalid_policy", field=name
                )
        if not isinstance(self.session_timeout_seconds, int):
            raise ConfigurationError(
                "staging policy session_timeout_seconds must be whole seconds",
                code="invalid_policy",
                field="session_timeout_seconds",
            )


@dataclass(frozen=True)
class PhysicalDesign:
    """The staging table's engine design; the identity checks compare against it."""

    order_by: str = "tuple()"
    partition_by: str | None = None
    settings: tuple[tuple[str, str], ...] = field(default=())
    engine: str = "MergeTree"

    def __post_init__(self) -> None:
        if self.engine != "MergeTree":
            raise ConfigurationError(
                "staging tables use the local MergeTree engine", code="invalid_design"
            )
        for expression in (self.order_by, self.partition_by or ""):
            if not _KEY_EXPRESSION.fullmatch(expression):
                raise ConfigurationError(
                    f"key expression {expression!r} is not allowed", code="invalid_design"
                )
        for name, value in self.settings:
            if not re.fullmatch(r"[a-z_]+", name) or not re.fullmatch(r"[A-Za-z0-9_.]+", value):
                raise ConfigurationError(
                    f"table setting {name}={value} is not allowed", code="invalid_design"
                )

    def clause(self) -> str:
        """The ENGINE ... clause of the CREATE statement."""
        parts = [f"ENGINE = {self.engine}"]
        if self.partition_by:
            parts.append(f"PARTITION BY {self.partition_by}")
        parts.append(f"ORDER BY {self.order_by}")
        if self.settings:
            parts.append("SETTINGS " + ", ".join(f"{n} = {v}" for n, v in self.settings))
        return " ".join(parts)

    @property
    def expected_sorting_key(self) -> str:
        """``system.tables.sorting_key`` as the server reports it for this design."""
        return "" if self.order_by.replace(" ", "") == "tuple()" else self.order_by.replace("`", "")

    @property
    def expected_partition_key(self) -> str:
        return (self.partition_by or "").replace("`", "")
