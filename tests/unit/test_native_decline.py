"""A type family the compiled converter does not know is declined, and the reference
converts its file to the same bytes (issue 34: the lookup raised ``KeyError``, which a
user saw as an internal error)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.preparation import native_conversion
from dpone.preparation.file_validation import validate_file
from dpone.preparation.native import rowbinary
from dpone.preparation.spool import MODE_NATIVE, MODE_PYTHON, prepare_rowbinary
from dpone.typepolicy import plan_column, plan_columns

COLUMNS = [SourceColumn("id", "int", False), SourceColumn("name", "nvarchar(20)", True)]
RECORDS = b"1\tone\n-2147483648\t\\N\n2147483647\t\xce\x94\n"


def _spool_bytes(path: Path, tmp_path: Path, name: str, mode: str) -> tuple[bytes, str]:
    """The spool a preparation in ``mode`` writes, and the converter that wrote it."""
    schema = SourceSchema.of(COLUMNS)
    receipt = validate_file(path, schema, mode=mode)
    assert receipt == validate_file(path, schema, mode=MODE_PYTHON)
    spool = prepare_rowbinary(path, receipt, tmp_path / name, mode=mode)
    assert spool.identity.prepared_rows == 3
    return spool.path.read_bytes(), spool.converter


def test_a_family_the_c_table_lacks_is_converted_by_the_reference_to_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not rowbinary.available():
        pytest.skip(f"the compiled converter {rowbinary.unavailable_reason()}")
    path = tmp_path / "in.tsv"
    path.write_bytes(RECORDS)
    reference, by = _spool_bytes(path, tmp_path, "reference", MODE_PYTHON)
    assert by == MODE_PYTHON
    # The C table knows every family today: it takes the file, to the same bytes.
    compiled, by = _spool_bytes(path, tmp_path, "compiled", MODE_NATIVE)
    assert (compiled, by) == (reference, MODE_NATIVE)
    # A family added to the policy before the C side learns it: "int" dropped here.
    lacking = {k: v for k, v in rowbinary._FAMILIES.items() if k != "int"}
    monkeypatch.setattr(rowbinary, "_FAMILIES", lacking)
    plans = plan_columns(COLUMNS)
    assert rowbinary.column_spec(plans) is None
    assert rowbinary.column_spec(plans[1:]) is not None
    assert native_conversion.not_taken(plans) == "does not take Int32"
    declined, by = _spool_bytes(path, tmp_path, "declined", MODE_NATIVE)
    assert (declined, by) == (reference, MODE_PYTHON)


def test_a_plan_without_a_resolved_target_is_declined() -> None:
    plan = plan_column(SourceColumn("id", "int", False))
    assert rowbinary.column_spec((plan,)) is not None
    assert rowbinary.column_spec((dataclasses.replace(plan, target=None),)) is None
