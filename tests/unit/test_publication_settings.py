"""``[publication]`` of ``dpone.toml``: the drain-gate session's T and margin."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpone.project.config import ProjectConfigError, parse_project
from dpone.publication.settings import PublicationSettings

TABLES = """
[sources.s]
kind = "sqlite"
path = "s.db"

[tables.t]
source = "s"
table = "items"
target = "db.items"
"""


def test_the_defaults_are_the_shortest_measured_safe() -> None:
    project = parse_project(TABLES, Path("dpone.toml"))
    assert project.publication == PublicationSettings(1, 2.0)


def test_the_settings_are_read() -> None:
    text = "[publication]\nsession_timeout_seconds = 2\nsession_margin_seconds = 4\n" + TABLES
    assert parse_project(text, Path("dpone.toml")).publication == PublicationSettings(2, 4.0)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("session_timeout_seconds = 0", "publication.session_timeout_seconds (line 2): must be"),
        ("session_timeout_seconds = 1.5", "must be an integer, not a number"),
        ("session_margin_seconds = -1", "publication.session_margin_seconds (line 2): must be"),
        ("session_margin_seconds = nan", "must be between 0 and 3600"),
        ("margin = 2", "publication.margin (line 2): unknown key"),
    ],
)
def test_bad_settings_are_refused_by_key(line: str, message: str) -> None:
    with pytest.raises(ProjectConfigError) as refused:
        parse_project(f"[publication]\n{line}\n{TABLES}", Path("dpone.toml"))
    assert message in refused.value.message
