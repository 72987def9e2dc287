"""The registry of type families: each ClickHouse type family defined once.

A :class:`Family` holds everything dpone knows of one family of target types: its
ClickHouse type text, its exact reference converter, the compiled converter's code
(None: the reference converts it alone), its override forms, and the declared source
types it is the default target of, each with its bulk-text column kind and renderer.
The policy, the renderers and the compiled converter read this table and keep none of
their own. See docs/architecture.md ("A type") and docs/type-policy.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from dpone.connectors.bulk_text_codec import ColumnKind
from dpone.typepolicy import converters as cv
from dpone.typepolicy import renderers as rd
from dpone.typepolicy.source_types import SourceType

Params = tuple[int, ...]


class Unsupported(Exception):
    """A declared type's parameters outside its rule; ``why`` goes into the policy's
    ``unsupported_type`` refusal."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True)
class TargetType:
    """A ClickHouse type dpone can write: its text, its family's name and parameters."""

    text: str  # e.g. "Decimal(18, 4)"
    family: str  # a name in FAMILIES
    params: Params = ()

    def encoder(self) -> cv.Encoder:
        """The exact reference converter of one value of this type."""
        return FAMILIES[self.family].convert(self.params)


@dataclass(frozen=True)
class Rendering:
    """How a driver's values of a declared type become cells: the renderer, its name,
    the compiled renderer's operation for it (``native/render.c``; None: the Python
    renderer alone) and the kind of the field it writes."""

    name: str
    render: rd.Renderer
    op: int | None = None
    kind: ColumnKind = ColumnKind.RAW


@dataclass(frozen=True)
class Declared:
    """Declared source types whose default target is a family: their names, bulk-text
    column kind, number of parameters, the target's parameters (raising
    :class:`Unsupported`) and the rendering of their driver values."""

    names: tuple[str, ...]
    kind: ColumnKind
    params: Callable[[SourceType], Params]
    rendering: Callable[[SourceType], Rendering]
    arity: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Family:
    """One ClickHouse type family and every facet of it (see the module docstring).

    ``textual`` families hold text or binary fields (columns of kind TEXT or BINARY);
    the others hold RAW fields. ``overrides`` are the patterns of an override text
    naming this family and how its match gives the parameters; ``nullable`` is the
    nullable type's text when it is not ``Nullable(text)``.
    """

    name: str
    text: Callable[[Params], str]
    convert: Callable[[Params], cv.Encoder]
    native_code: int | None
    declared: tuple[Declared, ...] = ()
    textual: bool = False
    overrides: tuple[tuple[str, Callable[[re.Match[str]], Params]], ...] = ()
    nullable: Callable[[Params], str] | None = None

    def target(self, params: Params = ()) -> TargetType:
        """This family's target type with ``params``."""
        return TargetType(self.text(params), self.name, params)


def _fixed(*params: int) -> Callable[[SourceType], Params]:
    return lambda st: params


def _always(rendering: Rendering) -> Callable[[SourceType], Rendering]:
    return lambda st: rendering


def _numbers(st: SourceType) -> list[int]:
    return [p for p in st.params if isinstance(p, int)]


def _decimal_params(st: SourceType) -> Params:
    numeric = _numbers(st)
    if len(numeric) != len(st.params):
        raise Unsupported("precision and scale must be numbers")
    precision = numeric[0] if numeric else 18
    scale = numeric[1] if len(numeric) > 1 else 0
    if not (1 <= precision <= 38 and 0 <= scale <= precision):
        raise Unsupported("precision must be 1..38 and scale 0..precision")
    return precision, scale


def _float_params(st: SourceType) -> Params:
    numeric = _numbers(st)
    bits = numeric[0] if numeric else 53
    if len(numeric) != len(st.params) or not 1 <= bits <= 53:  # float(max) too
        raise Unsupported("float(n) needs 1 <= n <= 53")
    return (32 if bits <= 24 else 64,)


def _precision(st: SourceType) -> int:
    numeric = _numbers(st)
    precision = numeric[0] if numeric else 7
    if len(numeric) != len(st.params) or not 0 <= precision <= 7:
        raise Unsupported("fractional precision must be 0..7")
    return precision


