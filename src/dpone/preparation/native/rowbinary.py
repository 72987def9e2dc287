"""The compiled conversion (the C files beside this module): records to RowBinary, on all cores.

A converter held to the Python reference's bytes, and narrower by design: it takes a
range of records only when it can prove the reference accepts every value in it, and
otherwise *declines*, for the reference to convert and name what is wrong; it never
decides a refusal. The library is built from ``rowbinary.c`` and ``values_*.c`` by
``scripts/build_native.sh``; where it is missing or cannot run (no compiler, a
big-endian machine), callers use the reference. See docs/type-policy.md.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from dpone.connectors.bulk_text_codec import ColumnKind
from dpone.errors import DponeError
from dpone.preparation.modes import MODE_NATIVE
from dpone.typepolicy import ColumnPlan, registry

__all__ = [
    "MODE_NATIVE",
    "NativePart",
    "NativeUnavailable",
    "available",
    "column_spec",
    "convert_range",
    "unavailable_reason",
]
LIBRARY = Path(__file__).with_name("_rowbinary.so")
# Set to a false value ("0") to leave the compiled converter unused.
ENV_SWITCH = "DPONE_NATIVE"

_KINDS = {ColumnKind.TEXT: 0, ColumnKind.BINARY: 1, ColumnKind.RAW: 2}
# The code of each type family the C side knows (the registry's; a family without
# one is declined to the reference).
_FAMILIES = registry.native_codes()
_SPEC_WIDTH = 5
_INT32_MAX = (1 << 31) - 1
_INT64_MAX = (1 << 63) - 1
# The outcomes of dpone_rowbinary_convert.
_DONE, _DECLINED, _NO_MEMORY, _NO_DIGEST = 0, 1, 2, 3


class NativeUnavailable(DponeError):
    """The compiled converter failed to run (not a decline: a fault of its own)."""

    code = "native_unavailable"


class _Result(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("length", ctypes.c_uint64),
        ("rows", ctypes.c_uint64),
        ("rows_digest", ctypes.c_uint8 * 16),
    ]


@dataclass(frozen=True)
class NativePart:
    """One converted range: its RowBinary bytes, records and rows digest sum."""

    data: bytes
    rows: int
    rows_digest: int  # the sum of the rows' terms modulo 2**128 (see RowsDigest)


def _load() -> tuple[ctypes.CDLL | None, str | None]:
    """The library, or None and why not."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return None, f"is switched off ({ENV_SWITCH}={os.environ[ENV_SWITCH]})"
    if not LIBRARY.is_file():
        return None, "is not built (scripts/build_native.sh builds it)"
    try:
        library = ctypes.CDLL(str(LIBRARY))
    except OSError as exc:
        return None, f"cannot be loaded ({exc})"
    library.dpone_rowbinary_convert.restype = ctypes.c_int
    library.dpone_rowbinary_convert.argtypes = [
        ctypes.c_char_p,
        ctypes.c_uint64,
        ctypes.POINTER(ctypes.c_int32),
        ctypes.c_int,
        ctypes.c_int64,
        ctypes.POINTER(_Result),
    ]
    library.dpone_rowbinary_check.restype = ctypes.c_int
    library.dpone_rowbinary_check.argtypes = []
    if library.dpone_rowbinary_check() != 1:
        return None, "cannot run on this machine"
    return library, None


_LIBRARY, _UNAVAILABLE = _load()


def available() -> bool:
    """Whether the compiled converter is built, loads and can run on this machine."""
    return _LIBRARY is not None


def unavailable_reason() -> str | None:
    """Why the compiled converter is not available ("is switched off (...)"), or None."""
    if _LIBRARY is not None:
        return None
    return _UNAVAILABLE or "is not available"


def column_spec(plans: tuple[ColumnPlan, ...]) -> ctypes.Array[ctypes.c_int32] | None:
    """The converter's description of ``plans``, or None when it takes none of it.

    Left to the reference: decimals wider than 38 digits, fractional precision above 7
    (the reference's own limit of an Int64 of ticks), a parameter outside the C
    side's 32-bit integers (a huge FixedString width), a type family or column kind
    the C side does not know (a family added to the policy before the C side learns
    it), a plan without a resolved target type, and any pairing of column kind and type the policy does not produce (or no
    columns at all).
    """
    if not plans:
        return None
    values: list[int] = []
    for plan in plans:
        target = plan.target
        if target is None:
            return None  # no target to describe: the reference converts with the plan alone
        family, params = target.family, target.params
        known = registry.FAMILIES.get(family)
        if known is None or known.textual == (plan.kind is ColumnKind.RAW):
            return None
        if family == "decimal" and params[0] > 38:
            return None
        if family in ("datetime", "time", "dto") and params[0] > 7:
            return None
        first, second = (*params, 0, 0)[:2]
        if not (0 <= first <= _INT32_MAX and 0 <= second <= _INT32_MAX):
            return None
        if plan.kind not in _KINDS or family not in _FAMILIES:
            return None  # a family (or kind) the C side does not know: the reference's
        values += [_KINDS[plan.kind], _FAMILIES[family], first, second, int(plan.nullable)]
    return (ctypes.c_int32 * len(values))(*values)


def convert_range(
    spec: ctypes.Array[ctypes.c_int32],
    data: bytes,
    max_record_bytes: int | None = None,
    *,
    keep: bool = True,
) -> NativePart | None:
    """Convert ``data`` (whole LF-terminated records); None when it declines.

    The call releases the GIL (ctypes does for every foreign call), so ranges given to
    several threads convert side by side. ``keep`` False leaves the RowBinary out of
    the part (a validation needs only the verdict and the count).
    """
    if _LIBRARY is None:
        raise NativeUnavailable("the compiled converter is not available")
    if max_record_bytes is not None and not 0 < max_record_bytes <= _INT64_MAX:
        return None  # the C side reads 0 as no budget: the others decide such a budget
    result = _Result()
    columns = len(spec) // _SPEC_WIDTH
    status = _LIBRARY.dpone_rowbinary_convert(
        data, len(data), spec, columns, max_record_bytes or 0, ctypes.byref(result)
    )
    if status == _DECLINED:
        return None
    if status != _DONE:
        what = "out of memory" if status == _NO_MEMORY else "SHA-256 unavailable"
        raise NativeUnavailable(f"the compiled converter failed: {what}")
    # The bytes are this thread's buffer until its next call: copied now.
    converted = ctypes.string_at(result.data, result.length) if keep and result.length else b""
    return NativePart(converted, result.rows, int.from_bytes(bytes(result.rows_digest), "little"))
