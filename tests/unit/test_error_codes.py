"""The registry of error codes (``dpone.error_codes``) is exactly the codes dpone raises,
and ``docs/errors.md`` is the registry's (issue 34: codes were inline strings, half of
them in no document).

A code is *raised* when ``src/dpone`` holds it as a string literal (alone or as a branch
of a conditional expression) in one of these places:

- a ``code=`` keyword argument of a call;
- a class-level ``code = "..."`` (the default of an error class);
- a positional argument of a helper whose parameter is named ``code``
  (``self._error("invalid_hex", ...)``);
- an assignment to a local named ``code``, alone or in a tuple
  (``code, why = ("client_missing", ...)``).

Every code raised must be registered. Every registered code must be raised, or, where
the raiser receives it from elsewhere (``self._write("create", "prepare_uncertain")``),
be a string literal somewhere in ``src/dpone``, or be one a ``code=f"..."`` template
composes (``response_{exc.code}``); each template must compose at least one
registered code.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from dpone.error_codes import _TABLE, ERROR_CODES, errors_markdown, meaning

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "dpone"
REGISTRY = PACKAGE / "error_codes.py"
CODE = re.compile(r"[a-z][a-z0-9_]*")


def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("*.py"))}


def _literals(node: ast.expr | None) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _literals(node.body) + _literals(node.orelse)
    return []


def _helpers(trees: dict[Path, ast.Module]) -> dict[str, int]:
    """Functions with a parameter named ``code``: its position among the call's arguments."""
    found: dict[str, int] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name != "__init__":
                names = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
                if "code" in names:
                    bound = 1 if names[0] in ("self", "cls") else 0
                    found[node.name] = names.index("code") - bound
    return found


def _assigned(node: ast.Assign) -> list[str]:
    """The codes a ``code = ...`` or ``code, other = ...`` assignment gives."""
    codes: list[str] = []
    for target in node.targets:
        if isinstance(target, ast.Name) and target.id == "code":
            codes += _literals(node.value)
        elif isinstance(target, ast.Tuple):
            names = [e.id if isinstance(e, ast.Name) else "" for e in target.elts]
            if "code" in names:
                codes += _tuple_member(node.value, names.index("code"))
    return codes


def _tuple_member(value: ast.expr, index: int) -> list[str]:
    if isinstance(value, ast.Tuple) and len(value.elts) > index:
        return _literals(value.elts[index])
    if isinstance(value, ast.IfExp):
        return _tuple_member(value.body, index) + _tuple_member(value.orelse, index)
    return []


def _class_default(node: ast.ClassDef) -> Iterator[str]:
    for statement in node.body:
        value: ast.expr | None
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign):
            target, value = statement.target, statement.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "code":
            yield from _literals(value)


def _constants(trees: dict[Path, ast.Module]) -> dict[str, str]:
    """Module-level ``NAME = "text"`` constants, by name (a code raised as ``code=NAME``)."""
    found: dict[str, str] = {}
    for tree in trees.values():
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.isupper()
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                found[node.targets[0].id] = node.value.value
    return found


def raised(trees: dict[Path, ast.Module]) -> tuple[dict[str, list[str]], list[str]]:
    """Every code raised, with where; and the ``code=f"..."`` templates, as regexes."""
    helpers = _helpers(trees)
    constants = _constants(trees)
    codes: dict[str, list[str]] = {}
    templates: list[str] = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            found: list[str] = []
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg == "code":
                        found += _literals(keyword.value)
                        if isinstance(keyword.value, ast.Name) and keyword.value.id in constants:
                            found.append(constants[keyword.value.id])
                        if isinstance(keyword.value, ast.JoinedStr):
                            templates.append(_pattern(keyword.value))
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in helpers and len(node.args) > helpers[name]:
                    found += _literals(node.args[helpers[name]])
            elif isinstance(node, ast.ClassDef):
                found += _class_default(node)
            elif isinstance(node, ast.Assign):
                found += _assigned(node)
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            for code in found:
                codes.setdefault(code, []).append(where)
    return codes, templates


def _pattern(template: ast.JoinedStr) -> str:
    parts = [
        re.escape(v.value)
        if isinstance(v, ast.Constant) and isinstance(v.value, str)
        else "[a-z0-9_]+"
        for v in template.values
    ]
    return "".join(parts)


def _string_literals(trees: dict[Path, ast.Module]) -> set[str]:
    return {
        node.value
        for path, tree in trees.items()
        if path != REGISTRY
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_every_code_raised_is_registered() -> None:
    codes, _ = raised(_trees())
    assert len(codes) > 300  # the collection itself works
    unregistered = {code: where for code, where in codes.items() if code not in ERROR_CODES}
    assert unregistered == {}


def test_every_registered_code_is_raised() -> None:
    trees = _trees()
    codes, templates = raised(trees)
    literals = _string_literals(trees)
    unused = [
        code
        for code in ERROR_CODES
        if code not in codes
        and code not in literals
        and not any(re.fullmatch(t, code) for t in templates)
    ]
    assert unused == []
    for template in templates:  # each composed family is listed
        assert any(re.fullmatch(template, code) for code in ERROR_CODES), template


def test_the_registry_is_one_sorted_line_per_code() -> None:
    lines = _TABLE.splitlines()
    assert len(lines) == len(ERROR_CODES)
    assert list(ERROR_CODES) == sorted(ERROR_CODES)
    for line in lines:
        assert len(line) <= 100, line
    for code, text in ERROR_CODES.items():
        assert CODE.fullmatch(code), code
        assert text.strip() == text and text, code
    assert meaning("invalid_hex") == ERROR_CODES["invalid_hex"]
    assert meaning("no_such_code") is None


def test_docs_errors_md_lists_the_registry() -> None:
    document = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    assert document == errors_markdown()
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (.+) \|$", document, re.MULTILINE)
    assert dict(rows) == dict(ERROR_CODES)


def test_the_collection_sees_each_form() -> None:
    source = "\n".join(
        [
            "NAMED = 'module_constant'",
            "class E(Exception):",
            "    code = 'class_default'",
            "def _error(self, code, message): ...",
            "def f(x):",
            "    raise E('m', code='keyword' if x else 'other_branch')",
            "    raise self._error('helper_argument', 'm')",
            "    code, why = ('tuple_first', 'a') if x else ('tuple_second', 'b')",
            "    raise E('m', code=f'composed_{x}')",
            "    raise E('m', code=NAMED)",
        ]
    )
    codes, templates = raised({PACKAGE / "example.py": ast.parse(source)})
    assert sorted(codes) == [
        "class_default",
        "helper_argument",
        "keyword",
        "module_constant",
        "other_branch",
        "tuple_first",
        "tuple_second",
    ]
    assert templates == ["composed_[a-z0-9_]+"]
