"""The package's rooms import only downward (docs/architecture.md)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import dpone

PACKAGE = Path(dpone.__file__).parent

# Lowest first; a module may import its own room and any room below it.
ROOMS: tuple[tuple[str, ...], ...] = (
    ("dpone", "dpone.errors", "dpone.durable_files", "dpone.sql"),
    ("dpone.contracts",),
    ("dpone.ports",),
    ("dpone.connectors",),
    ("dpone.localserver",),
    ("dpone.typepolicy",),
    ("dpone.preparation",),
    ("dpone.exporters",),
    ("dpone.staging",),
    ("dpone.publication",),
    ("dpone.project",),
    ("dpone.cli", "dpone.__main__"),
)
# The source documents' module names: re-exports that nothing inside the package imports.
FACADES = ("dpone.runtime", "dpone.sinks")
SEED_NAMES = (
    ("dpone.runtime.composition_snapshot", "ClickHouseAtomicSnapshotPublisher"),
    ("dpone.runtime.clickhouse_file_stage_contract", "StagingPolicy"),
    ("dpone.runtime.clickhouse_staging_composition", "build_clickhouse_staging_components"),
    ("dpone.contracts.composition_snapshot", "SnapshotIntent"),
    ("dpone.ports.composition_snapshot", "SnapshotPublicationStore"),
    ("dpone.connectors.bulk_text_codec", "BulkTextReader"),
    ("dpone.sinks", "ClickHouseSink"),
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _room(module: str) -> str:
    best = ""
    for room in (name for rooms in ROOMS for name in rooms):
        if (module == room or module.startswith(room + ".")) and len(room) > len(best):
            best = room
    for facade in FACADES:
        if module == facade or module.startswith(facade + "."):
            return facade
    return best


def _rank(room: str) -> int:
    for rank, rooms in enumerate(ROOMS):
        if room in rooms:
            return rank
    raise AssertionError(f"{room!r} is in no room")


def _imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, name) for line, name in found if name.split(".")[0] == "dpone"]


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_lives_in_a_room() -> None:
    for path in _modules():
        assert _room(_module_name(path)), f"{path} belongs to no room of docs/architecture.md"


def test_no_import_runs_upward() -> None:
    upward: list[str] = []
    for path in _modules():
        source = _room(_module_name(path))
        if source in FACADES:
            continue
        for line, target in _imports(path):
            room = _room(target)
            if room in FACADES:
                upward.append(f"{path.name}:{line} imports the facade {target}")
            elif _rank(room) > _rank(source):
                upward.append(f"{path.relative_to(PACKAGE)}:{line} ({source}) imports {target}")
    assert upward == []


# The staging sequence works on the journal port (dpone.ports.attempt_journal) only: the
# file journal is chosen by its composition (issue 37, item 15).
PORT_ONLY = {
    "dpone.staging.run": ("dpone.staging.journal",),
    "dpone.staging.service": ("dpone.staging.journal",),
}


def test_the_staging_sequence_uses_the_journal_port_not_the_file_journal() -> None:
    found = [
        f"{module}:{line} imports {target}"
        for module, forbidden in PORT_ONLY.items()
        for line, target in _imports(PACKAGE.parent / (module.replace(".", "/") + ".py"))
        if target in forbidden
    ]
    assert found == []


def test_the_rank_check_itself_sees_an_upward_import() -> None:
    assert _rank(_room("dpone.project.refresh")) > _rank(_room("dpone.staging.sink"))
    assert _rank(_room("dpone.ports.clickhouse")) < _rank(_room("dpone.connectors.clickhouse_http"))


# Publication's wiring stays at its top; every other module lives in a sub-room
# (docs/architecture.md: dispatch/, authority/, principals/, store/, ...), and the
# sub-rooms import each other without a cycle (issue 34).
PUBLICATION_WIRING = ("dpone.publication.composition", "dpone.publication.settings")


def _sub_room(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["dpone", "publication"] or len(parts) < 3 or module in PUBLICATION_WIRING:
        return None
    return parts[2]


def _cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of ``edges`` as the path that closes it, or [] when there is none."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str]:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return []
        for target in sorted(edges.get(node, ())):
            if found := visit(target, [*path, node]):
                return found
        done.add(node)
        return []

    for node in sorted(edges):
        if found := visit(node, []):
            return found
    return []


def test_publication_modules_live_in_its_sub_rooms() -> None:
    flat = [
        _module_name(path)
        for path in (PACKAGE / "publication").glob("*.py")
        if _module_name(path) not in ("dpone.publication", *PUBLICATION_WIRING)
    ]
    assert flat == []


def test_publication_sub_rooms_import_each_other_without_a_cycle() -> None:
    edges: dict[str, set[str]] = {}
    for path in (PACKAGE / "publication").rglob("*.py"):
        source = _sub_room(_module_name(path))
        for _, target in _imports(path):
            room = _sub_room(target)
            if source and room and room != source:
                edges.setdefault(source, set()).add(room)
    assert "dispatch" in edges.get("authority", set())
    assert _cycle(edges) == []


def test_the_cycle_check_itself_sees_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}}) == []


@pytest.mark.parametrize(("module", "name"), SEED_NAMES)
def test_the_source_documents_names_stay_importable(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name)


def test_modules_stay_small() -> None:
    for source in (*PACKAGE.rglob("*.c"), *PACKAGE.rglob("*.h")):
        lines = source.read_text(encoding="utf-8").count("\n")
        assert lines <= 600, f"{source.relative_to(PACKAGE)} has {lines} lines"
    for path in _modules():
        lines = path.read_text(encoding="utf-8").count("\n")
        assert lines <= 600, f"{path.relative_to(PACKAGE)} has {lines} lines"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                assert length <= 80, (
                    f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} has {length} lines"
                )
