"""The registry of types (``typepolicy/registry.py``) is the only table of type families.

Issue 34: a family lived in six tables under three naming schemes. These tests hold
that every family has every facet, that the compiled converter's and the compiled
renderer's tables are the registry's (and the numbers their C code expects), that a
family without a compiled code is declined to the reference, never a ``KeyError``,
and that a family added to the registry alone is planned, rendered, exported and
converted with no other file changed.
"""

from __future__ import annotations

import ipaddress
import re
import sqlite3
from pathlib import Path

import pytest

from dpone.connectors.bulk_text_codec import Cell, ColumnKind
from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.errors import PolicyError
from dpone.exporters import native_render, render
from dpone.exporters.export import export_table
from dpone.exporters.sources import SqliteSource
from dpone.preparation import native_conversion
from dpone.preparation.file_validation import validate_file
from dpone.preparation.native import rowbinary
from dpone.preparation.spool import MODE_NATIVE, MODE_PYTHON, prepare_rowbinary
from dpone.typepolicy import Refused, converters, families, plan_column, plan_columns, registry
from dpone.typepolicy.policy import target_of
from dpone.typepolicy.renderers import RenderError
from dpone.typepolicy.source_types import SourceType, parse_source_type

ROOT = Path(__file__).resolve().parents[2]
# A family no declared type defaults to is reached by an override: how to plan one.
OVERRIDDEN = {"lowcardinality": ("nvarchar(10)", "LowCardinality(String)")}


def _c_enum(path: Path, prefix: str) -> dict[str, int]:
    """The members of the C enum whose names start with ``prefix``, by lowercase name."""
    text = path.read_text(encoding="utf-8")
    body = re.search(r"enum\s*\{([^}]*\b" + prefix + r"\w+[^}]*)\}", text)
    assert body is not None, (path, prefix)
    numbers: dict[str, int] = {}
    following = 0
    for item in body[1].split(","):
        name, _, value = item.strip().partition("=")
        name, value = name.strip(), value.strip()
        if value and not value.isdigit():
            continue  # an alias of an earlier member (OP_LAST = OP_BINARY)
        following = int(value) if value else following
        numbers[name.removeprefix(prefix).lower()] = following
        following += 1
    return numbers


def _targets(family: registry.Family) -> list[tuple[ColumnKind, registry.TargetType, str]]:
    """The plans' targets of each declared type of ``family`` (or of its override)."""
    found = []
    for declared in family.declared:
        for name in declared.names:
            plan = plan_column(SourceColumn("c", name, True))
            found.append((plan.kind, target_of(plan), name))
    if family.name in OVERRIDDEN:
        source_type, override = OVERRIDDEN[family.name]
        plan = plan_column(SourceColumn("c", source_type, True), override)
        found.append((plan.kind, target_of(plan), source_type))
    return found


def test_every_family_has_every_facet() -> None:
    renderings = {r.name: r for r in registry.RENDERINGS}
    assert len(renderings) == len(registry.RENDERINGS)
    for name, family in registry.FAMILIES.items():
        assert family.name == name
        assert family.native_code is None or family.native_code > 0
        targets = _targets(family)
        assert targets, f"{name}: no declared type and no override reaches it"
        for kind, target, source_type in targets:
            assert target.family == name
            assert target.text == family.text(target.params)
            assert family.textual == (kind is not ColumnKind.RAW), source_type
            assert callable(target.encoder())
        for declared in family.declared:
            assert declared.names and 0 <= declared.arity[0] <= declared.arity[1]
            for type_name in declared.names:
                assert parse_source_type(type_name, column="c").name == type_name
                assert registry.declared_type(type_name) == (family, declared)
                rendering = declared.rendering(SourceType(type_name))
                assert renderings[rendering.name] is rendering
                assert rendering.kind is declared.kind
                assert render.renderer_for(SourceType(type_name)) is rendering.render


def test_the_compiled_tables_are_the_registrys_with_the_c_codes() -> None:
    codes = {f.name: f.native_code for f in registry.FAMILIES.values() if f.native_code}
    assert codes == rowbinary._FAMILIES
    c_families = _c_enum(ROOT / "src/dpone/preparation/native/rowbinary.c", "FAM_")
    # LowCardinality(String) is converted as String: the same bytes.
    assert codes == c_families | {"lowcardinality": c_families["string"]}
    ops = {r.name: r.op for r in registry.RENDERINGS if r.op is not None}
    assert ops == native_render._OPS
    assert ops == _c_enum(ROOT / "src/dpone/exporters/native/render.h", "OP_")
    assert native_render._KINDS == {"text": ColumnKind.TEXT, "binary": ColumnKind.BINARY}
    assert {r.render: r.name for r in registry.RENDERINGS} == render.FAMILIES


# ----------------------------------------------------------------------------- a new family


def _ipv4(params: registry.Params) -> converters.Encoder:
    def encode(value: str | bytes) -> bytes:
        if not isinstance(value, str):
            raise Refused("is bytes, not text", code="invalid_value")
        try:
            address = ipaddress.IPv4Address(value)
        except ValueError as exc:
            raise Refused("is not an IPv4 address", code="invalid_value") from exc
        return int(address).to_bytes(4, "little")

    return encode


def _render_ipv4(value: object) -> Cell:
    if isinstance(value, ipaddress.IPv4Address | str):
        return str(value)
    raise RenderError(f"cannot render {type(value).__name__} as an IPv4 address")


