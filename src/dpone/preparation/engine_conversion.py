"""The engine fast path: the same conversion, done by the embedded ClickHouse engine.

The pure-Python converter (:mod:`dpone.preparation.conversion` with the type policy) is
the specification. This module expresses the same acceptance rules and the same
bytes as SQL over the raw lines of the file, run by chdb in a child process of its
own. The policy, not the engine's lenient parsing, decides: every field is checked
with explicit rules before it is converted, values are built from exact integer
arithmetic on the digits (scaled decimals, ticks, days), and the file is read with
``LineAsString`` and split on TAB by us, so no TSV quirk (``\\N``, header detection,
escapes) applies. If the engine refuses anything, the caller runs the reference
converter, which names the first bad value exactly. Differential tests hold the two
to identical bytes and identical refusals.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dpone.connectors.bulk_text_codec import ColumnKind
from dpone.contracts.preparation import rows_digest_sql
from dpone.errors import DponeError
from dpone.preparation import engine_child
from dpone.sql import quote_literal
from dpone.typepolicy import ColumnPlan
from dpone.typepolicy.converters import MAX_DAY, MIN_DAY
from dpone.typepolicy.policy import target_of

MODE_ENGINE = "engine-chdb"
MARK = "\x1d"
# The engine's only accepted way to refuse: anything else means it could not run.
REFUSAL = "dpone: value refused by the policy"
_THROW_IF_FIRED = "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO"  # the engine's name for code 395
# Rows per block of the engine's conversion. The tiered query (the fallback) holds
# many more intermediate columns per block: at 8192 rows its checks of one 24 MiB range
# took about 140 MiB more than the engine's baseline, at 4096 about 95 (conversion: 62
# and 43), in the same time; the canonical query at 4096 saved only about 10.
BLOCK_ROWS = 8192
TIERED_BLOCK_ROWS = 4096
# How often a wait for the engine asks whether its deadline has passed.
POLL_SECONDS = 0.05
# How long a send that met a closed pipe waits for the child's exit status.
EXIT_WAIT_SECONDS = 2.0
# Files are read, not mapped: a mapped range would count in full in the engine's memory.
_READ_SETTING = "storage_file_read_method = 'pread'"
# The bounds of a range's length (see range_bytes).
MIN_RANGE_BYTES = 1 << 20
MAX_RANGE_BYTES = 24 << 20
# A record with no LF within this many bytes (or the record budget) is handed over.
MAX_CARRY_BYTES = 64 << 20


class EngineUnavailable(DponeError):
    """The engine could not run at all (not a refusal of the data)."""

    code = "engine_unavailable"


def _lit(text: str) -> str:
    return quote_literal(text)


def _digits(expr: str) -> str:
    return f"match({expr}, '^[0-9]+$')"


def _date_checks(d: str) -> tuple[str, str]:
    """(check, Int64 days since epoch) for a 'YYYY-MM-DD' expression."""
    check = (
        f"match({d}, '^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}$') AND {d} >= '1900-01-01' AND {d} <= '2299-12-31' "
        f"AND toString(toDate32OrNull({d})) = {d}"
    )
    return check, f"toInt64(toDate32OrZero({d}))"


def _clock(t: str, precision: int) -> tuple[str, str]:
    """(check, Int64 ticks since midnight) for 'HH:MM:SS[.f{1,9}]' expression ``t``."""
    frac = f"substring({t}, 10)"
    check = (
        f"match({t}, '^[0-9]{{2}}:[0-9]{{2}}:[0-9]{{2}}(\\\\.[0-9]{{1,9}})?$') "
        f"AND toUInt8OrZero(substring({t}, 1, 2)) <= 23 AND toUInt8OrZero(substring({t}, 4, 2)) <= 59 "
        f"AND toUInt8OrZero(substring({t}, 7, 2)) <= 59 "
        f"AND match(substring({frac}, {precision + 1}), '^0*$')"
    )
    seconds = (
        f"(toInt64(toUInt8OrZero(substring({t}, 1, 2))) * 3600 + toInt64(toUInt8OrZero(substring({t}, 4, 2))) * 60 "
        f"+ toInt64(toUInt8OrZero(substring({t}, 7, 2))))"
    )
    fraction = f"toInt64OrZero(rightPad(substring({frac}, 1, {precision}), {precision}, '0'))"
    return check, f"({seconds} * {10**precision} + {fraction})"


def field_expressions(plan: ColumnPlan, f: str) -> tuple[str, str]:
    """(check, value expression) for the non-NULL field ``f`` of ``plan``."""
    t = target_of(plan)
    fam, p = t.family, t.params
    raw_ok = f"isValidUTF8({f}) AND NOT match({f}, '[\\\\x1d\\\\r\\\\x1e\\\\x1f]')"
    if plan.kind is ColumnKind.TEXT:
        ok = (
            f"isValidUTF8({f}) AND NOT match({f}, '[\\\\r\\\\x1e\\\\x1f]') "
            f"AND ({f} = {_lit(MARK + 'E')} OR NOT match({f}, '\\\\x1d([^PTRNUS]|$)'))"
        )
        decoded = f
        for letter, char in (
            ("T", "\t"),
            ("R", "\r"),
            ("N", "\n"),
            ("U", "\x1f"),
            ("S", "\x1e"),
            ("P", MARK),
        ):
            decoded = f"replaceAll({decoded}, {_lit(MARK + letter)}, {_lit(char)})"
        value = f"if({f} = {_lit(MARK + 'E')}, '', {decoded})"
    elif plan.kind is ColumnKind.BINARY:
        ok = (
            f"({f} = {_lit(MARK + 'E')} OR match({f}, "
            "'^(?:[0-9A-Fa-f]{2}[ \\\\x0b\\\\x0c\\\\r]*)*[0-9A-Fa-f]{2}$'))"
        )
        value = f"if({f} = {_lit(MARK + 'E')}, '', unhex(replaceRegexpAll({f}, '[ \\\\x0b\\\\x0c\\\\r]', '')))"
    else:
        ok, value = raw_ok, ""
    if fam in ("string", "lowcardinality"):
        return ok, value
    if fam == "fixed":
        return f"{ok} AND length({value}) = {p[0]}", f"toFixedString({value}, {p[0]})"
    if fam in ("int", "uint"):
        # The engine's rendering of the parsed value is the canonical text: equal text
        # means canonical grammar and in range (out of range parses wrap or fail, and
        # render differently).
        ctype = f"{'' if fam == 'int' else 'U'}Int{p[0]}"
        return f"ifNull(toString(to{ctype}OrNull({f})) = {f}, 0)", f"to{ctype}OrZero({f})"
    if fam == "bool":
        return f"{ok} AND {f} IN ('0', '1')", f"toUInt8({f} = '1')"
    if fam == "decimal":
        precision, scale = p
        negative = f"startsWith({f}, '-')"
        dot = f"position({f}, '.')"
        # Digits before the point (sign excluded) and the fractional digits.
        whole = (
            f"substring({f}, 1 + {negative}, if({dot} > 0, {dot} - 1, length({f})) - {negative})"
        )
        frac = f"if({dot} > 0, substring({f}, {dot} + 1), '')"
        ok += (
            f" AND match({f}, '^-?(0|[1-9][0-9]*)(\\\\.[0-9]+)?$') "
            f"AND ({whole} = '0' OR length({whole}) <= {precision - scale}) "
            f"AND match(substring({frac}, {scale + 1}), '^0*$') "
            f"AND NOT ({negative} AND match({f}, '^-[0.]*$'))"
        )
        width = _decimal_width(precision)
        scaled = f"toInt256OrZero(concat({whole}, rightPad(substring({frac}, 1, {scale}), {scale}, '0')))"
        return ok, f"CAST(if({negative}, -{scaled}, {scaled}) AS Int{width})"
    if fam == "float":
        grammar = f"match({f}, '^-?(0|[1-9][0-9]*)(\\\\.[0-9]+)?([eE][-+]?[0-9]+)?$')"
        v64 = f"toFloat64OrZero({f})"
        if p[0] == 64:
            return f"{ok} AND {grammar} AND isFinite({v64})", f"toFloat64({v64})"
        v32 = f"toFloat32({v64})"
        exact = f"(toFloat64({v32}) = {v64} OR toFloat64OrZero(toString({v32})) = {v64})"
        return f"{ok} AND {grammar} AND isFinite({v32}) AND {exact}", v32
    if fam == "date":
        check, days = _date_checks(f)
        return f"{ok} AND {check}", f"toInt32({days})"
    if fam == "datetime":
        precision, whole_minutes = p[0], bool(p[1])
        d, clock = f"substring({f}, 1, 10)", f"substring({f}, 12)"
        dcheck, days = _date_checks(d)
        ccheck, ticks = _clock(clock, precision)
        ok += f" AND substring({f}, 11, 1) = ' ' AND {dcheck} AND {ccheck}"
        if whole_minutes:
            ok += f" AND substring({clock}, 7, 2) = '00' AND match(substring({clock}, 10), '^0*$')"
        return ok, f"toInt64({days} * {86400 * 10**precision} + {ticks})"
    if fam == "time":
        ccheck, ticks = _clock(f, p[0])
        return f"{ok} AND {ccheck}", f"toInt64({ticks})"
    if fam == "dto":
        precision = p[0]
        scale = 10**precision
        d = f"substring({f}, 1, 10)"
        clock = f"splitByChar(' ', {f})[2]"
        off = f"splitByChar(' ', {f})[3]"
        dcheck, days = _date_checks(d)
        ccheck, ticks = _clock(clock, precision)
        minutes = f"(toInt64(toUInt8OrZero(substring({off}, 2, 2))) * 60 + toInt64(toUInt8OrZero(substring({off}, 5, 2))))"
        signed = f"if(substring({off}, 1, 1) = '-', -{minutes}, {minutes})"
        utc = f"({days} * {86400 * scale} + {ticks} - {signed} * {60 * scale})"
        ok += (
            f" AND length(splitByChar(' ', {f})) = 3 AND substring({f}, 11, 1) = ' ' AND {dcheck} AND {ccheck} "
            f"AND match({off}, '^[+-][0-9]{{2}}:[0-9]{{2}}$') AND toUInt8OrZero(substring({off}, 5, 2)) <= 59 "
            f"AND {minutes} <= 840 "
            f"AND {utc} >= {MIN_DAY * 86400 * scale} AND {utc} < {(MAX_DAY + 1) * 86400 * scale}"
        )
        return ok, f"tuple(toInt64({utc}), toInt16({signed}))"
    if fam == "uuid":
        ok += f" AND match({f}, '^[0-9A-Fa-f]{{8}}-[0-9A-Fa-f]{{4}}-[0-9A-Fa-f]{{4}}-[0-9A-Fa-f]{{4}}-[0-9A-Fa-f]{{12}}$')"
        # Only that grammar gets here: the engine parses it exactly, in either case.
        return ok, f"toUUIDOrZero({f})"
    raise EngineUnavailable(
        f"no engine conversion for {plan.clickhouse_type}", code="engine_unsupported_type"
    )


def fast_expressions(plan: ColumnPlan, f: str) -> tuple[str, str | None] | None:
    """(check, value or None) of the fast tier for the non-NULL field ``f``, if it has one.

    The fast tier accepts only the canonical text a field is written in: the engine
    parses it natively and renders the parsed value back, and the field must equal
    that rendering (plus the policy's range where the engine's types are wider), or,
    for decimals, binary and float64, one of the spellings exporters write that the
    comments below name. Every
    text it accepts is accepted by :func:`field_expressions` with the same value
    (the differential tests check both claims value by value); anything else falls
    through to :func:`field_expressions`, evaluated only for those rows. ``None`` as
    the value means the full tier's value expression is already cheap and exact.
    """
    t = target_of(plan)
    fam, p = t.family, t.params
    if plan.kind is ColumnKind.BINARY and fam == "string":
        # Lowercase hex pairs or the empty marker, as the exporter writes them: the
        # engine's decoding renders back to the field. Whitespace and capitals fall
        # through to the full tier.
        empty = f"{f} = {_lit(MARK + 'E')}"
        return f"({empty} OR lower(hex(unhex({f}))) = {f})", f"if({empty}, '', unhex({f}))"
    if plan.kind is not ColumnKind.RAW:
        return None  # text: the full tier's checks are as cheap as any
    if fam == "bool":
        return f"{f} IN ('0', '1')", None
    if fam == "decimal":
        precision, scale = p
        if precision == scale:
            return None  # the whole part must be exactly '0': left to the full tier
        width = _decimal_width(precision)
        # The field with its fractional digits padded to the scale ('1' and '1.5' are
        # '1.50' at scale 2: exporters write plain decimals, and the full tier takes
        # them with that value). Its digits without the point, read as an integer, are
        # the scaled value the field means if the padded field is that integer's
        # decimal rendering; any other text (a failed read gives 0) renders
        # differently. An integer read is far cheaper than the engine's decimal parse.
        dot = f"position({f}, '.')"
        padded = (
            f"if({dot} = 0, concat({f}, '.{'0' * scale}'), "
            f"concat({f}, repeat('0', toUInt64(greatest({scale} - (length({f}) - {dot}), 0)))))"
            if scale
            else f
        )
        scaled = f"toInt{width}OrZero(replaceOne({padded}, '.', ''))"
        rendered = f"toDecimalString(reinterpret({scaled}, 'Decimal{width}({scale})'), {scale})"
        digits = f"length({padded}) - startsWith({f}, '-') - {scale + (scale > 0)}"
        # A point must have digits after it ('1.' is not a decimal).
        return (
            f"NOT endsWith({f}, '.') AND {rendered} = {padded} AND {digits} <= {precision - scale}",
            scaled,
        )
    if fam == "float" and p[0] == 64:
        # Shortest round-trip rendering: equal text means the parse was exact. Python's
        # repr (what exporters write) differs from it in three ways, all taken: a whole
        # number ends in '.0' ('100.0' for '100'); an exponent has a sign ('1.5e+300' for
        # '1.5e300'); and magnitudes below 1e-4 or from 1e16 have an exponent where the
        # engine may write none ('1.5e-05' for '0.000015', '1e+16'). For the last, any
        # text of the shape -?[1-9](\.[0-9]+)?e[-+][0-9]+ is taken (a subset of the
        # reference's grammar) with its exact parse, which must exist; the match runs
        # only where the comparisons failed in the conversion (lazily), on every field
        # in validation's eager checks.
        v = f"toFloat64OrNull({f})"
        r = f"toString({v})"
        whole = f"position({r}, '.') = 0 AND position({r}, 'e') = 0"
        exponent = f"(match({f}, '^-?[1-9](\\\\.[0-9]+)?e[-+][0-9]+$') AND isNotNull({v}))"
        same = f"({r} = {f} OR {r} = replaceOne({f}, 'e+', 'e') OR ({whole} AND concat({r}, '.0') = {f}) OR {exponent})"
        return f"ifNull({same}, 0) AND isFinite(assumeNotNull({v}))", f"assumeNotNull({v})"
    if fam == "date":
        v = f"toDate32OrNull({f})"
        in_range = f"{f} >= '1900-01-01' AND {f} <= '2299-12-31'"
        return f"ifNull(toString({v}) = {f}, 0) AND {in_range}", f"toInt32(assumeNotNull({v}))"
    if fam == "datetime" and not p[1]:
        v = f"toDateTime64OrNull({f}, {p[0]}, 'UTC')"
        in_range = f"{f} >= '1900-01-01' AND {f} < '2300-01-01'"
        return (
            f"ifNull(toString({v}) = {f}, 0) AND {in_range}",
            f"reinterpret(assumeNotNull({v}), 'Int64')",
        )
    if fam == "uuid":
        return f"ifNull(toString(toUUIDOrNull({f})) = {f}, 0)", None
    return None


def tiered_expressions(plan: ColumnPlan, f: str) -> tuple[str, str]:
    """(check, value) for the non-NULL field ``f``: the fast tier, else the full one."""
    ok, value = field_expressions(plan, f)
    fast = fast_expressions(plan, f)
    if fast is None:
        return ok, value
    fast_ok, fast_value = fast
    # ``or`` and ``if`` are evaluated lazily: the full tier runs only for the rows the
    # fast tier did not accept.
    return (
        f"(({fast_ok}) OR ({ok}))",
        value if fast_value is None else f"if({fast_ok}, {fast_value}, {value})",
    )


def canonical_expressions(plan: ColumnPlan, f: str) -> tuple[str, str]:
    """(check, value) of the canonical query: the fast tier alone where there is one.

    It accepts a subset of what :func:`tiered_expressions` accepts, with the same
    values, and none of the full tier's expressions are in it, so the engine plans and
    runs it in less time. A range it refuses is converted again by the tiered query,
    which alone decides (see :meth:`EngineSession.submit`).
    """
    ok, value = field_expressions(plan, f)
    fast = fast_expressions(plan, f)
    if fast is None:
        return ok, value
    fast_ok, fast_value = fast
    return fast_ok, value if fast_value is None else fast_value


def _decimal_width(precision: int) -> int:
    return 32 if precision <= 9 else 64 if precision <= 18 else 128 if precision <= 38 else 256


def wire_type(plan: ColumnPlan) -> str:
    """The type :func:`field_expressions` produces for ``plan``.

    Its RowBinary bytes are exactly the target type's (ticks and days are the
    integers the target types store), so the spool reads back under it without any
    engine support for the target type itself.
    """
    t = target_of(plan)
    fam, p = t.family, t.params
    if fam in ("string", "lowcardinality"):
        base = "String"
    elif fam == "fixed":
        base = f"FixedString({p[0]})"
    elif fam in ("int", "uint"):
        base = f"{'' if fam == 'int' else 'U'}Int{p[0]}"
    elif fam == "bool":
        base = "UInt8"
    elif fam == "decimal":
        base = f"Int{_decimal_width(p[0])}"
    elif fam == "float":
        base = f"Float{p[0]}"
    elif fam == "date":
        base = "Int32"
    elif fam in ("datetime", "time"):
        base = "Int64"
    elif fam == "dto":
        base = "Tuple(Int64, Int16)"
    elif fam == "uuid":
        base = "UUID"
    else:
        raise EngineUnavailable(
            f"no engine conversion for {plan.clickhouse_type}", code="engine_unsupported_type"
        )
    return f"Nullable({base})" if plan.nullable else base


def digest_sql(plans: tuple[ColumnPlan, ...], spool: Path) -> str:
    """One SELECT over the written spool: its row count and its rows digest.

    Each row is read back under :func:`wire_type` and re-encoded by
    ``formatRow`` (see :func:`rows_digest_sql`), which gives back its exact RowBinary bytes.
    """
    names = [f"c{i}" for i in range(1, len(plans) + 1)]
    structure = ", ".join(f"{n} {wire_type(p)}" for n, p in zip(names, plans, strict=True))
    return (
        f"SELECT count(), {rows_digest_sql(names)} "
        f"FROM file({_lit(str(spool))}, 'RowBinary', {_lit(structure)}) "
        f"SETTINGS {_READ_SETTING}"
    )


def conversion_sql(
    plans: tuple[ColumnPlan, ...],
    source: Path,
    out: Path,
    max_record_bytes: int | None = None,
    *,
    canonical: bool = False,
    lazy: bool = True,
) -> str:
    """One SELECT that checks every field (and the record length) and writes RowBinary.

    With ``canonical``, each field is held to :func:`canonical_expressions`, else to
    :func:`tiered_expressions`. ``lazy`` evaluates ``if``/``and``/``or`` arguments
    only for the rows that need them (the tiered query's full checks run only where
    the fast tier failed); without it every argument runs on every row, which is
    cheaper for small expressions but would let an expression that throws on
    malformed text fail the query instead of refusing it.
    """
    expressions = canonical_expressions if canonical else tiered_expressions
    columns, checks = [], [f"length(r) = {len(plans)}"]
    if max_record_bytes is not None:
        checks.append(f"length(line) < {max_record_bytes}")  # the LF counts too
    for i, plan in enumerate(plans, start=1):
        f = f"r[{i}]"
        ok, value = expressions(plan, f)
        if plan.nullable:
            columns.append(f"if({f} = '', NULL, {value}) AS c{i}")
            checks.append(f"({f} = '' OR ({ok}))")
        else:
            columns.append(f"{value} AS c{i}")
            checks.append(f"({f} != '' AND ({ok}))")
    return (
        f"SELECT {', '.join(columns)} FROM (SELECT line, splitByChar('\\t', line) AS r "
        f"FROM file({_lit(str(source))}, 'LineAsString', 'line String')) "
        f"WHERE throwIf(NOT ({' AND '.join(checks)}), {_lit(REFUSAL)}) = 0 "
        f"INTO OUTFILE {_lit(str(out))} TRUNCATE FORMAT RowBinary "
        # Small blocks keep the engine's memory flat; ranges give the parallelism.
        f"SETTINGS max_threads = 1, input_format_parallel_parsing = 0, "
        f"max_block_size = {BLOCK_ROWS if canonical else TIERED_BLOCK_ROWS}, "
        # Exact float parsing, as the reference's; lazy ``or``/``if`` for the two tiers.
        f"precise_float_parsing = 1, short_circuit_function_evaluation = '{'force_enable' if lazy else 'disable'}', "
        f"{_READ_SETTING}"
    )


def run_engine_query(sql: str, *, timeout: float = 120.0, python: str | None = None) -> bytes:
    """Run one query in a fresh engine process and return its TSV output (for checks)."""
    with tempfile.TemporaryDirectory(prefix="dpone-engine-") as work:
        script = Path(work) / "query.sql"
        script.write_text(sql, encoding="utf-8")
        done = subprocess.run(
            [python or sys.executable, "-c", _CHILD, str(script)],
            cwd=work,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
            env=os.environ | {"TMPDIR": work},  # the engine's own directory goes with work
        )
    if done.returncode != 0:
        raise EngineUnavailable(
            f"engine query failed: {done.stderr.decode('utf-8', 'replace')[-500:]}"
        )
    return done.stdout


# Runs each script in turn in one engine and writes their TSV output to stdout.
_CHILD = """
import sys
import chdb
conn = chdb.connect(":memory:")
# Generated checks make long statements; the default 256 KiB parse limit is too small.
conn.query("SET max_query_size = 1073741824", "TSV")
try:
    for path in sys.argv[1:]:
        sql = open(path, encoding="utf-8").read()
        sys.stdout.buffer.write(conn.query(sql, "TSV").bytes())
