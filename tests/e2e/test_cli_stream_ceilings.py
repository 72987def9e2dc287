"""A publication ceiling stops the stream that would cross it, in every entry point
(issue 37, item 7).

Before: a refresh bounded the stream by wire bytes and the transient headroom only, so
a generation over ``generation_storage_bytes`` was staged whole and refused at
``prepare``; ``dpone stage`` applied no publication ceiling at all. Now each ceiling a
stream can cross stops it (``limit_exceeded``, naming the ceiling, its configured value
and the key that sets it), and no staged table is left.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpone.staging.journal import read_events
from tests import chhttp
from tests.e2e.test_cli_refresh import (
    DATABASE,  # the database project() writes targets into
    make_source,
    project,
    protected_server,
    refresh,
    rows_of,
)
from tests.e2e.test_cli_server import dpone

ROWS = 2_000  # about 40 KB of RowBinary: over every ceiling set below


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "ceilings-ch")


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ceilings-export")
    make_source(root / "shop.db", rows_of(ROWS))
    out, receipt = root / "items.tsv", root / "items.receipt.json"
    done = dpone(
        "export",
        *("--source", f"sqlite:{root / 'shop.db'}", "--table", "items"),
        *("--out", str(out), "--receipt-out", str(receipt)),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out, receipt


def staged_tables(server: dict[str, Any]) -> list[str]:
    """Every staging table in the database now (a stopped stream must leave none)."""
    found = chhttp.rows(
        server["http_port"],
        f"SELECT name FROM system.tables WHERE database = '{DATABASE}' "
        "AND startsWith(name, 'dpone_stage_') ORDER BY name",
    )
    return [str(row["name"]) for row in found]


CEILINGS = [
    ("generation_storage_bytes", 20_000, "spool_budget_exceeded"),
    ("wire_bytes", 20_000, "spool_budget_exceeded"),
    ("total_transient_storage_bytes", 20_000, "spool_budget_exceeded"),
    ("source_rows", 100, "too_many_records"),
]


@pytest.mark.parametrize(("ceiling", "limit", "cause"), CEILINGS)
def test_dpone_stage_stops_the_stream_at_a_publication_ceiling(
    tmp_path: Path,
    server: dict[str, Any],
    export: tuple[Path, Path],
    ceiling: str,
    limit: int,
    cause: str,
) -> None:
    work, attempt = tmp_path / "work", f"ceil-{ceiling.replace('_', '-')}"
    done = dpone(
        *("stage", str(export[0]), "--receipt", str(export[1]), "--work-dir", str(work)),
        *("--database", DATABASE, "--data-dir", str(server["data_dir"])),
        *("--principal", "pool", "--store", str(tmp_path / "store.sqlite")),
        *("--attempt-id", attempt, "--limit", f"{ceiling}={limit}", "--json"),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "limit_exceeded", error
    details = error["details"]
    assert (details["ceiling"], details["limit"], details["cause"]) == (ceiling, limit, cause)
    assert details["key"] == f"--limit {ceiling}=N"
    assert ceiling in error["message"] and str(limit) in error["message"]
    # The attempt's own record: stopped and cleaned, its lease released, no table.
    assert details["journal"] == str(work / attempt)
    last = read_events(work / attempt)[-1].document
    assert (last["state"], last["error_code"]) == ("failed_cleaned", cause)
    assert details["next_command"] is None
    assert staged_tables(server) == []


def test_dpone_stage_under_its_ceilings_stages(
    tmp_path: Path, server: dict[str, Any], export: tuple[Path, Path]
) -> None:
    """The same file under ceilings it fits: the bound is the ceiling, not less."""
    work = tmp_path / "work"
    done = dpone(
        *("stage", str(export[0]), "--receipt", str(export[1]), "--work-dir", str(work)),
        *("--database", DATABASE, "--data-dir", str(server["data_dir"])),
        *("--principal", "admin", "--attempt-id", "ceil-fits"),
        *("--limit", f"source_rows={ROWS}", "--limit", "generation_storage_bytes=10000000"),
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["rows"] == ROWS
    discard = dpone(
        *("attempts", "discard", "ceil-fits", "--work-dir", str(work)),
        *("--database", DATABASE, "--data-dir", str(server["data_dir"]), "--json"),
    )
    assert discard.returncode == 0, discard.stdout + discard.stderr


def test_a_refresh_stops_the_stream_at_the_generation_storage_ceiling(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(ROWS))
    extra = "[tables.items.limits]\ngeneration_storage_bytes = 20000\n"
    config = project(tmp_path, server, "t_gen", extra)
    code, refused = refresh(config, "items")
    report = refused["tables"][0]
    assert code == 1 and report["phase"] == "stage", report
    error = report["error"]
    assert error["code"] == "limit_exceeded", error
    details = error["details"]
    assert (details["ceiling"], details["limit"], details["cause"]) == (
        "generation_storage_bytes",
        20000,
        "spool_budget_exceeded",
    )
    assert details["key"] == "tables.items.limits.generation_storage_bytes"
    assert "tables.items.limits.generation_storage_bytes" in error["message"]
    last = read_events(Path(report["journal"]))[-1].document
    assert last["state"] == "failed_cleaned"
    assert staged_tables(server) == []
    # Raised to what the generation needs, the same refresh publishes.
    config.write_text(config.read_text().replace("= 20000", "= 100000000"))
    code, done = refresh(config, "items")
    assert code == 0, done
    count = chhttp.query(server["http_port"], f"SELECT count() FROM {DATABASE}.t_gen")
    assert count == f"{ROWS}\n"
