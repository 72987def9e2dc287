"""The command line's edges: signals, closed pipes, usage errors, unexpected exceptions,
progress on a terminal and outputs that are not files (issue 9, items 3, 19, 23 to 25)."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tests.plugins.cli import as_json, dpone, run_on_terminal


def make_table(path: Path, rows: int, *, bad_at: int | None = None) -> None:
    """``t(id bigint, s nvarchar(200))``; record ``bad_at`` holds text in the bigint column."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (id bigint NOT NULL, s nvarchar(200))")
        conn.executemany(
            "INSERT INTO t VALUES (?, ?)",
            ((f"secret-{i}" if i == bad_at else i, "x" * 100) for i in range(1, rows + 1)),
        )


def test_sigterm_during_export_leaves_no_file_behind(tmp_path: Path) -> None:
    make_table(tmp_path / "src.db", 200_000)
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"}
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpone",
            "export",
            "--source",
            f"sqlite:{tmp_path / 'src.db'}",
            "--table",
            "t",
            "--out",
            str(tmp_path / "o.tsv"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        # Wait (bounded) until the export writes its temporary files, then stop it.
        limit = time.monotonic() + 60
        while not any(p.name.endswith(".partial") for p in tmp_path.iterdir()):
            assert child.poll() is None and time.monotonic() < limit, child.communicate()
            time.sleep(0.01)
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 128 + signal.SIGTERM, err
    assert "dpone: error: [terminated]" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.db"]


def test_usage_errors_print_one_json_object_with_json(tmp_path: Path) -> None:
    for args in (
        ["export", "--json", "--table", "t", "--out", str(tmp_path / "o")],  # no --source
        ["verify", "--json", str(tmp_path / "missing"), "--receipt", str(tmp_path / "r")],
        ["export", "--json", "--nope"],
        ["--json"],
    ):
        done = dpone(*args)
        assert done.returncode == 2, (args, done)
        payload = as_json(done)
        assert payload["ok"] is False and payload["error"]["code"] == "usage_error"
        assert payload["error"]["message"]
    text = dpone("export", "--table", "t")
    assert text.returncode == 2 and "Usage:" in text.stderr and text.stdout == ""


def test_an_unexpected_exception_is_a_coded_internal_error(tmp_path: Path) -> None:
    # A receipt nested deeper than the JSON parser recurses: a hostile input no code
    # path expects (RecursionError, not a DponeError or OSError).
    data = tmp_path / "f.tsv"
    data.write_bytes(b"")
    deep = tmp_path / "deep.json"
    deep.write_bytes(b"[" * 200_000 + b"]" * 200_000)
    for as_json_flag in (True, False):
        done = dpone(
            "verify", str(data), "--receipt", str(deep), *(["--json"] if as_json_flag else [])
        )
        assert done.returncode == 1
        assert "Traceback" not in done.stderr and "recursion" not in done.stdout + done.stderr
        if as_json_flag:
            error = as_json(done)["error"]
            assert error["code"] == "internal_error"
            assert error["details"]["exception"] == "RecursionError"
            assert error["details"]["where"].startswith("dpone/")
        else:
            assert done.stdout == ""
            assert done.stderr.startswith(
                "dpone: error: [internal_error] unexpected RecursionError"
            )


def test_an_internal_error_never_prints_the_exception_text(tmp_path: Path) -> None:
    # A fault no real input produces: an exception whose text holds a password.
    script = (
        "import dpone.cli.files as files\n"
        "def boom(path):\n"
        "    raise ValueError('password=hunter2-secret')\n"
        "files.load_receipt = boom\n"
        "from dpone.cli.main import main\n"
        "main()\n"
    )
    data = tmp_path / "f.tsv"
    data.write_bytes(b"")
    for extra in (["--json"], []):
        done = subprocess.run(
            [sys.executable, "-c", script, "verify", str(data), "--receipt", str(data), *extra],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 1
        assert "hunter2" not in done.stdout + done.stderr and "Traceback" not in done.stderr
        if extra:
            assert as_json(done)["error"]["code"] == "internal_error"
        else:
            assert "[internal_error] unexpected ValueError at dpone/cli/files.py" in done.stderr


def test_verify_recounts_the_records(tmp_path: Path) -> None:
    make_table(tmp_path / "src.db", 3)
    exported = dpone(
        "export",
        "--source",
        f"sqlite:{tmp_path / 'src.db'}",
        "--table",
        "t",
        "--out",
        str(tmp_path / "o.tsv"),
        "--json",
    )
    receipt = Path(as_json(exported)["receipt"])
    original = receipt.read_bytes()
    edited = original.replace(b'"rows_validated":3', b'"rows_validated":4')
    assert edited != original
    receipt.write_bytes(edited)
    done = dpone("verify", str(tmp_path / "o.tsv"), "--receipt", str(receipt), "--json")
    assert done.returncode == 1
    error = as_json(done)["error"]
    assert error["code"] == "receipt_rows_mismatch" and "3 records" in error["message"]
    receipt.write_bytes(original)
    assert dpone("verify", str(tmp_path / "o.tsv"), "--receipt", str(receipt)).returncode == 0


def test_dash_is_not_a_file_name_for_outputs(tmp_path: Path) -> None:
    make_table(tmp_path / "src.db", 1)
    for option in ("--out", "--receipt-out"):
        args = ["--out", "o.tsv", option, "-"] if option == "--receipt-out" else ["--out", "-"]
        done = dpone("export", "--source", "sqlite:src.db", "--table", "t", *args, cwd=tmp_path)
        assert done.returncode == 2 and "standard output" in done.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["src.db"]


def test_a_closed_output_pipe_ends_quietly(tmp_path: Path) -> None:
    make_table(tmp_path / "src.db", 1)
    dpone("export", "--source", "sqlite:src.db", "--table", "t", "--out", "o.tsv", cwd=tmp_path)
    for extra in ([], ["--json"]):
        read_end, write_end = os.pipe()
        os.close(read_end)  # like `| head` that has already exited
        try:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "dpone",
                    "verify",
                    "o.tsv",
                    "--receipt",
                    "o.tsv.receipt.json",
                    *extra,
                ],
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                cwd=tmp_path,
                timeout=120,
                check=False,
            )
        finally:
            os.close(write_end)
        assert done.stderr == "" and done.returncode == 1


