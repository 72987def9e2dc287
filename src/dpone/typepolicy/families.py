"""The type policy's families, by what they hold: how a source names its column types.

A source maps each of its own type names onto one of these; what it gets is the
declared type the policy, its receipts and its renderers read (they were first
written for SQL Server, so that is the spelling, e.g. ``datetime2(6)``). A source
never needs to know that spelling: ``timestamp(6)`` of PostgreSQL is
``families.timestamp(6)``, its ``int4`` is ``families.integer(32)``. The rules of
each family (target type, text grammar, range) are in ``docs/type-policy.md``; the
families themselves, each defined once, in ``registry.py``.
"""

from __future__ import annotations

from dpone.errors import PolicyError
from dpone.typepolicy import registry

_INTEGERS = {8: "tinyint", 16: "smallint", 32: "int", 64: "bigint"}


def integer(bits: int) -> str:
    """A signed integer of 16, 32 or 64 bits (``bits`` 8: unsigned, 0..255)."""
    return _INTEGERS[bits]


def boolean() -> str:
    """True or false (``Bool``)."""
    return "bit"


def decimal(precision: int, scale: int) -> str:
    """An exact decimal of at most 38 digits, ``scale`` of them after the point."""
    return f"decimal({precision}, {scale})"


def float32() -> str:
    """An IEEE binary32 value (``Float32``)."""
    return "real"


def float64() -> str:
    """An IEEE binary64 value (``Float64``)."""
    return "float(53)"


def date() -> str:
    """A calendar date (``Date32``: 1900-01-01 .. 2299-12-31)."""
    return "date"


def timestamp(digits: int) -> str:
    """A date and time of day, ``digits`` (0-7) fractional digits, without a time zone;
    a source with instants writes them in UTC (``DateTime64(digits, 'UTC')``)."""
    return f"datetime2({digits})"


def time(digits: int) -> str:
    """A time of day with ``digits`` (0-7) fractional digits (``Time64``)."""
    return f"time({digits})"


def uuid() -> str:
    """A UUID."""
    return "uniqueidentifier"


def text() -> str:
    """Unicode text of any length (``String``, UTF-8)."""
    return "nvarchar(max)"


def binary() -> str:
    """Bytes of any length (``String``)."""
    return "varbinary(max)"


def declared(name: str, *params: int) -> str:
    """Any declared type of the registry by its name, ``declared("datetime2", 3)``: how
    a source names a family added to ``registry.py`` that has no function here."""
    if registry.declared_type(name) is None:
        raise PolicyError(
            f"no type family declares {name!r}", code="unsupported_type", source_type=name
        )
    return f"{name}({', '.join(str(p) for p in params)})" if params else name