INTEGER = Rendering("integer", rd.render_integer, 1)
BIT = Rendering("bit", rd.render_bit, 2)
DECIMAL = Rendering("decimal", rd.render_decimal, 3)
FLOAT64 = Rendering("float64", rd.render_float64, 4)
FLOAT32 = Rendering("float32", rd.render_float32, 5)
DATE = Rendering("date", rd.render_date, 6)
DATETIME7 = Rendering("datetime7", rd.render_datetime7, 7)
DATETIME3 = Rendering("datetime3", rd.render_datetime3, 8)
DATETIME0 = Rendering("datetime0", rd.render_datetime0, 9)
DATETIMEOFFSET = Rendering("datetimeoffset", rd.render_datetimeoffset, 10)
TIME = Rendering("time", rd.render_time, 11)
UUID = Rendering("uuid", rd.render_uuid, 12)
TEXT = Rendering("text", rd.render_text, 13, ColumnKind.TEXT)
BINARY = Rendering("binary", rd.render_binary, 14, ColumnKind.BINARY)

# Every rendering, each named once: the renderer's table (``dpone.exporters.render``)
# and the compiled renderer's operations are read from it.
RENDERINGS = (
    INTEGER,
    BIT,
    DECIMAL,
    FLOAT64,
    FLOAT32,
    DATE,
    DATETIME7,
    DATETIME3,
    DATETIME0,
    DATETIMEOFFSET,
    TIME,
    UUID,
    TEXT,
    BINARY,
)

TEXT_TYPES = ("char", "varchar", "nchar", "nvarchar", "text", "ntext", "xml", "sysname")
BINARY_TYPES = ("binary", "varbinary", "image")


def _float_rendering(st: SourceType) -> Rendering:
    # As the renderer always chose: the declared float(n), not the resolved target.
    return FLOAT32 if st.params and int(st.params[0]) <= 24 else FLOAT64


def _integers(signed: bool, declared: tuple[Declared, ...]) -> Family:
    prefix = "" if signed else "U"
    return Family(
        "int" if signed else "uint",
        text=lambda p: f"{prefix}Int{p[0]}",
        convert=lambda p: cv.integer(p[0], signed),
        native_code=1 if signed else 2,
        declared=declared,
        overrides=((prefix + r"Int(8|16|32|64)", lambda m: (int(m[1]),)),),
    )


def _raw(names: tuple[str, ...], params: Callable[[SourceType], Params], r: Rendering) -> Declared:
    return Declared(names, ColumnKind.RAW, params, _always(r))


def _dated(name: str, r: Rendering) -> Declared:
    return Declared((name,), ColumnKind.RAW, lambda st: (_precision(st),), _always(r), (0, 1))