IPV4 = registry.Family(
    "ipv4",
    text=lambda p: "IPv4",
    convert=_ipv4,
    native_code=None,  # the C side does not know it
    declared=(
        registry.Declared(
            ("ipv4",),
            ColumnKind.RAW,
            lambda st: (),
            lambda st: registry.Rendering("ipv4", _render_ipv4),
        ),
    ),
    overrides=((r"IPv4", lambda m: ()),),
)
COLUMNS = [SourceColumn("id", "int", False), SourceColumn("addr", "ipv4", True)]
RECORDS = b"1\t10.0.0.1\n2\t\n3\t255.255.255.254\n"  # an empty field is NULL
# RowBinary: Int32 LE, then the nullable flag and the address as UInt32 LE.
ROWBINARY = (
    b"\x01\x00\x00\x00\x00\x01\x00\x00\x0a"
    + b"\x02\x00\x00\x00\x01"
    + b"\x03\x00\x00\x00\x00\xfe\xff\xff\xff"
)


@pytest.fixture
def ipv4(monkeypatch: pytest.MonkeyPatch) -> registry.Family:
    """The IPv4 family, added to the registry and nowhere else."""
    monkeypatch.setitem(registry.FAMILIES, "ipv4", IPV4)
    return IPV4


def _prepared(path: Path, tmp_path: Path, mode: str) -> tuple[bytes, str]:
    """The RowBinary a preparation in ``mode`` writes of ``path``, and its converter."""
    schema = SourceSchema.of(COLUMNS)
    receipt = validate_file(path, schema, mode=mode)
    spool = prepare_rowbinary(path, receipt, tmp_path / f"spool-{mode}", mode=mode)
    assert spool.identity.prepared_rows == 3
    return spool.path.read_bytes(), spool.converter


def test_a_family_without_a_compiled_code_is_declined_to_the_reference(
    ipv4: registry.Family, tmp_path: Path
) -> None:
    plans = plan_columns(COLUMNS)
    assert [p.clickhouse_type for p in plans] == ["Int32", "Nullable(IPv4)"]
    assert rowbinary.column_spec(plans) is None  # never a KeyError
    path = tmp_path / "in.tsv"
    path.write_bytes(RECORDS)
    assert _prepared(path, tmp_path, MODE_PYTHON) == (ROWBINARY, MODE_PYTHON)
    if not rowbinary.available():
        pytest.skip(f"the compiled converter {rowbinary.unavailable_reason()}")
    assert rowbinary.column_spec(plans[:1]) is not None
    assert native_conversion.not_taken(plans) == "does not take Nullable(IPv4)"
    assert _prepared(path, tmp_path, MODE_NATIVE) == (ROWBINARY, MODE_PYTHON)


def test_a_family_added_to_the_registry_alone_is_planned_rendered_and_exported(
    ipv4: registry.Family, tmp_path: Path
) -> None:
    plan = plan_column(SourceColumn("addr", families.declared("ipv4"), False))
    assert (plan.kind, plan.clickhouse_type) == (ColumnKind.RAW, "IPv4")
    assert plan.encode("192.168.0.1") == b"\x01\x00\xa8\xc0"
    with pytest.raises(Refused) as caught:
        plan.encode("256.0.0.1")
    assert caught.value.code == "invalid_value"
    assert plan_column(COLUMNS[1], "IPv4").clickhouse_type == "Nullable(IPv4)"
    with pytest.raises(PolicyError) as refused:
        plan_column(SourceColumn("addr", "ipv4(4)", False))
    assert refused.value.code == "unsupported_type"
    st = parse_source_type("ipv4", column="addr")
    assert render.renderer_for(st)(ipaddress.IPv4Address("10.0.0.1")) == "10.0.0.1"
    column = plan.codec_column
    assert native_render.ops_for([st], [column]) is None  # the Python renderer writes it
    # A SQLite table declaring the new type exports and prepares with nothing else added.
    with sqlite3.connect(tmp_path / "src.db") as conn:
        conn.execute("CREATE TABLE t (id int NOT NULL, addr ipv4)")
        conn.executemany(
            "INSERT INTO t VALUES (?, ?)", [(1, "10.0.0.1"), (2, None), (3, "255.255.255.254")]
        )
    result = export_table(SqliteSource(tmp_path / "src.db"), "t", tmp_path / "out.tsv")
    assert result.receipt.schema.columns == tuple(COLUMNS)
    assert result.path.read_bytes() == RECORDS
    assert _prepared(result.path, tmp_path, MODE_PYTHON) == (ROWBINARY, MODE_PYTHON)


def test_a_declared_name_no_family_has_is_refused_by_the_families_helper() -> None:
    with pytest.raises(PolicyError) as caught:
        families.declared("ipv4")
    assert caught.value.code == "unsupported_type"
    assert families.declared("datetime2", 6) == families.timestamp(6)


@pytest.mark.parametrize("declared", ["float(max)", "float(0)", "float(54)"])
def test_a_float_width_that_is_not_1_to_53_is_refused_when_planned(declared: str) -> None:
    """Before: ``float(max)`` was planned as Float64 and its rendering failed on
    ``int('max')``, an internal error where a coded refusal belongs."""
    with pytest.raises(PolicyError) as refused:
        plan_column(SourceColumn("f", declared, True))
    assert refused.value.code == "unsupported_type"
    assert "float(n) needs 1 <= n <= 53" in refused.value.message
