"""The finite, lossless type policy from SQL Server types to ClickHouse types.

The registry (``registry.py``) is the single owner of which source types are
accepted, what ClickHouse type each becomes, how its cells are decoded from bulk text
and how each value becomes RowBinary; this module plans columns by it, judges type
overrides and names refusals. ``docs/type-policy.md`` describes the same table for
people.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpone.connectors.bulk_text_codec import Cell, CodecColumn, ColumnKind
from dpone.connectors.rowbinary import NULL_FLAG, VALUE_FLAG
from dpone.contracts.schema import SourceColumn
from dpone.errors import DponeError, PolicyError
from dpone.typepolicy import converters as cv
from dpone.typepolicy import registry
from dpone.typepolicy.registry import TargetType
from dpone.typepolicy.source_types import SourceType, parse_source_type

POLICY_ID = "dpone.sqlserver-clickhouse.lossless"
POLICY_VERSION = 1


def _datetime(p: int, whole_minutes: bool = False) -> TargetType:
    return registry.FAMILIES["datetime"].target((p, int(whole_minutes)))


FIXED_WIDTH = {"char", "nchar", "binary"}


def _default_target(st: SourceType, column: str) -> tuple[ColumnKind, TargetType]:
    """The column kind and default target of a declared type, from the registry."""
    found = registry.declared_type(st.name)
    if found is None:
        raise _unsupported(column, st, "not in dpone's type table")
    family, declared = found
    low, high = declared.arity
    if not low <= len(st.params) <= high:
        raise _unsupported(column, st, "wrong number of type parameters")
    try:
        params = declared.params(st)
    except registry.Unsupported as exc:
        raise _unsupported(column, st, exc.why) from None
    return declared.kind, family.target(params)


def _unsupported(column: str, st: SourceType, why: str) -> PolicyError:
    return PolicyError(
        f"column {column!r}: SQL Server type {st} is not supported ({why})",
        code="unsupported_type",
        column=column,
        source_type=str(st),
    )


def _int_range(t: TargetType) -> tuple[int, int]:
    bits = t.params[0]
    if t.family == "int":
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def _override(column: str, st: SourceType, default: TargetType, text: str) -> TargetType:
    target = registry.override_target(text.strip())

    def refuse(why: str) -> PolicyError:
        return PolicyError(
            f"column {column!r}: cannot store {st} as {text!r}: {why}",
            code="override_not_allowed",
            column=column,
            source_type=str(st),
            override=text,
        )

    if target is None:
        raise refuse("not a ClickHouse type dpone writes")
    d, t = default, target
    if d.family == "string" and t.family == "lowcardinality":
        return t
    if d.family == "string" and t.family == "fixed":
        if st.name not in FIXED_WIDTH:
            raise refuse("FixedString is only for char(n), nchar(n) and binary(n)")
        return t
    if d.family in ("int", "uint") and t.family in ("int", "uint"):
        (dl, dh), (tl, th) = _int_range(d), _int_range(t)
        if not (tl <= dl and dh <= th):
            raise refuse(f"{t.text} cannot hold every {d.text} value")
        return t
    if d.family == "decimal" and t.family == "decimal":
        (dp, ds), (tp, ts) = d.params, t.params
        if not (ts >= ds and tp - ts >= dp - ds and tp <= 76):
            raise refuse(f"{t.text} is not at least as wide as {d.text} in both integer and scale")
        return t
    if d.family == "float" and t.text == "Float64":
        return t
    if d.family in ("datetime", "time") and t.family == d.family:
        if t.params[0] < d.params[0]:
            raise refuse(f"{t.text} has less fractional precision than {d.text}")
        if d.family == "datetime":
            return _datetime(t.params[0], whole_minutes=bool(d.params[1]))
        return t
    if t.text == d.text:
        return t
    raise refuse(f"only a wider type of the same family as {d.text} is allowed")


@dataclass(frozen=True)
class ColumnPlan:
    """How one source column is stored: kind, ClickHouse type and RowBinary encoder."""

    name: str
    source_type: str
    nullable: bool
    kind: ColumnKind
    clickhouse_type: str
    encode: Callable[[Cell], bytes]
    target: TargetType | None = None

    @property
    def codec_column(self) -> CodecColumn:
        return CodecColumn(self.name, self.kind)


def target_of(plan: ColumnPlan) -> TargetType:
    """The resolved ClickHouse target type of a plan (family and parameters)."""
    assert plan.target is not None
    return plan.target


class NullNotAllowed(cv.Refused):
    """NULL in a column declared NOT NULL."""


def plan_column(column: SourceColumn, override: str | None = None) -> ColumnPlan:
    """Resolve ``column`` under the policy; refuse anything outside the table."""
    st = parse_source_type(column.source_type, column=column.name)
    kind, target = _default_target(st, column.name)
    if override is not None:
        target = _override(column.name, st, target, override)
    value_encoder = target.encoder()
    if column.nullable:
        nullable = registry.FAMILIES[target.family].nullable
        ch_type = nullable(target.params) if nullable else f"Nullable({target.text})"

        def encode(cell: Cell) -> bytes:
            if cell is None:
                return NULL_FLAG
            return VALUE_FLAG + value_encoder(cell)
    else:
        ch_type = target.text

        def encode(cell: Cell) -> bytes:
            if cell is None:
                raise NullNotAllowed("NULL in a NOT NULL column", code="null_not_allowed")
            return value_encoder(cell)

    return ColumnPlan(
        column.name, column.source_type, column.nullable, kind, ch_type, encode, target
    )


def column_problems(
    columns: Sequence[SourceColumn], overrides: Mapping[str, str] | None = None
) -> list[PolicyError]:
    """Every refusal of the policy for ``columns``, not only the first: each override
    naming no column, then each column whose type is outside the table or whose
    override is refused, in column order. Empty exactly when :func:`plan_columns`
    accepts them."""
    return _plan_all(columns, overrides)[1]


def plan_columns(
    columns: Sequence[SourceColumn], overrides: Mapping[str, str] | None = None
) -> tuple[ColumnPlan, ...]:
    """Plans for every column, in order; overrides must name existing columns.

    Refuses with every problem of :func:`column_problems` (see :func:`refusal`).
    """
    plans, problems = _plan_all(columns, overrides)
    if problems:
        raise refusal(problems)
    return tuple(plans)


def _plan_all(
    columns: Sequence[SourceColumn], overrides: Mapping[str, str] | None
) -> tuple[list[ColumnPlan], list[PolicyError]]:
    overrides = dict(overrides or {})
    names = {c.name for c in columns}
    problems = [
        PolicyError(
            f"column {name!r}: a type override names a column the source table does not have",
            code="unknown_override_column",
            column=name,
            override=overrides[name],
        )
        for name in sorted(set(overrides) - names)
    ]
    plans = []
    for column in columns:
        try:
            plans.append(plan_column(column, overrides.get(column.name)))
        except PolicyError as exc:
            problems.append(exc)
    return plans, problems


def refusal(problems: Sequence[PolicyError]) -> PolicyError:
    """One error for the refusals of one table: the only one itself, or one naming them
    all, with each one's ``to_dict()`` under ``details['problems']`` and the shared code
    (``types_refused`` when they differ). See :func:`refusals` for the way back."""
    if len(problems) == 1:
        return problems[0]
    codes = {p.code for p in problems}
    return PolicyError(
        f"{len(problems)} columns refused by the type policy: "
        + "; ".join(p.message for p in problems),
        code=codes.pop() if len(codes) == 1 else "types_refused",
        problems=[p.to_dict() for p in problems],
    )


def refusals(error: DponeError) -> list[dict[str, Any]]:
    """The single refusals an error of :func:`refusal` stands for (``code``, ``message``,
    ``details``): its listed problems, or the error itself."""
    listed = error.details.get("problems")
    if isinstance(listed, list) and listed:
        return [dict(p) for p in listed]
    return [error.to_dict()]