_ALL = (
    Family(
        "bool",
        text=lambda p: "Bool",
        convert=lambda p: cv.boolean(),
        native_code=3,
        declared=(_raw(("bit",), _fixed(), BIT),),
    ),
    _integers(False, (_raw(("tinyint",), _fixed(8), INTEGER),)),
    _integers(
        True,
        (
            _raw(("smallint",), _fixed(16), INTEGER),
            _raw(("int",), _fixed(32), INTEGER),
            _raw(("bigint",), _fixed(64), INTEGER),
        ),
    ),
    Family(
        "decimal",
        text=lambda p: f"Decimal({p[0]}, {p[1]})",
        convert=lambda p: cv.decimal(p[0], p[1]),
        native_code=4,
        declared=(
            _raw(("money",), _fixed(19, 4), DECIMAL),
            _raw(("smallmoney",), _fixed(10, 4), DECIMAL),
            Declared(
                ("decimal", "numeric"), ColumnKind.RAW, _decimal_params, _always(DECIMAL), (0, 2)
            ),
        ),
        overrides=((r"Decimal\((\d+),\s*(\d+)\)", lambda m: (int(m[1]), int(m[2]))),),
    ),
    Family(
        "float",
        text=lambda p: f"Float{p[0]}",
        convert=lambda p: cv.float32() if p[0] == 32 else cv.float64(),
        native_code=5,
        declared=(
            _raw(("real",), _fixed(32), FLOAT32),
            Declared(("float",), ColumnKind.RAW, _float_params, _float_rendering, (0, 1)),
        ),
        overrides=((r"Float64", lambda m: (64,)),),
    ),
    Family(
        "date",
        text=lambda p: "Date32",
        convert=lambda p: cv.date32(),
        native_code=6,
        declared=(_raw(("date",), _fixed(), DATE),),
    ),
    Family(
        "datetime",  # params: precision, and 1 for whole minutes (smalldatetime)
        text=lambda p: f"DateTime64({p[0]}, 'UTC')",
        convert=lambda p: cv.datetime64(p[0], whole_minutes=bool(p[1:] and p[1])),
        native_code=7,
        declared=(
            _raw(("datetime",), _fixed(3, 0), DATETIME3),
            _raw(("smalldatetime",), _fixed(0, 1), DATETIME0),
            Declared(
                ("datetime2",),
                ColumnKind.RAW,
                lambda st: (_precision(st), 0),
                _always(DATETIME7),
                (0, 1),
            ),
        ),
        overrides=((r"DateTime64\((\d),\s*'UTC'\)", lambda m: (int(m[1]), 0)),),
    ),
    Family(
        "time",
        text=lambda p: f"Time64({p[0]})",
        convert=lambda p: cv.time64(p[0]),
        native_code=8,
        declared=(_dated("time", TIME),),
        overrides=((r"Time64\((\d)\)", lambda m: (int(m[1]),)),),
    ),
    Family(
        "dto",
        text=lambda p: f"Tuple(utc DateTime64({p[0]}, 'UTC'), offset_minutes Int16)",
        convert=lambda p: cv.datetimeoffset(p[0]),
        native_code=9,
        declared=(_dated("datetimeoffset", DATETIMEOFFSET),),
    ),
    Family(
        "uuid",
        text=lambda p: "UUID",
        convert=lambda p: cv.uuid(),
        native_code=10,
        declared=(_raw(("uniqueidentifier",), _fixed(), UUID),),
    ),
    Family(
        "string",
        text=lambda p: "String",
        convert=lambda p: cv.string(),
        native_code=11,
        declared=(
            Declared(TEXT_TYPES, ColumnKind.TEXT, _fixed(), _always(TEXT), (0, 1)),
            Declared(BINARY_TYPES, ColumnKind.BINARY, _fixed(), _always(BINARY), (0, 1)),
        ),
        textual=True,
        overrides=((r"String", lambda m: ()),),
    ),
    Family(
        "lowcardinality",
        text=lambda p: "LowCardinality(String)",
        convert=lambda p: cv.string(),
        native_code=11,  # the C side converts it as String: the same bytes
        textual=True,
        overrides=((r"LowCardinality\(String\)", lambda m: ()),),
        nullable=lambda p: "LowCardinality(Nullable(String))",
    ),
    Family(
        "fixed",
        text=lambda p: f"FixedString({p[0]})",
        convert=lambda p: cv.fixed_string(p[0]),
        native_code=12,
        declared=(
            Declared(("rowversion", "timestamp"), ColumnKind.BINARY, _fixed(8), _always(BINARY)),
        ),
        textual=True,
        overrides=((r"FixedString\((\d+)\)", lambda m: (int(m[1]),)),),
    ),
)

# The registry, by family name. Read at each use (never copied at import), so a
# family added here is seen by every path.
FAMILIES: dict[str, Family] = {f.name: f for f in _ALL}


def declared_type(name: str) -> tuple[Family, Declared] | None:
    """The family a declared type name (lowercase) defaults to, and its entry; None
    when no family declares it."""
    for family in FAMILIES.values():
        for declared in family.declared:
            if name in declared.names:
                return family, declared
    return None


def native_codes() -> dict[str, int]:
    """The compiled converter's code of each family that has one (``rowbinary.c``)."""
    return {f.name: f.native_code for f in FAMILIES.values() if f.native_code is not None}


def override_target(text: str) -> TargetType | None:
    """The target type an override text names, or None when it names none."""
    for family in FAMILIES.values():
        for pattern, params in family.overrides:
            match = re.fullmatch(pattern, text)
            if match is not None:
                return family.target(params(match))
    return None
