"""Strict parsing of dpone.toml and where secrets come from (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpone.errors import ConfigurationError
from dpone.exporters.sources import SqlServerConfig
from dpone.project.config import ProjectConfigError, parse_project
from dpone.project.source_secrets import resolve_secret

GOOD = """\
[project]
keep_rollback = 2
[sources.erp]
kind = "sqlserver"
host = "sql.example.com"
database = "ERP"
user_env = "ERP_USER"
password_file = "secret.txt"
[tables.orders]
source = "erp"
table = "dbo.orders"
target = "sales.orders"
order_by = "id"
partition_by = "toYYYYMM(created)"
types = { amount = "Decimal(18, 4)" }
shrink_guard = 0
[tables.orders.limits]
source_rows = 5
"""


def problems(text: str) -> dict[str, int | None]:
    with pytest.raises(ProjectConfigError) as caught:
        parse_project(text, Path("/p/dpone.toml"))
    return {p["key"]: p["line"] for p in caught.value.details["problems"]}


def test_a_good_file_parses_with_paths_relative_to_it() -> None:
    project = parse_project(GOOD, Path("/p/dpone.toml"))
    table = project.tables["orders"]
    assert (table.database, table.target, table.shrink_guard) == ("sales", "orders", 0.0)
    assert table.design.clause() == "ENGINE = MergeTree PARTITION BY toYYYYMM(created) ORDER BY id"
    assert dict(table.types) == {"amount": "Decimal(18, 4)"} and table.limits.source_rows == 5
    erp = project.sources["erp"]
    assert isinstance(erp, SqlServerConfig) and erp.describe() == "mssql://sql.example.com:1433/ERP"
    assert erp.password_file == Path("/p/secret.txt")
    assert project.work_dir == Path("/p/.dpone/work") and project.keep_rollback == 2


def test_secrets_come_from_the_named_file_or_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = parse_project(GOOD, tmp_path / "dpone.toml").sources["erp"]
    assert isinstance(source, SqlServerConfig)
    monkeypatch.delenv("ERP_USER", raising=False)
    with pytest.raises(ConfigurationError) as missing:
        resolve_secret(source)
    assert missing.value.details["key"] == "sources.erp.user_env"
    monkeypatch.setenv("ERP_USER", "loader")
    (tmp_path / "secret.txt").write_text("pw-from-file\n")
    assert resolve_secret(source) == ("loader", "pw-from-file")


def test_sqlserver_needs_exactly_one_password_source() -> None:
    both = GOOD.replace('password_file = "secret.txt"', 'password_file = "s"\npassword_env = "PW"')
    assert problems(both) == {"sources.erp.password_env": 9}
    assert problems(GOOD.replace('password_file = "secret.txt"\n', "")) == {
        "sources.erp.password_env": 3
    }


def test_inline_table_values_and_limits_are_located() -> None:
    bad = GOOD.replace('amount = "Decimal(18, 4)"', "amount = 4").replace(
        "source_rows = 5", "rows = 5"
    )
    assert problems(bad) == {"tables.orders.types.amount": 15, "tables.orders.limits.rows": 18}


def test_design_and_target_are_checked() -> None:
    bad = GOOD.replace('order_by = "id"', 'order_by = "id; DROP"').replace(
        "sales.orders", "sales.dpone_stage_x"
    )
    assert problems(bad) == {"tables.orders.order_by": 13, "tables.orders.target": 12}


def test_the_removed_engine_preparation_is_named_with_its_replacement() -> None:
    stale = '[clickhouse]\npreparation = "engine-chdb"\n' + GOOD
    with pytest.raises(ProjectConfigError) as caught:
        parse_project(stale, Path("/p/dpone.toml"))
    # Its only problem: the error takes the problem's own code.
    assert caught.value.code == "preparation_mode_removed"
    (problem,) = caught.value.details["problems"]
    assert (problem["key"], problem["line"], problem["code"]) == (
        "clickhouse.preparation",
        2,
        "preparation_mode_removed",
    )
    assert "'engine-chdb' was removed" in problem["message"] and "'native'" in problem["message"]
    # With other problems the file is invalid_config, the removed mode still coded.
    with pytest.raises(ProjectConfigError) as several:
        parse_project(stale.replace("keep_rollback = 2", "keep_rollback = -1"), Path("/p/x"))
    assert several.value.code == "invalid_config"
    codes = {p["key"]: p.get("code") for p in several.value.details["problems"]}
    assert codes == {
        "clickhouse.preparation": "preparation_mode_removed",
        "project.keep_rollback": None,
    }
    # The modes that stay parse; an unknown one is a plain problem.
    for mode in ("native", "python-reference"):
        chosen = parse_project(f'[clickhouse]\npreparation = "{mode}"\n' + GOOD, Path("/p/x"))
        assert chosen.clickhouse.preparation == mode
    assert problems('[clickhouse]\npreparation = "bogus"\n' + GOOD) == {"clickhouse.preparation": 2}


def test_a_remote_server_is_named_by_host_ports_and_a_credentials_file() -> None:
    text = GOOD.replace(
        "[sources.erp]",
        '[clickhouse]\nhost = "ch.example.com"\nsecure = true\nca_file = "ca.pem"\n'
        'credentials_file = "pool.json"\ntrusted_writers = ["admin"]\n[sources.erp]',
    )
    project = parse_project(text, Path("/p/dpone.toml"))
    remote = project.clickhouse.remote
    assert remote is not None and project.clickhouse.access.managed is False
    # TLS defaults to ClickHouse's secure ports.
    assert (remote.host, remote.http_port, remote.tcp_port) == ("ch.example.com", 8443, 9440)
    assert remote.ca_file == Path("/p/ca.pem") and remote.credentials_file == Path("/p/pool.json")
    assert remote.trusted_writers == ("admin",)
    # A network between dpone and the server: closure's margin defaults one second wider.
    assert project.publication.session_margin_seconds == 3.0
    assert project.server_arguments() == ["--config", "/p/dpone.toml"]
    endpoint = project.clickhouse.access.endpoint("sales")
    assert (endpoint.secure, endpoint.ca_file, endpoint.describe()) == (
        True,
        "/p/ca.pem",
        "https://ch.example.com:8443/sales",
    )
    plain = parse_project(
        GOOD.replace(
            "[sources.erp]", '[clickhouse]\nhost = "h"\ncredentials_file = "c"\n[sources.erp]'
        ),
        Path("/p/dpone.toml"),
    )
    assert plain.clickhouse.remote is not None
    assert (plain.clickhouse.remote.http_port, plain.clickhouse.remote.tcp_port) == (8123, 9000)
    assert parse_project(GOOD, Path("/p/dpone.toml")).server_arguments()[0] == "--data-dir"


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ('host = "h"\ncredentials_file = "c"\ndata_dir = "d"', "clickhouse.data_dir"),
        ('host = "h"', "clickhouse.credentials_file"),
        ('host = "h"\ncredentials_file = "c"\nca_file = "x"', "clickhouse.ca_file"),
        ('http_port = 8123\ncredentials_file = "c"', "clickhouse.http_port"),
        ('host = "h"\ncredentials_file = "c"\nhttp_port = 0', "clickhouse.http_port"),
        ('host = "h"\ncredentials_file = "c"\ntrusted_writers = [1]', "clickhouse.trusted_writers"),
        ('host = "h"\ncredentials_file = "c"\npassword = "x"', "clickhouse.password"),
    ],
)
def test_remote_server_problems_are_named(section: str, key: str) -> None:
    found = problems(GOOD.replace("[sources.erp]", f"[clickhouse]\n{section}\n[sources.erp]"))
    assert key in found, found
