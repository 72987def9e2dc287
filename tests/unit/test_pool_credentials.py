"""The remote pool's credentials file: retired principals and a rotation's previous
passwords (issue 35, item 6)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from dpone.errors import ConfigurationError
from dpone.localserver.errors import CredentialsCorrupt
from dpone.localserver.pool_credentials import read_pool_credentials
from dpone.localserver.pool_file import check_retired, render_pool
from dpone.localserver.principal_pool import PoolNames
from dpone.publication.principals.server_access import (
    _NEW_TAKEN,
    RemoteServer,
    ServerAccess,
    rotated_credentials,
)


def test_only_an_ingest_or_publisher_principal_may_be_retired_and_one_of_each_stays() -> None:
    for user in ("dpone_catalog", "dpone_closer", "dpone_keeper", "someone"):
        with pytest.raises(ConfigurationError) as caught:
            check_retired([user])
        assert caught.value.code == "principal_not_retirable", user
    with pytest.raises(ConfigurationError) as caught:
        check_retired(PoolNames().ingest())
    assert caught.value.details["role"] == "ingest"
    assert check_retired(["dpone_ingest_2", "dpone_ingest_2"]) == ("dpone_ingest_2",)


def test_the_credentials_file_keeps_retired_and_previous_apart(tmp_path: Path) -> None:
    old = render_pool(["db"])
    previous = {u["user"]: u["password"] for u in json.loads(old.credentials_json)["users"]}
    rendered = render_pool(["db"], retired=["dpone_publisher_3"], previous=previous)
    assert "dpone_publisher_3" not in rendered.users_xml
    assert "DROP USER IF EXISTS `dpone_publisher_3`;" in rendered.users_sql
    assert rendered.rotation_sql.count("ADD IDENTIFIED WITH sha256_hash") == 10
    assert rendered.rotation_sql.endswith("DROP USER IF EXISTS `dpone_publisher_3`;\n")
    path = tmp_path / "c.json"
    path.write_text(rendered.credentials_json)
    found = read_pool_credentials(path)
    assert found is not None
    assert found.retired == {"dpone_publisher_3"}
    assert "dpone_publisher_3" not in found.passwords and len(found.passwords) == 10
    assert found.previous == {u: p for u, p in previous.items() if u != "dpone_publisher_3"}
    assert "password" not in repr(found).replace("passwords", "")


def test_a_retired_entry_with_a_password_is_refused_without_quoting_it(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    for entry in (
        {"user": "u", "retired": True, "password": "s3cret-value"},
        {"user": "u", "password": "s3cret-value", "previous_password": ""},
    ):
        path.write_text(json.dumps({"users": [entry]}))
        with pytest.raises(CredentialsCorrupt) as caught:
            read_pool_credentials(path)
        assert "s3cret-value" not in str(caught.value) and caught.value.details["entry"] == 0


def test_a_rotation_probe_without_an_answer_keeps_the_old_password(tmp_path: Path) -> None:
    """A sign-in with the new password that got no answer (nothing listens) says
    nothing: the previous password stays in use and the new one is tried again later,
    never kept as taken."""
    old = render_pool(["db"])
    previous = {u["user"]: u["password"] for u in json.loads(old.credentials_json)["users"]}
    rendered = render_pool(["db"], previous=previous)
    path = tmp_path / "c.json"
    path.write_text(rendered.credentials_json)
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    access = ServerAccess(tmp_path, remote=RemoteServer("127.0.0.1", port, port, path))
    found = read_pool_credentials(path)
    assert found is not None
    chosen = rotated_credentials(access, found)
    assert {u: c.password for u, c in chosen.items() if u in previous} == previous
    assert not _NEW_TAKEN.get((str(path), "127.0.0.1", port))
