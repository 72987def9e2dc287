"""A test-side HTTP client for ClickHouse, standard library only.

Independent of dpone's transports on purpose: tests check the server's answers
through a path that shares no code with what they test. It reads the managed
server's administrator password from the data directory's credentials file itself.
Calls without a user act as the administrator ``dpone_admin`` with the password
registered for the port (:func:`register_server`; the ``clickhouse`` fixture registers
the session server, a test that starts its own server registers it).
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

ADMIN = "dpone_admin"
# The engine's own user: no password, may only open and close the listeners.
ENGINE = "default"
# http port -> the administrator's password on the server listening there.
_ADMIN_PASSWORDS: dict[int, str] = {}


def admin_password(data_dir: str | os.PathLike[str]) -> str:
    """The administrator's password from ``<data_dir>/run/credentials.json``."""
    with open(os.path.join(data_dir, "run", "credentials.json"), encoding="utf-8") as f:
        document = json.load(f)
    (found,) = [u["password"] for u in document["users"] if u["user"] == ADMIN]
    return str(found)


def register_server(http_port: int, data_dir: str | os.PathLike[str]) -> None:
    """Let calls to ``http_port`` without a password authenticate as its administrator.

    A port is used by one server at a time, so a later server on the same port
    replaces the earlier registration.
    """
    _ADMIN_PASSWORDS[http_port] = admin_password(data_dir)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    exception_code: str | None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


def post(
    port: int,
    sql: str,
    *,
    user: str = ADMIN,
    password: str | None = None,
    data: bytes | None = None,
) -> Answer:
    """POST ``sql`` (or ``data`` with ``sql`` in the URL) and return the raw answer.

    ``password=None`` means the registered administrator password for ``port`` (when
    ``user`` is the administrator), else none at all.
    """
    if password is None and user == ADMIN:
        assert port in _ADMIN_PASSWORDS, f"register_server({port}, data_dir) first"
        password = _ADMIN_PASSWORDS[port]
    elif password is None:
        password = ""
    if data is None:
        url = f"http://127.0.0.1:{port}/?wait_end_of_query=1"
        body = sql.encode("utf-8")
    else:
        url = f"http://127.0.0.1:{port}/?" + urllib.parse.urlencode(
            {"query": sql, "wait_end_of_query": "1"}
        )
        body = data
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("X-ClickHouse-User", user)
    # UTF-8 bytes: http.client would refuse non-Latin-1 text in a header.
    request.add_header("X-ClickHouse-Key", password.encode("utf-8"))  # type: ignore[arg-type]
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return Answer(
                response.status,
                response.read(),
                response.headers.get("X-ClickHouse-Exception-Code"),
            )
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read(), exc.headers.get("X-ClickHouse-Exception-Code"))


def query(port: int, sql: str, **kwargs: Any) -> str:
    """Run ``sql`` and return its text; fail the test on any error."""
    answer = post(port, sql, **kwargs)
    assert answer.status == 200 and answer.exception_code is None, answer.text
    return answer.text


def rows(port: int, sql: str, **kwargs: Any) -> list[dict[str, Any]]:
    """Run a SELECT and return its rows as dicts (JSONEachRow, 64-bit ints unquoted)."""
    text = query(
        port,
        f"{sql} SETTINGS output_format_json_quote_64bit_integers = 0 FORMAT JSONEachRow",
        **kwargs,
    )
    return [json.loads(line) for line in text.splitlines()]


@contextlib.contextmanager
def scratch_database(port: int, name: str) -> Iterator[str]:
    """A new Atomic database ``name`` for the block, dropped after it."""
    query(port, f"CREATE DATABASE {name} ENGINE = Atomic")
    try:
        yield name
    finally:
        query(port, f"DROP DATABASE {name} SYNC")


def hand_over_servers() -> None:
    """Drop every ownership marker (``_dpone_identity.owner_*``) on each registered server.

    Each test is a project of its own, and a server outlives many of them: once a test
    has ended its store is gone, so the server is handed over, as an operator hands it
    to the next project. Within a test, two stores meet the ownership rules for real.
    A server no longer running is skipped.
    """
    for port in list(_ADMIN_PASSWORDS):
        try:
            names = rows(
                port,
                "SELECT name FROM system.tables WHERE database = '_dpone_identity' "
                "AND startsWith(name, 'owner_')",
            )
            for found in names:
                post(port, f"DROP TABLE `_dpone_identity`.`{found['name']}` SYNC")
        except (OSError, AssertionError):
            continue  # stopped (refused), or a port another kind of server uses now
