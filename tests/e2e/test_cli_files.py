"""``dpone export``, ``validate`` and ``verify`` as a user runs them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.plugins.cli import as_json, dpone
from tests.plugins.staging import make_hostile_db


def test_export_then_validate_then_verify(tmp_path: Path) -> None:
    rows = make_hostile_db(tmp_path / "src.db")
    out = tmp_path / "hostile.tsv"
    exported = dpone(
        "export",
        "--source",
        f"sqlite:{tmp_path / 'src.db'}",
        "--table",
        "hostile",
        "--out",
        str(out),
        "--json",
    )
    assert exported.returncode == 0, exported.stderr
    summary = as_json(exported)
    assert summary["rows"] == len(rows) and summary["file"] == str(out)
    receipt = json.loads(Path(summary["receipt"]).read_bytes())
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(receipt["schema"], indent=2))

    validated = dpone(
        "validate",
        str(out),
        "--schema",
        str(schema),
        "--receipt-out",
        str(tmp_path / "again.json"),
        "--json",
    )
    assert validated.returncode == 0, validated.stderr
    assert as_json(validated)["receipt_sha256"] == summary["receipt_sha256"]
    assert (tmp_path / "again.json").read_bytes() == Path(summary["receipt"]).read_bytes()

    verified = dpone("verify", str(out), "--receipt", summary["receipt"])
    assert verified.returncode == 0 and "matches its receipt" in verified.stdout
    with open(out, "ab") as f:
        f.write(b"1\t\t\t\t\t\n")
    broken = dpone("verify", str(out), "--receipt", summary["receipt"], "--json")
    assert broken.returncode == 1
    assert as_json(broken)["error"]["code"] == "artifact_size_mismatch"


def test_invalid_file_gets_no_receipt_and_a_located_error(tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "columns": [
                    {"name": "id", "source_type": "int", "nullable": False},
                    {"name": "s", "source_type": "nvarchar(10)", "nullable": True},
                ],
            }
        )
    )
    data = tmp_path / "bad.tsv"
    data.write_bytes(b"1\tok\n2\tbad\x1dQ\n")
    done = dpone("validate", str(data), "--schema", str(schema))
    assert done.returncode == 1
    assert "unknown_escape" in done.stderr and "record 2" in done.stderr and "'s'" in done.stderr
    assert "byte offset 10" in done.stderr
    assert not (tmp_path / "bad.tsv.receipt.json").exists()


def test_schema_with_unknown_member_is_refused(tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text('{"schema_version": 1, "columns": [], "extra": 1}')
    data = tmp_path / "f.tsv"
    data.write_bytes(b"")
    done = dpone("validate", str(data), "--schema", str(schema), "--json")
    assert done.returncode == 1 and as_json(done)["error"]["code"] == "unknown_member"


def test_export_of_unknown_table(tmp_path: Path) -> None:
    sqlite3.connect(tmp_path / "src.db").close()
    done = dpone(
        "export",
        "--source",
        f"sqlite:{tmp_path / 'src.db'}",
        "--table",
        "nope",
        "--out",
        str(tmp_path / "o.tsv"),
    )
    assert done.returncode == 1 and "source_error" in done.stderr


def test_validate_never_writes_its_receipt_over_an_input(tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "columns": [{"name": "id", "source_type": "int", "nullable": False}],
            }
        )
    )
    data = tmp_path / "f.tsv"
    data.write_bytes(b"1\n2\n")
    inputs = {p: p.read_bytes() for p in (data, schema)}
    for target in (data, schema):
        done = dpone(
            "validate",
            str(data),
            "--schema",
            str(schema),
            "--receipt-out",
            str(target),
            "--force",
            "--json",
        )
        assert done.returncode == 2 and as_json(done)["error"]["code"] == "output_is_input"
    assert {p: p.read_bytes() for p in inputs} == inputs
    receipt = tmp_path / "f.tsv.receipt.json"
    receipt.write_bytes(b"an older receipt")
    kept = dpone("validate", str(data), "--schema", str(schema), "--json")
    assert kept.returncode == 2 and as_json(kept)["error"]["code"] == "output_exists"
    assert receipt.read_bytes() == b"an older receipt"
    forced = dpone("validate", str(data), "--schema", str(schema), "--force", "--json")
    assert forced.returncode == 0 and as_json(forced)["rows"] == 2
    assert json.loads(receipt.read_bytes())["rows_validated"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "f.tsv",
        "f.tsv.receipt.json",
        "schema.json",
    ]


def test_export_over_its_source_is_refused_and_the_source_survives(tmp_path: Path) -> None:
    make_hostile_db(tmp_path / "src.db")
    before = (tmp_path / "src.db").read_bytes()
    done = dpone(
        "export",
        "--source",
        f"sqlite:{tmp_path / 'src.db'}",
        "--table",
        "hostile",
        "--out",
        str(tmp_path / "src.db"),
        "--force",
    )
    assert done.returncode == 2 and "[output_is_input]" in done.stderr
    assert (tmp_path / "src.db").read_bytes() == before
    again = dpone(
        "export",
        "--source",
        f"sqlite:{tmp_path / 'src.db'}",
        "--table",
        "hostile",
        "--out",
        str(tmp_path / "o.tsv"),
        "--receipt-out",
        str(tmp_path / "o.tsv"),
    )
    assert again.returncode == 2 and "[outputs_collide]" in again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.db"]


def _int_schema(tmp_path: Path) -> Path:
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "columns": [
                    {"name": "id", "source_type": "bigint", "nullable": False},
                    {"name": "n", "source_type": "int", "nullable": True},
                ],
            }
        )
    )
    return schema


def test_an_integer_of_4301_digits_is_a_coded_value_error(tmp_path: Path) -> None:
    """Item 19: Python's int-string limit never reaches the user as internal_error."""
    data = tmp_path / "long.tsv"
    data.write_bytes(b"1\t2\n2\t" + b"9" * 4301 + b"\n")
    done = dpone("validate", str(data), "--schema", str(_int_schema(tmp_path)), "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    error = as_json(done)["error"]
    assert (error["code"], error["details"]["record"], error["details"]["column"]) == (
        "value_not_representable",
        2,
        "n",
    )
    assert not (tmp_path / "long.tsv.receipt.json").exists()


def test_a_refused_value_is_named_by_position_never_quoted(tmp_path: Path) -> None:
    """Item 20: a 200 KB refused value: the message names record and column, not the value."""
    data = tmp_path / "huge.tsv"
    huge = "7" * 100_000 + "x" * 100_000
    data.write_bytes(b"1\t2\n2\t3\n3\t" + huge.encode() + b"\n")
    for flags in ((), ("--json",)):
        done = dpone("validate", str(data), "--schema", str(_int_schema(tmp_path)), *flags)
        assert done.returncode == 1
        output = done.stdout + done.stderr
        assert "777777" not in output and "xxxxxx" not in output
        assert len(output) < 2000
    error = as_json(done)["error"]
    assert error["code"] == "invalid_value"
    assert error["message"] == (
        f"the value at {data}, record 3, column 'n' (Nullable(Int32)) is not a canonical integer"
    )


def test_bad_source_port_and_table_bytes_are_coded_errors(tmp_path: Path) -> None:
    """Item 19: an out-of-range port and a table name that is not UTF-8 are usage errors."""
    out = str(tmp_path / "o.tsv")
    port = dpone("export", "--source", "mssql://h:99999/db", "--table", "t", "--out", out, "--json")
    assert port.returncode == 2 and as_json(port)["error"]["code"] == "invalid_dsn"
    db = tmp_path / "src.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (id bigint NOT NULL)")
    table = "t" + bytes([0xFF]).decode("utf-8", "surrogateescape")
    odd = dpone("export", "--source", f"sqlite:{db}", "--table", table, "--out", out, "--json")
    assert odd.returncode == 2, odd.stdout + odd.stderr
    assert as_json(odd)["error"]["code"] == "invalid_table_name"
    assert not Path(out).exists()


