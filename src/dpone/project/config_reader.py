"""Reading a TOML document into typed settings, with every problem reported.

The generic half of :mod:`dpone.project.config`: where a key is (``Locator``, a best
effort: tomllib gives no positions), what is wrong with a value (``TomlReader``), and
the checks the project file's keys share.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ConfigProblem:
    """One problem of the project file: where (key path, line) and what.

    ``code`` is set for a problem a program may act on (a removed preparation mode:
    ``preparation_mode_removed``); the others are all ``invalid_config``.
    """

    key: str
    message: str
    line: int | None = None
    code: str | None = None

    def __str__(self) -> str:
        where = f"{self.key} (line {self.line})" if self.line else self.key
        return f"{where}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        document = {"key": self.key, "line": self.line, "message": self.message}
        return document if self.code is None else {**document, "code": self.code}


def decode_line(message: str) -> int | None:
    """The line number tomllib's error message names, if any."""
    found = re.search(r"at line (\d+)", message)
    return int(found[1]) if found else None


class Locator:
    """Line numbers of keys: table headers and ``key =`` lines, by key path.

    A best effort over the text (tomllib gives no positions): good for the layouts
    people write; a key it cannot place is reported without a line.
    """

    def __init__(self, text: str) -> None:
        self.lines: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            header = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?", line)
            if header:
                table = split_key(header[1])
                self.lines.setdefault(table, number)
                continue
            key = re.match(r"^([A-Za-z0-9_\-\"'. ]+?)\s*=", line)
            if key:
                path = table + split_key(key[1])
                self.lines.setdefault(path, number)
                inline = re.search(r"=\s*\{(.*)\}", line)
                for name in re.findall(r"([A-Za-z0-9_\-\"']+)\s*=", inline[1] if inline else ""):
                    self.lines.setdefault(path + split_key(name), number)

    def line(self, path: tuple[str, ...]) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


def split_key(text: str) -> tuple[str, ...]:
    """A dotted TOML key as its parts, quotes removed."""
    return tuple(part.strip().strip("\"'") for part in text.split("."))


class TomlReader:
    """Walks a document, collecting problems instead of stopping at the first.

    The generic half: unknown keys, types, checks and paths; a subclass reads its own
    sections with it."""

    def __init__(self, locator: Locator, base: Path) -> None:
        self.locator = locator
        self.base = base
        self.problems: list[ConfigProblem] = []

    def problem(self, path: tuple[str, ...], message: str, code: str | None = None) -> None:
        self.problems.append(ConfigProblem(".".join(path), message, self.locator.line(path), code))

    def section(
        self, value: Any, path: tuple[str, ...], known: tuple[str, ...], hints: Mapping[str, str]
    ) -> dict[str, Any]:
        """A table's members, after reporting every unknown key."""
        if not isinstance(value, dict):
            self.problem(path, f"must be a table, not {kind_of(value)}")
            return {}
        for key in value:
            if key not in known:
                hint = hints.get(key) or f"known keys: {', '.join(known)}"
                self.problem((*path, key), f"unknown key ({hint})")
        return value

    def get(
        self,
        table: Mapping[str, Any],
        path: tuple[str, ...],
        key: str,
        kind: type,
        default: Any = None,
        *,
        required: bool = False,
        check: Callable[[Any], str | None] | None = None,
    ) -> Any:
        where = (*path, key)
        if key not in table:
            if required:
                self.problem(where, "is required")
            return default
        value = table[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            self.problem(where, f"must be {article(kind)}, not {kind_of(value)}")
            return default
        if check is not None:
            message = check(value)
            if message:
                self.problem(where, message)
                return default
        return value

    def path_value(
        self, table: Mapping[str, Any], path: tuple[str, ...], key: str, default: Path | None
    ) -> Path | None:
        text = self.get(table, path, key, str, check=non_empty)
        if text is None:
            return default
        return self.base / Path(text).expanduser()


def kind_of(value: Any) -> str:
    """What a TOML value is, in words (\"an integer\")."""
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        dict: "a table",
        list: "an array",
    }
    return names.get(type(value), type(value).__name__)


def article(kind: type) -> str:
    """A Python type as the TOML value it must be, in words."""
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        dict: "a table",
    }.get(kind, kind.__name__)


def non_empty(value: str) -> str | None:
    """A check: the string is not blank."""
    return None if value.strip() else "must not be empty"


def env_name(value: str) -> str | None:
    """A check: the string is an environment variable's name."""
    return None if ENV_NAME.fullmatch(value) else "must be an environment variable's name"


def one_of(choices: tuple[str, ...]) -> Callable[[str], str | None]:
    """A check: the string is one of ``choices``."""

    def check(value: str) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}"

    return check