def test_export_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    make_table(tmp_path / "src.db", 25_000)
    args = ["export", "--source", "sqlite:src.db", "--table", "t", "--out", "o.tsv"]
    code, out, err = run_on_terminal(args, tmp_path)
    assert code == 0 and out.startswith("o.tsv: 25000 rows")
    shown = re.findall(r"\rexported: ([0-9,]+) rows, ([0-9.]+) MiB(?:, [0-9,]+ rows/s)?", err)
    assert [rows for rows, _ in shown] == ["10,000", "20,000", "25,000"]
    assert float(shown[-1][1]) == round((tmp_path / "o.tsv").stat().st_size / 2**20, 1)
    assert err.endswith("\n")  # the progress line is closed
    piped = dpone(*args[:-1], "again.tsv", cwd=tmp_path)
    assert piped.returncode == 0 and piped.stderr == ""


def test_an_error_after_progress_starts_on_a_fresh_line(tmp_path: Path) -> None:
    make_table(tmp_path / "src.db", 25_000, bad_at=20_001)
    args = ["export", "--source", "sqlite:src.db", "--table", "t", "--out", "o.tsv"]
    code, out, err = run_on_terminal(args, tmp_path)
    assert code == 1 and out == ""
    assert "\rexported: 20,000 rows" in err
    error_line = err[err.index("dpone: error:") :]
    assert err[err.index("dpone: error:") - 1] == "\n"
    assert error_line.startswith("dpone: error: [value_not_renderable] record 20001, column 'id':")
    assert "secret-20001" not in err and ".partial" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.db"]


def test_json_reports_stay_one_object_on_failure(tmp_path: Path) -> None:
    done = dpone(
        "export",
        "--source",
        f"sqlite:{tmp_path / 'x?y.db'}",
        "--table",
        "t",
        "--out",
        str(tmp_path / "o.tsv"),
        "--json",
    )
    assert done.returncode == 1
    payload = json.loads(done.stdout)
    assert payload["ok"] is False and payload["error"]["code"] == "source_not_found"
    assert payload["error"]["details"]["path"] == str(tmp_path / "x?y.db")


def test_the_removed_engine_preparation_is_a_named_error_on_the_command_line(
    tmp_path: Path,
) -> None:
    """``--preparation engine-chdb`` and ``preparation = "engine-chdb"`` in dpone.toml:
    exit 2, one JSON object with --json (no traceback), naming the replacement."""
    (tmp_path / "f.tsv").write_bytes(b"1\n")
    (tmp_path / "r.json").write_text("{}")
    flag = ["--preparation", "engine-chdb"]
    stage = ["stage", str(tmp_path / "f.tsv"), "--receipt", str(tmp_path / "r.json")]
    stage += ["--work-dir", str(tmp_path / "w"), "--database", "d", *flag]
    config = tmp_path / "dpone.toml"
    config.write_text(
        '[clickhouse]\npreparation = "engine-chdb"\n[sources.s]\nkind = "sqlite"\npath = "s.db"\n'
        '[tables.t]\nsource = "s"\ntable = "t"\ntarget = "db.t"\n'
    )
    for args in (stage, ["check", "--config", str(config)], ["refresh", "--config", str(config)]):
        done = dpone(*args, "--json")
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stdout.count("\n") == 1 and "Traceback" not in done.stderr
        error = as_json(done)["error"]
        assert error["code"] == "preparation_mode_removed", error
        assert "'engine-chdb' was removed" in error["message"] and "'native'" in error["message"]
        text = dpone(*args)
        assert text.returncode == 2 and "Traceback" not in text.stderr
        assert "dpone: error: [preparation_mode_removed]" in text.stderr
    assert as_json(dpone(*stage, "--json"))["error"]["details"]["replacement"] == "native"
    assert not (tmp_path / "w").exists()  # refused before anything started
