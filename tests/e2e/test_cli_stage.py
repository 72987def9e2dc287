"""``dpone stage`` as a user runs it, against a managed server started by the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.staging import export_hostile


def test_stage_through_the_cli(tmp_path: Path) -> None:
    path, receipt, data = export_hostile(tmp_path)
    # `--protect stg` creates the database and lets the pool's ingest users stage there
    # (the default `--principal auto` stages as one of them).
    server = as_json(
        dpone("server", "start", "--data-dir", str(tmp_path / "ch"), "--protect", "stg", "--json")
    )
    try:
        chhttp.register_server(server["http_port"], tmp_path / "ch")
        done = dpone(
            "stage",
            str(path),
            "--store",
            str(tmp_path / "store.sqlite"),
            "--receipt",
            str(receipt),
            "--work-dir",
            str(tmp_path / "work"),
            "--database",
            "stg",
            "--data-dir",
            str(tmp_path / "ch"),
            "--attempt-id",
            "cli-1",
            "--json",
        )
        assert done.returncode == 0, done.stdout + done.stderr
        staged = as_json(done)
        assert staged["rows"] == len(data) and staged["table"] == "dpone_stage_cli_h1"
        assert (
            chhttp.query(server["http_port"], "SELECT count() FROM stg.dpone_stage_cli_h1")
            == f"{len(data)}\n"
        )
        python = dpone(
            "stage",
            str(path),
            "--store",
            str(tmp_path / "store.sqlite"),
            "--receipt",
            str(receipt),
            "--work-dir",
            str(tmp_path / "work"),
            "--database",
            "stg",
            "--data-dir",
            str(tmp_path / "ch"),
            "--attempt-id",
            "cli-2",
            "--preparation",
            "python-reference",
            "--json",
        )
        assert python.returncode == 0, python.stdout + python.stderr
        assert as_json(python)["rows"] == len(data)
        # The same identity: the semantic id does not depend on the converter, which
        # the report and the journal's prepared event both name.
        assert as_json(python)["semantic_id"] == staged["semantic_id"]
        assert (staged["converter"], as_json(python)["converter"]) == ("native", "python-reference")
        prepared = [
            json.loads(line)
            for line in dpone("journal", "show", staged["journal"]).stdout.splitlines()
            if json.loads(line)["state"] == "prepared"
        ]
        assert [e["converter"] for e in prepared] == ["native"], prepared
        same = chhttp.query(
            server["http_port"],
            "SELECT (SELECT groupArray(cityHash64(*)) FROM (SELECT * FROM stg.dpone_stage_cli_h1 ORDER BY id, txt, bin)) = "
            "(SELECT groupArray(cityHash64(*)) FROM (SELECT * FROM stg.dpone_stage_cli_h2 ORDER BY id, txt, bin))",
        )
        assert same == "1\n"  # both converters staged the same values
        shown = dpone("journal", "show", staged["journal"])
        assert [json.loads(line)["state"] for line in shown.stdout.splitlines()][-1] == "staged"
        text = dpone(
            "stage",
            str(path),
            "--store",
            str(tmp_path / "store.sqlite"),
            "--receipt",
            str(receipt),
            "--work-dir",
            str(tmp_path / "work"),
            "--database",
            "stg",
            "--data-dir",
            str(tmp_path / "ch"),
            "--attempt-id",
            "cli-1",
        )
        assert text.returncode == 1 and "attempt_exists" in text.stderr
        missing = dpone(
            "stage",
            str(path),
            "--store",
            str(tmp_path / "store.sqlite"),
            "--receipt",
            str(receipt),
            "--work-dir",
            str(tmp_path / "work"),
            "--database",
            "stg",
            "--data-dir",
            str(tmp_path / "nowhere"),
        )
        assert missing.returncode == 2 and "no_server" in missing.stderr
    finally:
        dpone("server", "stop", "--data-dir", str(tmp_path / "ch"))


def test_auto_principal_into_a_missing_database_says_database_missing(tmp_path: Path) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    assert dpone("server", "start", "--data-dir", str(tmp_path / "ch")).returncode == 0
    try:
        done = dpone(
            "stage",
            str(path),
            "--store",
            str(tmp_path / "store.sqlite"),
            "--receipt",
            str(receipt),
            "--work-dir",
            str(tmp_path / "w"),
            "--database",
            "nosuch",
            "--data-dir",
            str(tmp_path / "ch"),
            "--json",
        )
    finally:
        dpone("server", "stop", "--data-dir", str(tmp_path / "ch"))
    assert done.returncode == 1
    assert as_json(done)["error"]["code"] == "database_missing"
