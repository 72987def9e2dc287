"""Converting decoded bulk text records to RowBinary under the type policy.

Shared by validation (which discards the bytes) and preparation (which spools them),
so both accept and refuse exactly the same values at the same positions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from dpone.connectors.bulk_text_codec import Cell
from dpone.errors import PolicyError
from dpone.typepolicy import ColumnPlan, Refused


class ValueNotRepresentable(PolicyError):
    """A cell the policy refuses; details name ``record``, ``column`` and ``source``.

    The message names the position and what is wrong, never the value itself.
    """

    code = "value_not_representable"


def convert_records(
    records: Iterable[tuple[Cell, ...]],
    plans: Sequence[ColumnPlan],
    write: Callable[[bytes], object] | None = None,
    *,
    source: str | None = None,
    first_record: int = 1,
) -> int:
    """Encode every cell of every record; returns the number of records.

    ``write`` receives one record's RowBinary bytes at a time (None: check only).
    """
    encoders = [p.encode for p in plans]
    count = 0
    ordinal = first_record - 1
    for ordinal, record in enumerate(records, start=first_record):
        try:
            row = b"".join([enc(cell) for enc, cell in zip(encoders, record, strict=True)])
        except Refused as exc:
            raise _locate(exc, record, plans, ordinal, source) from exc
        if write is not None:
            write(row)
        count += 1
    return count


def _locate(
    exc: Refused,
    record: tuple[Cell, ...],
    plans: Sequence[ColumnPlan],
    ordinal: int,
    source: str | None,
) -> ValueNotRepresentable:
    # Find the failing column again; only on the error path, so the hot loop stays lean.
    for plan, cell in zip(plans, record, strict=True):
        try:
            plan.encode(cell)
        except Refused as again:
            where = f"record {ordinal}, column {plan.name!r} ({plan.clickhouse_type})"
            if source:
                where = f"{source}, {where}"
            return ValueNotRepresentable(
                f"the value at {where} {again.reason}",
                code=again.code,
                record=ordinal,
                column=plan.name,
                clickhouse_type=plan.clickhouse_type,
                source=source,
            )
    where = f"{source}, record {ordinal}" if source else f"record {ordinal}"
    return ValueNotRepresentable(
        f"the value at {where} {exc.reason}", code=exc.code, record=ordinal, source=source
    )