def test_out_dot_slash_dash_writes_a_file_named_dash(tmp_path: Path) -> None:
    """Item 24: ./- is the spelling the refusal of '-' recommends: it must work."""
    db = tmp_path / "src.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (id bigint NOT NULL)")
        conn.execute("INSERT INTO t VALUES (7)")
    done = dpone("export", "--source", f"sqlite:{db}", "--table", "t", "--out", "./-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "-").read_bytes() == b"7\n"
    assert (tmp_path / "-.receipt.json").is_file()
    dash = dpone("export", "--source", f"sqlite:{db}", "--table", "t", "--out", "-", cwd=tmp_path)
    assert dash.returncode == 2 and "./- for a file named '-'" in dash.stderr


def test_validation_without_the_compiled_converter_warns(tmp_path: Path) -> None:
    """With the compiled converter switched off, the reference validates alone: the
    same receipt, and a warning that says why (text on stderr, JSON in the object)."""
    data = tmp_path / "f.tsv"
    data.write_bytes(b"1\t\n2\t3\n")
    schema = _int_schema(tmp_path)
    fine = dpone("validate", str(data), "--schema", str(schema), "--json")
    assert fine.returncode == 0, fine.stderr
    assert as_json(fine)["warnings"] == []
    off = {"DPONE_NATIVE": "0"}
    for as_object in (True, False):
        again = dpone(
            "validate",
            str(data),
            "--schema",
            str(schema),
            "--force",
            *(["--json"] if as_object else []),
            extra_env=off,
        )
        assert again.returncode == 0, again.stderr
        if as_object:
            (warning,) = as_json(again)["warnings"]
            assert as_json(again)["receipt_sha256"] == as_json(fine)["receipt_sha256"]
        else:
            (warning,) = [
                line for line in again.stderr.splitlines() if line.startswith("dpone: warning:")
            ]
        assert "switched off (DPONE_NATIVE=0)" in warning and "Python reference" in warning
    verified = dpone(
        "verify", str(data), "--receipt", f"{data}.receipt.json", "--json", extra_env=off
    )
    assert verified.returncode == 0, verified.stderr
    assert "DPONE_NATIVE=0" in as_json(verified)["warnings"][0]
    # A failure keeps its warning too: one JSON object, with both.
    data.write_bytes(b"1\t\nx\t3\n")
    failed = dpone(
        "validate", str(data), "--schema", str(schema), "--force", "--json", extra_env=off
    )
    assert failed.returncode == 1
    assert as_json(failed)["error"]["code"] == "invalid_value"
    assert "DPONE_NATIVE=0" in as_json(failed)["warnings"][0]
