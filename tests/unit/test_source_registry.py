"""The source seam: kinds found by their module, read by their plugin, opened by one factory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import dpone.exporters.sources as sources_package
from dpone.errors import ConfigurationError
from dpone.exporters.sources import SourceError, registry
from dpone.exporters.sources.registry import kinds, open_source
from dpone.project.config import ProjectConfigError, parse_project

TABLE = '[tables.t]\nsource = "s"\ntable = "t"\ntarget = "db.t"\n'


def project_sources(section: str) -> dict[str, str]:
    """``describe()`` of each source a project with ``section`` declares."""
    project = parse_project(section + TABLE, Path("/p/dpone.toml"))
    return {name: source.describe() for name, source in project.sources.items()}


def problems(section: str) -> dict[str, str]:
    with pytest.raises(ProjectConfigError) as caught:
        parse_project(section + TABLE, Path("/p/dpone.toml"))
    return {p["key"]: p["message"] for p in caught.value.details["problems"]}


def test_the_built_in_kinds_and_their_schemes() -> None:
    found = kinds()
    assert {"sqlite", "sqlserver", "postgres"} <= set(found)
    assert found["postgres"].schemes == ("postgresql", "postgres")
    assert found["sqlite"].schemes == ("sqlite",) and found["sqlserver"].schemes == ("mssql",)
    schemes = [s for k in found.values() for s in k.schemes]
    assert len(schemes) == len(set(schemes))


def test_describe_prints_each_kind_s_own_scheme() -> None:
    assert project_sources('[sources.s]\nkind = "sqlite"\npath = "a.db"\n') == {
        "s": "sqlite:/p/a.db"
    }
    mssql = (
        '[sources.s]\nkind = "sqlserver"\nhost = "h"\ndatabase = "d"\n'
        'user_env = "U"\npassword_env = "P"\n'
    )
    assert project_sources(mssql) == {"s": "mssql://h:1433/d"}
    pg = '[sources.s]\nkind = "postgres"\nhost = "h"\ndbname = "d b"\nuser = "u"\n'
    assert project_sources(pg) == {"s": "postgresql://u@h:5432/d%20b?sslmode=prefer"}
    assert project_sources(pg + 'port = 6543\nsslmode = "verify-full"\n') == {
        "s": "postgresql://u@h:6543/d%20b?sslmode=verify-full"
    }


def test_a_postgres_source_takes_no_password_and_libpq_s_names() -> None:
    pg = '[sources.s]\nkind = "postgres"\nhost = "h"\nuser = "u"\n'
    found = problems(pg + 'password = "pw"\ndatabase = "d"\nsslmode = "maybe"\n')
    assert set(found) == {
        "sources.s.password",
        "sources.s.database",
        "sources.s.dbname",
        "sources.s.sslmode",
    }
    assert "PGPASSFILE" in found["sources.s.password"] and "pw" not in str(found)
    assert "dbname" in found["sources.s.database"] and found["sources.s.dbname"] == "is required"


def test_a_key_of_another_kind_and_an_unknown_kind_are_named() -> None:
    found = problems('[sources.s]\nkind = "sqlite"\npath = "a.db"\nhost = "h"\n')
    assert found == {
        "sources.s.host": 'is for kind = "sqlserver" or kind = "postgres" sources only'
    }
    found = problems('[sources.s]\nkind = "oracle"\n')
    assert list(found) == ["sources.s.kind"] and "sqlite" in found["sources.s.kind"]
    found = problems('[sources.s]\nkind = "sqlite"\npath = "a.db"\npassword = "x"\n')
    assert list(found) == ["sources.s.password"]
    assert "secrets never go in the file" in found["sources.s.password"]


def test_a_module_defining_kind_is_a_source_with_nothing_else_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "toysource.py").write_text(
        "from dataclasses import dataclass\n"
        "from dpone.exporters.sources.base import SourceConfig\n"
        "@dataclass(frozen=True)\n"
        "class ToyConfig(SourceConfig):\n"
        "    where: str\n"
        "    def describe(self) -> str:\n"
        "        return f'toy://{self.where}'\n"
        "class Toy:\n"
        "    kind = 'toy'\n"
        "    schemes = ('toy',)\n"
        "    keys = ('where',)\n"
        "    hints = {}\n"
        "    def read(self, name, fields):\n"
        "        where = fields.text('where', required=True)\n"
        "        return None if where is None else ToyConfig(name, self.kind, where)\n"
        "    def from_dsn(self, dsn):\n"
        "        return ('opened', dsn)\n"
        "KIND = Toy()\n"
    )
    monkeypatch.setattr(sources_package, "__path__", [*sources_package.__path__, str(tmp_path)])
    registry.kinds.cache_clear()
    try:
        assert project_sources('[sources.s]\nkind = "toy"\nwhere = "here"\n') == {"s": "toy://here"}
        assert problems('[sources.s]\nkind = "toy"\n') == {"sources.s.where": "is required"}
        assert open_source("toy:x") == ("opened", "toy:x")  # type: ignore[comparison-overlap]
    finally:
        registry.kinds.cache_clear()
        sys.modules.pop("dpone.exporters.sources.toysource", None)


def test_one_open_source_for_a_dsn_and_a_configuration(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as unknown:
        open_source("oracle://x/y")
    assert unknown.value.code == "invalid_dsn" and "sqlite:" in unknown.value.message
    project = parse_project(
        '[sources.s]\nkind = "sqlite"\npath = "missing.db"\n' + TABLE, tmp_path / "dpone.toml"
    )
    with pytest.raises(SourceError) as missing:
        open_source(project.sources["s"])
    assert missing.value.code == "source_not_found"
