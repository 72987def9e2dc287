"""The finite, lossless type policy from SQL Server types to ClickHouse types.

The table here is the single owner of which source types are accepted, what
ClickHouse type each becomes, how its cells are decoded from bulk text and how each
value becomes RowBinary. ``docs/type-policy.md`` describes the same table for people.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpone.connectors.bulk_text_codec import Cell, CodecColumn, ColumnKind
from dpone.connectors.rowbinary import NULL_FLAG, VALUE_FLAG
from dpone.contracts.schema import SourceColumn
from dpone.errors import DponeError, PolicyError
from dpone.typepolicy import converters as cv
from dpone.typepolicy.source_types import SourceType, parse_source_type

POLICY_ID = "dpone.sqlserver-clickhouse.lossless"
POLICY_VERSION = 1


@dataclass(frozen=True)
class TargetType:
    """A ClickHouse type dpone can write, with its family for override checks."""

    text: str  # e.g. "Decimal(18, 4)"
    family: str  # int, uint, bool, decimal, float, date, datetime, time, dto, uuid, string, fixed
    params: tuple[int, ...] = ()

    def encoder(self) -> cv.Encoder:
        f, p = self.family, self.params
        if f in ("int", "uint"):
            return cv.integer(p[0], f == "int")
        factories: dict[str, Callable[[], cv.Encoder]] = {
            "bool": cv.boolean,
            "decimal": lambda: cv.decimal(p[0], p[1]),
            "float": lambda: cv.float32() if p[0] == 32 else cv.float64(),
            "date": cv.date32,
            "datetime": lambda: cv.datetime64(p[0], whole_minutes=bool(p[1:] and p[1])),
            "time": lambda: cv.time64(p[0]),
            "dto": lambda: cv.datetimeoffset(p[0]),
            "uuid": cv.uuid,
            "string": cv.string,
            "lowcardinality": cv.string,
            "fixed": lambda: cv.fixed_string(p[0]),
        }
        return factories[f]()


def _int(bits: int, signed: bool = True) -> TargetType:
    return TargetType(f"{'' if signed else 'U'}Int{bits}", "int" if signed else "uint", (bits,))


def _decimal(p: int, s: int) -> TargetType:
    return TargetType(f"Decimal({p}, {s})", "decimal", (p, s))


def _datetime(p: int, whole_minutes: bool = False) -> TargetType:
    return TargetType(f"DateTime64({p}, 'UTC')", "datetime", (p, int(whole_minutes)))


STRING = TargetType("String", "string")
TEXT_TYPES = {"char", "varchar", "nchar", "nvarchar", "text", "ntext", "xml", "sysname"}
BINARY_TYPES = {"binary", "varbinary", "image"}
FIXED_WIDTH = {"char", "nchar", "binary"}


def _default_target(st: SourceType, column: str) -> tuple[ColumnKind, TargetType]:
    name, params = st.name, st.params
    numeric = [p for p in params if isinstance(p, int)]

    def expect(count_min: int, count_max: int) -> None:
        if not count_min <= len(params) <= count_max:
            raise _unsupported(column, st, "wrong number of type parameters")

    fixed: dict[str, TargetType] = {
        "bit": TargetType("Bool", "bool"),
        "tinyint": _int(8, signed=False),
        "smallint": _int(16),
        "int": _int(32),
        "bigint": _int(64),
        "money": _decimal(19, 4),
        "smallmoney": _decimal(10, 4),
        "real": TargetType("Float32", "float", (32,)),
        "date": TargetType("Date32", "date"),
        "datetime": _datetime(3),
        "smalldatetime": _datetime(0, whole_minutes=True),
        "uniqueidentifier": TargetType("UUID", "uuid"),
    }
    if name in fixed:
        expect(0, 0)
        return ColumnKind.RAW, fixed[name]
    if name in ("decimal", "numeric"):
        expect(0, 2)
        if len(numeric) != len(params):
            raise _unsupported(column, st, "precision and scale must be numbers")
        precision = numeric[0] if numeric else 18
        scale = numeric[1] if len(numeric) > 1 else 0
        if not (1 <= precision <= 38 and 0 <= scale <= precision):
            raise _unsupported(column, st, "precision must be 1..38 and scale 0..precision")
        return ColumnKind.RAW, _decimal(precision, scale)
    if name == "float":
        expect(0, 1)
        bits = numeric[0] if numeric else 53
        if not 1 <= bits <= 53:
            raise _unsupported(column, st, "float(n) needs 1 <= n <= 53")
        return ColumnKind.RAW, TargetType(
            "Float32" if bits <= 24 else "Float64", "float", (32 if bits <= 24 else 64,)
        )
    if name in ("datetime2", "datetimeoffset", "time"):
        expect(0, 1)
        precision = numeric[0] if numeric else 7
        if len(numeric) != len(params) or not 0 <= precision <= 7:
            raise _unsupported(column, st, "fractional precision must be 0..7")
        if name == "datetime2":
            return ColumnKind.RAW, _datetime(precision)
        if name == "time":
            return ColumnKind.RAW, TargetType(f"Time64({precision})", "time", (precision,))
        return ColumnKind.RAW, TargetType(
            f"Tuple(utc DateTime64({precision}, 'UTC'), offset_minutes Int16)", "dto", (precision,)
        )
    if name in TEXT_TYPES:
        expect(0, 1)
        return ColumnKind.TEXT, STRING
    if name in BINARY_TYPES:
        expect(0, 1)
        return ColumnKind.BINARY, STRING
    if name in ("rowversion", "timestamp"):
        expect(0, 0)
        return ColumnKind.BINARY, TargetType("FixedString(8)", "fixed", (8,))
    raise _unsupported(column, st, "not in dpone's type table")


def _unsupported(column: str, st: SourceType, why: str) -> PolicyError:
    return PolicyError(
        f"column {column!r}: SQL Server type {st} is not supported ({why})",
        code="unsupported_type",
        column=column,
        source_type=str(st),
    )


_OVERRIDE_FORMS: list[tuple[re.Pattern[str], Callable[[re.Match[str]], TargetType]]] = [
    (re.compile(r"String"), lambda m: STRING),
    (
        re.compile(r"LowCardinality\(String\)"),
        lambda m: TargetType("LowCardinality(String)", "lowcardinality"),
    ),
    (
        re.compile(r"FixedString\((\d+)\)"),
        lambda m: TargetType(f"FixedString({int(m[1])})", "fixed", (int(m[1]),)),
    ),
    (re.compile(r"(U?)Int(8|16|32|64)"), lambda m: _int(int(m[2]), signed=not m[1])),
    (re.compile(r"Decimal\((\d+),\s*(\d+)\)"), lambda m: _decimal(int(m[1]), int(m[2]))),
    (re.compile(r"Float64"), lambda m: TargetType("Float64", "float", (64,))),
    (re.compile(r"DateTime64\((\d),\s*'UTC'\)"), lambda m: _datetime(int(m[1]))),
    (re.compile(r"Time64\((\d)\)"), lambda m: TargetType(f"Time64({m[1]})", "time", (int(m[1]),))),
]


def _int_range(t: TargetType) -> tuple[int, int]:
    bits = t.params[0]
    if t.family == "int":
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def _override(column: str, st: SourceType, default: TargetType, text: str) -> TargetType:
    target = None
    for pattern, build in _OVERRIDE_FORMS:
        match = pattern.fullmatch(text.strip())
        if match is not None:
            target = build(match)
            break

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
        if target.family == "lowcardinality":
            ch_type = "LowCardinality(Nullable(String))"
        else:
            ch_type = f"Nullable({target.text})"

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
