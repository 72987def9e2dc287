"""Every file path the documentation names exists (issue 34: docs/architecture.md named
modules that had become packages).

A path is a run of ``name/`` parts ending in a file name with a known suffix; it exists
when some file of the repository is that path or ends with it (``staging/journal.py``
names ``src/dpone/staging/journal.py``). A user's own files (``dpone.toml``) are not
the repository's.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.(?:py|sh|md|c|h|toml))\b")
USERS_FILES = {"dpone.toml", "DIR/dpone.toml"}
SKIPPED = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def _repository_files() -> list[str]:
    return [
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("*")
        if p.is_file() and not SKIPPED & set(p.relative_to(ROOT).parts)
    ]


def test_every_path_the_docs_name_exists() -> None:
    files = _repository_files()
    missing = []
    for doc in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for named in PATH.findall(line):
                if named in USERS_FILES:
                    continue
                if not any(f == named or f.endswith("/" + named) for f in files):
                    missing.append(f"{doc.relative_to(ROOT)}:{number}: {named}")
    assert missing == []


def test_the_check_itself_finds_a_path_that_does_not_exist() -> None:
    files = _repository_files()
    assert PATH.findall("see `publication/catalog.py`") == ["publication/catalog.py"]
    assert not any(f.endswith("/publication/catalog.py") for f in files)
    assert any(f.endswith("/publication/catalog/__init__.py") for f in files)
