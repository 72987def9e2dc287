"""The test suite's own layout: shared helpers live in tests/plugins, never in a test module.

A test module imports nothing from another test module (``tests/**/test_*.py``) or from
``tests/conftest.py``: a shared fixture is registered once by a plugin module listed in
``pytest_plugins`` of ``tests/conftest.py``, and a shared function is imported from its
plugin module. A plugin holds no autouse fixture, which would reach every test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tests

TESTS = Path(tests.__file__).parent
PLUGINS = TESTS / "plugins"


def _is_test_module(module: str) -> bool:
    """Whether the dotted ``module`` names a test module or the suite's conftest."""
    parts = module.split(".")
    return parts[0] == "tests" and (parts[-1].startswith("test_") or parts[-1] == "conftest")


def forbidden_imports(path: Path, source: str) -> list[str]:
    """Each import in ``source`` (the text of ``path``, relative to the directory that
    holds tests/) of a test module or of the conftest."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            package = list(path.parent.parts)
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            # ``from tests.unit import test_x`` imports a test module by its name.
            targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.extend(f"{path}:{node.lineno} imports {t}" for t in targets if _is_test_module(t))
    return found


def test_no_module_imports_a_test_module_or_the_conftest() -> None:
    found = [
        hit
        for path in sorted(TESTS.rglob("*.py"))
        for hit in forbidden_imports(path.relative_to(TESTS.parent), path.read_text("utf-8"))
    ]
    assert found == []


def test_the_check_sees_each_way_to_import_a_test_module() -> None:
    here = Path("tests/integration/test_x.py")
    assert forbidden_imports(here, "from tests.e2e.test_cli_server import dpone") != []
    assert forbidden_imports(here, "from tests.conftest import TEST_DATABASE") != []
    assert forbidden_imports(here, "from tests.unit import test_type_policy as tp") != []
    assert forbidden_imports(here, "import tests.integration.test_staging") != []
    assert forbidden_imports(here, "from .test_staging import config") != []
    assert forbidden_imports(here, "from .. import conftest") != []
    allowed = "from tests.plugins.staging import config\nfrom tests import chhttp"
    assert forbidden_imports(here, allowed) == []


def _registered_plugins() -> list[str]:
    """``pytest_plugins`` of tests/conftest.py, read from its text (importing it is what
    this module forbids)."""
    for node in ast.parse((TESTS / "conftest.py").read_text("utf-8")).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [
            "pytest_plugins"
        ]:
            plugins = ast.literal_eval(node.value)
            assert isinstance(plugins, list)
            return sorted(str(p) for p in plugins)
    raise AssertionError("tests/conftest.py has no pytest_plugins")


def test_every_plugin_module_is_registered_by_the_conftest() -> None:
    modules = sorted(
        f"tests.plugins.{path.stem}" for path in PLUGINS.glob("*.py") if path.stem != "__init__"
    )
    assert _registered_plugins() == modules


def test_no_plugin_holds_an_autouse_fixture() -> None:
    autouse = [
        f"{path.name}:{node.lineno}"
        for path in sorted(PLUGINS.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.keyword)
        and node.arg == "autouse"
        and isinstance(node.value, ast.Constant)
        and node.value.value is True
    ]
    assert autouse == []
