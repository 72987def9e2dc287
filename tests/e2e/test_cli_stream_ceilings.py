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
from tests.plugins.cli import dpone
from tests.plugins.refresh import DATABASE, make_source, project, protected_server, refresh, rows_of

ROWS = 2_000  # about 40 KB of RowBinary: over every ceiling set below
TINY = 3
STORED = 300  # under what three rows store on the server, over their wire bytes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "ceilings-ch")


def _export(root: Path, rows: int) -> tuple[Path, Path]:
    make_source(root / "shop.db", rows_of(rows))
    out, receipt = root / "items.tsv", root / "items.receipt.json"
    done = dpone(
        "export",
        *("--source", f"sqlite:{root / 'shop.db'}", "--table", "items"),
        *("--out", str(out), "--receipt-out", str(receipt)),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out, receipt


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _export(tmp_path_factory.mktemp("ceilings-export"), ROWS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Three rows: about 60 bytes of RowBinary, several hundred stored (a part's files)."""
    return _export(tmp_path_factory.mktemp("ceilings-tiny"), TINY)


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


def stage_over(
    tmp_path: Path, server: dict[str, Any], export: tuple[Path, Path], ceiling: str, limit: int
) -> tuple[Path, str, dict[str, Any]]:
    """``dpone stage`` of ``export`` under ``--limit ceiling=limit``, refused: its work
    dir, attempt id and error."""
    work, attempt = tmp_path / "work", f"ceil-{ceiling.replace('_', '-')}"
    before = staged_tables(server)
    done = dpone(
        *("stage", str(export[0]), "--receipt", str(export[1]), "--work-dir", str(work)),
        *("--database", DATABASE, "--data-dir", str(server["data_dir"])),
        *("--principal", "pool", "--store", str(tmp_path / "store.sqlite")),
        *("--attempt-id", attempt, "--limit", f"{ceiling}={limit}", "--json"),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert staged_tables(server) == before  # no staged table is left
    return work, attempt, json.loads(done.stdout)["error"]


@pytest.mark.parametrize(("ceiling", "limit", "cause"), CEILINGS)
def test_dpone_stage_stops_the_stream_at_a_publication_ceiling(
    tmp_path: Path,
    server: dict[str, Any],
    export: tuple[Path, Path],
    ceiling: str,
    limit: int,
    cause: str,
) -> None:
    work, attempt, error = stage_over(tmp_path, server, export, ceiling, limit)
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


@pytest.mark.parametrize(("ceiling", "limit", "cause"), CEILINGS)
def test_a_refresh_stops_the_stream_at_each_ceiling(
    tmp_path: Path, server: dict[str, Any], ceiling: str, limit: int, cause: str
) -> None:
    before = staged_tables(server)
    make_source(tmp_path / "shop.db", rows_of(ROWS))
    target = f"t_stream_{CEILINGS.index((ceiling, limit, cause))}"
    extra = f"[tables.items.limits]\n{ceiling} = {limit}\n"
    config = project(tmp_path, server, target, extra)
    code, refused = refresh(config, "items")
    report = refused["tables"][0]
    assert code == 1 and report["phase"] == "stage", report
    error = report["error"]
    assert error["code"] == "limit_exceeded", error
    details = error["details"]
    assert (details["ceiling"], details["limit"], details["cause"]) == (ceiling, limit, cause)
    assert details["key"] == f"tables.items.limits.{ceiling}"
    assert f"tables.items.limits.{ceiling}" in error["message"]
    last = read_events(Path(report["journal"]))[-1].document
    assert last["state"] == "failed_cleaned"
    assert staged_tables(server) == before
    # Raised to what the generation needs, the same refresh publishes.
    config.write_text(config.read_text().replace(f"= {limit}", "= 100000000"))
    code, done = refresh(config, "items")
    assert code == 0, done
    count = chhttp.query(server["http_port"], f"SELECT count() FROM {DATABASE}.{target}")
    assert count == f"{ROWS}\n"


def test_dpone_stage_drops_a_table_that_stores_more_than_its_ceiling(
    tmp_path: Path, server: dict[str, Any], tiny: tuple[Path, Path]
) -> None:
    """Under the wire bound, over the stored one: refused before it counts as staged,
    and its table dropped (before: staged, then refused at prepare, the table left)."""
    work, attempt, error = stage_over(tmp_path, server, tiny, "generation_storage_bytes", STORED)
    assert error["code"] == "limit_exceeded", error
    details = error["details"]
    assert (details["ceiling"], details["limit"], details["cause"]) == (
        "generation_storage_bytes",
        STORED,
        "storage_budget_exceeded",
    )
    assert details["key"] == "--limit generation_storage_bytes=N"
    events = [e.document for e in read_events(work / attempt)]
    assert "loading" in {e["state"] for e in events}  # its rows were in
    assert (events[-1]["state"], events[-1]["error_code"]) == (
        "failed_cleaned",
        "storage_budget_exceeded",
    )


def test_a_refresh_drops_a_generation_that_stores_more_than_its_ceiling(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    before = staged_tables(server)
    make_source(tmp_path / "shop.db", rows_of(TINY))
    extra = f"[tables.items.limits]\ngeneration_storage_bytes = {STORED}\n"
    code, refused = refresh(project(tmp_path, server, "t_stored", extra), "items")
    report = refused["tables"][0]
    assert code == 1 and report["phase"] == "stage", report
    assert report["error"]["code"] == "limit_exceeded", report["error"]
    details = report["error"]["details"]
    assert (details["ceiling"], details["limit"], details["cause"]) == (
        "generation_storage_bytes",
        STORED,
        "storage_budget_exceeded",
    )
    assert details["key"] == "tables.items.limits.generation_storage_bytes"
    assert details["observed"] > STORED
    assert read_events(Path(report["journal"]))[-1].document["state"] == "failed_cleaned"
    assert report["next_commands"] == [] and staged_tables(server) == before


@pytest.mark.parametrize(
    "given",
    ["wire_bytes=\u00b2", "wire_bytes=9223372036854775808", "wire_bytes=0", "nothing=5", "x"],
)
def test_a_limit_that_is_not_a_ceiling_and_a_count_is_a_usage_error(
    tmp_path: Path, given: str
) -> None:
    # The file and its receipt exist (click checks them first): only the limit is wrong.
    (tmp_path / "none.bin").write_bytes(b"")
    (tmp_path / "none.json").write_text("{}")
    done = dpone(
        *("stage", str(tmp_path / "none.bin"), "--receipt", str(tmp_path / "none.json")),
        *("--database", "db", "--work-dir", str(tmp_path / "w"), "--limit", given),
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "internal_error" not in done.stderr
    assert "is not CEILING=N with N an integer from 1 to 9223372036854775807" in done.stderr
    assert not (tmp_path / "w").exists()