except Exception as exc:
    print(str(exc)[:2000], file=sys.stderr)
    sys.exit(3)
"""

_DIGEST_LINE = re.compile(r"([0-9]+)\t([0-9a-f]{32})\n")


@dataclass(frozen=True)
class EngineSpool:
    """What the engine wrote: the spool's row count and rows digest, read back from it."""

    rows: int
    rows_digest: str


class EngineSession:
    """One engine child process for a whole preparation (or validation), in parallel.

    Started as early as possible (it takes a noticeable fraction of a second to load),
    fed one job per range of records (for a preparation: convert, then read the part
    back for its row count and rows digest; for a validation: the checks alone) and
    answering per job. Each worker thread has a connection of its own (see
    :data:`dpone.preparation.engine_child.PROGRAM`),
    so ranges are converted side by side while the parent reads and spills the next
    ones. ``close`` ends it; if the parent dies first, the child sees its stdin close
    and ends after the jobs it holds.
    """

    def __init__(
        self,
        work_dir: Path | None = None,
        *,
        workers: int | None = None,
        python: str | None = None,
    ) -> None:
        """``work_dir``: where the caller's range files go, and where a child started
        here runs; by default the child's own home (see
        :func:`dpone.preparation.engine_child.start_at_home`), removed when the session
        closes."""
        self.workers = workers or engine_child.default_workers()
        # Jobs a caller keeps submitted ahead: two per worker, so a worker that
        # finishes takes the next range at once instead of waiting for it to be
        # read and spilled (measured: one worker idle ~0.2 s per range at 1 + workers).
        self.in_flight = 2 * self.workers
        child = engine_child.take_early(self.workers, python)
        try:
            if child is None and work_dir is not None:
                child = engine_child.start(self.workers, work_dir, python=python)
            elif child is None:
                child = engine_child.start_at_home(self.workers, python=python)
        except engine_child.ScratchUnusable as exc:
            raise EngineUnavailable(
                f"the engine could not start: {exc.strerror}",
                code="engine_scratch",
                path=exc.filename,
            ) from exc
        except OSError as exc:
            raise EngineUnavailable(f"the engine could not start: {exc}") from exc
        home = work_dir or child.home
        assert home is not None  # a child started here without work_dir has a home
        self.work_dir = home
        self._child = child
        self._process = child.process
        self._ready = False
        self._buffer = bytearray()  # answer bytes read but not yet taken
        self._fallbacks: dict[int, list[str]] = {}  # job -> statements if refused

    def submit(self, job: int, statements: list[str], fallback: list[str] | None = None) -> None:
        """Queue ``statements`` (run in order, on one worker) as job ``job``.

        If the policy refuses in ``statements`` and a ``fallback`` is given, the job
        runs again as ``fallback``, and only the fallback's answer is the job's.
        """
        if fallback is None:
            self._fallbacks.pop(job, None)
        else:
            self._fallbacks[job] = fallback
        self._send(job, statements)

    def _send(self, job: int, statements: list[str]) -> None:
        assert self._process.stdin is not None
        line = json.dumps({"id": job, "sql": statements}) + "\n"
        try:
            self._process.stdin.write(line.encode("utf-8"))
            self._process.stdin.flush()
        except OSError as exc:
            # A broken pipe: the child ended or is ending. Say how, as a read would.
            try:
                self._process.wait(timeout=EXIT_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                raise EngineUnavailable(f"the engine stopped taking work: {exc}") from exc
            raise self._exited() from exc

    def _exited(self) -> EngineUnavailable:
        """The error for a child that has ended: its exit status and its log's tail."""
        tail = self._child.log_tail()
        return EngineUnavailable(
            f"the engine exited ({self._process.returncode})" + (f": {tail}" if tail else "")
        )

    def next_result(self, expired: Callable[[], bool]) -> tuple[int, str | None]:
        """The next finished job: (id, its output), or (id, None) when the policy refused.

        ``expired()`` is asked while waiting (the caller's clock decides, so an injected
        clock works as in the reference path); once true it raises ``engine_timeout``.
        """
        while True:
            answer = self._read_line(expired)
            if answer["id"] == -1:
                self._ready = True
                continue
            fallback = self._fallbacks.pop(answer["id"], None)
            if "error" in answer:
                if _refused(answer["error"]):
                    if fallback is not None:
                        self._send(answer["id"], fallback)
                        continue
                    return answer["id"], None
                raise EngineUnavailable(
                    f"engine conversion failed to run: {answer['error'][-500:]}"
                )
            return answer["id"], answer["out"]

    def _read_line(self, expired: Callable[[], bool]) -> dict[str, Any]:
        """The next answer line. Answers are read unbuffered into our own buffer: a
        buffered ``readline`` could take two answers from the pipe at once and leave
        the second where ``select`` cannot see it, waiting for an answer already here."""
        stdout = self._process.stdout
        assert stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while (end := self._buffer.find(b"\n")) < 0:
                if not selector.select(POLL_SECONDS):
                    if expired():
                        raise EngineUnavailable(
                            "engine conversion exceeded its deadline", code="engine_timeout"
                        )
                    continue
                data = os.read(stdout.fileno(), 1 << 16)
                if not data:
                    self._process.wait()
                    raise self._exited()
                self._buffer += data
        line = bytes(self._buffer[: end + 1])
        del self._buffer[: end + 1]
        document: dict[str, Any] = json.loads(line)
        return document

    def close(self) -> None:
        """End the child (at once: a finished preparation has nothing left for it)."""
        self._child.end()

    def __enter__(self) -> EngineSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _refused(error: str) -> bool:
    """Whether the engine's ``error`` is the policy's refusal: our throwIf fired. Any
    other failure (a memory limit, say) may quote the refusal text in the expression
    it names, but carries its own error code."""
    return REFUSAL in error and _THROW_IF_FIRED in error


class ReadsInto(Protocol):
    """A binary stream that reads into a caller's buffer (a file opened ``rb``)."""

    def readinto(self, buffer: memoryview, /) -> int | None: ...


class RecordRanges:
    """Whole-record ranges of a stream: iterate for ``(data, end)``, ``data[:end]`` the range.

    A range is about ``chunk_bytes`` long and ends at an LF; ``data`` is reused, so a
    range is valid only until the next one is asked for. After iteration,
    ``too_long`` says a record grew past ``carry_limit`` bytes without an LF (iteration
    stopped there) and ``trailing`` holds the bytes after the last LF (a final record
    without its LF): both are for the reference to name exactly.
    """

    def __init__(self, stream: ReadsInto, chunk_bytes: int, carry_limit: int) -> None:
        self.stream = stream
        self.chunk_bytes = chunk_bytes
        self.carry_limit = max(carry_limit, chunk_bytes)
        self.too_long = False
        self.trailing = b""

    def __iter__(self) -> Iterator[tuple[bytearray, int]]:
        # One buffer, read into and reused: a range valid until the next step costs its
        # length in memory once (joining carry and chunk as bytes held it twice).
        buffer = bytearray()
        carry = 0  # bytes of an unfinished record at the start of the buffer
        while True:
            need = carry + self.chunk_bytes
            if len(buffer) < need:
                buffer.extend(bytes(need - len(buffer)))
            with memoryview(buffer) as view:
                got = self.stream.readinto(view[carry:need])
            if got is None:
                raise BlockingIOError("record ranges need a blocking stream")
            if not got:
                break
            filled = carry + got
            end = buffer.rfind(b"\n", carry, filled) + 1  # the carry holds no LF
            if end == 0:
                carry = filled  # inside one long record: read on until its LF
                if carry > self.carry_limit:
                    self.too_long = True
                    return
                continue
            yield buffer, end
            carry = filled - end
            buffer[:carry] = buffer[end:filled]
        self.trailing = bytes(buffer[:carry])


def range_bytes(total: int, workers: int, bounds: tuple[int, int] | None = None) -> int:
    """How long the ranges of a ``total``-byte file are: two per worker, within bounds
    (``bounds``, else the engine's :data:`MIN_RANGE_BYTES` and :data:`MAX_RANGE_BYTES`).

    Each range costs the engine a fixed ~27 ms to plan its canonical conversion
    (~57 ms the tiered one; measured on a 1M-row file: 17 ranges of 8 MiB took 2.5 s
    on two workers, 4 ranges 1.9 s), so ranges are as long as :data:`MAX_RANGE_BYTES`
    allows; the bound keeps memory and scratch space flat (a worker's memory grows
    with its range: about 38 MB more at 32 MiB than at 8 MiB, and the tree's 10M-row
    peak reached 519 MiB at 32 MiB). The bounds are read at each call, so a test can
    make ranges tiny.
    """
    low, high = bounds or (MIN_RANGE_BYTES, MAX_RANGE_BYTES)
    return min(high, max(low, -(-total // (2 * workers))))


def spill_range(path: Path, data: bytes | bytearray, end: int, digest: Any) -> int:
    """Hash ``data[:end]`` into ``digest`` and write it to a new private file; its records.

    The engine reads exactly the bytes that were hashed, so they are provably the
    receipt's. No copy of the range is made on the way.
    """
    piece = memoryview(data)[:end]
    try:
        digest.update(piece)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with open(fd, "wb") as out:
            out.write(piece)
    except OSError as exc:
        # The engine's scratch (often tmpfs, shared with other programs) is full or
        # gone: the engine cannot go on, and the caller decides what that means.
        raise EngineUnavailable(
            f"cannot write a range to the engine's scratch directory {path.parent}: "
            f"{exc.strerror or exc}; set {engine_child.SCRATCH_ENV} to a directory with room",
            code="engine_scratch",
            path=str(path.parent),
        ) from exc
    finally:
        piece.release()
    return data.count(b"\n", 0, end)


def check_sql(
    plans: tuple[ColumnPlan, ...],
    source: Path,
    max_record_bytes: int | None = None,
    *,
    canonical: bool = False,
) -> str:
    """The checks of :func:`conversion_sql` alone: the number of records, or a refusal.

    The canonical checks run eagerly: none of them throws on any text (they parse
    with ``OrNull``/``OrZero`` and compare), and evaluating them lazily cost half as
    much again (0.56 s against 0.27 s for 240k rows; conversion is the same either
    way). Should one throw after all, the engine fails and validation falls back to
    the reference.
    """
    sql = conversion_sql(
        plans, source, Path("/dev/null"), max_record_bytes, canonical=canonical, lazy=not canonical
    )
    head, tail = sql.index(" FROM (SELECT line,"), sql.index(" INTO OUTFILE")
    settings = sql[sql.index(" SETTINGS ") :]
    return f"SELECT count(){sql[head:tail]}{settings}"


def range_statements(
    plans: tuple[ColumnPlan, ...],
    source: Path,
    out: Path,
    max_record_bytes: int | None = None,
    *,
    canonical: bool = False,
) -> list[str]:
    """Convert the records in ``source`` into ``out``, then read ``out`` back for its digest."""
    return [
        conversion_sql(plans, source, out, max_record_bytes, canonical=canonical),
        digest_sql(plans, out),
    ]


def conversion_job(
    plans: tuple[ColumnPlan, ...], source: Path, out: Path, max_record_bytes: int | None = None
) -> tuple[list[str], list[str]]:
    """A range's job for :meth:`EngineSession.submit`: the canonical conversion (and
    digest) first, the tiered one as its fallback, which alone decides a refusal."""
    return (
        range_statements(plans, source, out, max_record_bytes, canonical=True),
        range_statements(plans, source, out, max_record_bytes),
    )


def check_job(
    plans: tuple[ColumnPlan, ...], source: Path, max_record_bytes: int | None = None
) -> tuple[list[str], list[str]]:
    """A range's job for :meth:`EngineSession.submit` in validation: the canonical
    checks first, the tiered ones as their fallback."""
    return (
        [check_sql(plans, source, max_record_bytes, canonical=True)],
        [check_sql(plans, source, max_record_bytes)],
    )


def parse_digest(out: str) -> EngineSpool:
    """The engine's answer to :func:`digest_sql`."""
    answer = _DIGEST_LINE.fullmatch(out)
    if answer is None:
        raise EngineUnavailable(
            f"engine digest output is malformed: {out[:200]!r}", code="engine_output"
        )
    return EngineSpool(int(answer.group(1)), answer.group(2))


def convert_with_engine(
    plans: tuple[ColumnPlan, ...],
    source: Path,
    out: Path,
    *,
    timeout: float,
    python: str | None = None,
) -> EngineSpool | None:
    """Convert all of ``source`` into ``out`` in one engine; None when the policy refused.

    The same engine then reads the spool it wrote back and computes its rows digest
    (:class:`dpone.contracts.preparation.RowsDigest`) from the bytes on disk.
    """
    deadline = time.monotonic() + timeout
    with EngineSession(workers=1, python=python) as session:
        # Absolute paths: the child runs in an empty directory of its own.
        session.submit(0, *conversion_job(plans, source.absolute(), out.absolute()))
        _, answer = session.next_result(lambda: time.monotonic() >= deadline)
    return None if answer is None else parse_digest(answer)
