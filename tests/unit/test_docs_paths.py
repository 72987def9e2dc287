"""Every repository path and module the documentation names exists (issue 34:
docs/architecture.md named modules that had become packages).

What is checked, in ``docs/*.md`` and ``README.md``:

- **A file path**, anywhere in the text (in backticks, a link or prose): a run of
  ``name/`` parts ending in a file name with a suffix the repository's own files have
  (``.py``, ``.sh``, ``.md``, ``.c``, ``.h``, ``.toml``).
- **A directory path**, written in backticks as ``name/`` parts ending with ``/``
  (``preparation/native/``, ``bench/``).
- **A dotted module name** in backticks starting with ``dpone.``
  (``dpone.publication.catalog.allowance``).

A path exists when it is a file (a directory, for a directory path) relative to the
repository root, to ``src/``, to the document's own folder (its links), or to a package
directory of ``src/dpone`` (the docs name a module by its room, ``staging/journal.py``,
or by its sub-room, ``store/postgres.py``, where the text says which room it is in). A
path never matches outside those: a file elsewhere with the same ending does not count.

A dotted name exists when its longest prefix that is a module of ``dpone`` imports and
each part after that prefix is an attribute of what came before (a class, function or
constant of the module, or a member of a class). A name that is only a prefix of a
module of ``dpone`` and no module itself does not count.

Not the repository's, hence not checked: the user's project file ``dpone.toml`` (in
whatever folder, ``DIR/dpone.toml``) and the
working directories dpone creates at run time (``.dpone/``, ``run/``, ``attempts/`` and
the others in :data:`RUNTIME_DIRECTORIES`), under whatever placeholder the text puts
before them (``WORK/``, ``work_dir/``).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src"
PACKAGE = SOURCE / "dpone"
SUFFIXES = ("py", "sh", "md", "c", "h", "toml")
FILE_PATH = re.compile(rf"(?<![\w/.:-])((?:[\w.-]+/)*[\w-]+\.(?:{'|'.join(SUFFIXES)}))(?![\w/-])")
BACKTICKED = re.compile(r"`([^`\n]+)`")
DIRECTORY_PATH = re.compile(r"(?:[\w.-]+/)+")
DOTTED_NAME = re.compile(r"dpone(?:\.\w+)+")
USERS_FILES = {"dpone.toml"}
# The working directories dpone makes at run time (docs/operations.md, docs/staging.md,
# docs/local-server.md describe them), and the placeholders written before them.
RUNTIME_DIRECTORIES = {
    ".dpone",
    "attempts",
    "events",
    "log",
    "retention",
    "retire",
    "rollbacks",
    "run",
    "torn",
}
PLACEHOLDERS = {"WORK", "W", "work_dir"}


def documents() -> list[Path]:
    """The documents whose paths are checked."""
    return [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def _bases(document: Path) -> list[Path]:
    packages = sorted(p.parent for p in PACKAGE.rglob("__init__.py"))
    return [ROOT, SOURCE, document.parent, *packages]


def _is_runtime(path: str) -> bool:
    parts = [p for p in path.split("/") if p]
    while parts and parts[0] in PLACEHOLDERS:
        parts = parts[1:]
    return bool(parts) and parts[0] in RUNTIME_DIRECTORIES


def path_exists(named: str, document: Path, *, directory: bool) -> bool:
    """Whether ``named`` is a file (a directory) at one of the bases of ``document``."""
    for base in _bases(document):
        candidate = base / named
        if (candidate.is_dir() if directory else candidate.is_file()) and (
            candidate.resolve().is_relative_to(ROOT)
        ):
            return True
    return False


def dotted_name_exists(name: str) -> bool:
    """Whether ``name`` is a module of dpone, or such a module's attribute chain."""
    parts = name.split(".")
    for cut in range(len(parts), 1, -1):
        module_name = ".".join(parts[:cut])
        try:
            found = importlib.util.find_spec(module_name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            continue
        value: object = importlib.import_module(module_name)
        for attribute in parts[cut:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def problems(document: Path, text: str) -> list[str]:
    """What ``text`` (the contents of ``document``) names that does not exist."""
    missing: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{document.relative_to(ROOT)}:{number}"
        for named in FILE_PATH.findall(line):
            if named.rsplit("/", 1)[-1] in USERS_FILES or _is_runtime(named):
                continue
            if not path_exists(named, document, directory=False):
                missing.append(f"{where}: file {named}")
        missing += [f"{where}: {p}" for t in BACKTICKED.findall(line) if (p := _named(t, document))]
    return missing


def _named(token: str, document: Path) -> str | None:
    """What a backticked ``token`` names that does not exist, or None."""
    if DIRECTORY_PATH.fullmatch(token):
        if _is_runtime(token) or path_exists(token, document, directory=True):
            return None
        return f"directory {token}"
    if DOTTED_NAME.fullmatch(token) and token not in USERS_FILES:
        return None if dotted_name_exists(token) else f"module or name {token}"
    return None


def test_every_path_and_module_the_docs_name_exists() -> None:
    missing = [m for doc in documents() for m in problems(doc, doc.read_text(encoding="utf-8"))]
    assert missing == []


def test_the_check_finds_what_does_not_exist() -> None:
    doc = ROOT / "docs" / "architecture.md"
    text = "\n".join(
        [
            "see `publication/catalog.py`",  # a module that became a package
            "[x](src/dpone/publication/catalog/gone.py)",
            "in `publication/vanished/`",
            "`dpone.publication.catalog.no_such_name`",
            "`dpone.nowhere`",
            "scripts/bench.sh",  # a file of that name exists nowhere the rule looks
            # These exist: a room-relative path, a link beside the document, a
            # sub-room's directory, a module, a class, a runtime directory, a user's file.
            "`staging/journal.py` [t](type-policy.md) `catalog/` `dpone.publication.catalog`",
            "`dpone.sinks.ClickHouseSink` `WORK/rollbacks/` `.dpone/` `dpone.toml`",
        ]
    )
    assert [m.split(": ", 1)[1] for m in problems(doc, text)] == [
        "file publication/catalog.py",
        "file src/dpone/publication/catalog/gone.py",
        "directory publication/vanished/",
        "module or name dpone.publication.catalog.no_such_name",
        "module or name dpone.nowhere",
        "file scripts/bench.sh",
    ]


def test_a_path_ending_like_a_file_elsewhere_does_not_count() -> None:
    # tests/unit/test_layout.py exists, but "unit/test_layout.py" is under no base.
    doc = ROOT / "docs" / "architecture.md"
    assert (ROOT / "tests/unit/test_layout.py").is_file()
    assert not path_exists("unit/test_layout.py", doc, directory=False)
    assert path_exists("tests/unit/test_layout.py", doc, directory=False)
