"""Rendering of the managed server's users and configuration files."""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET

import pytest

from dpone.errors import ConfigurationError
from dpone.localserver.config import ServerUser, render_config_xml, render_users_xml


def test_users_xml_holds_hashes_grants_and_profiles() -> None:
    users = [
        ServerUser("default"),
        ServerUser("loader", password="pässword", grants=("GRANT INSERT ON db.*",), profile="bulk"),
        ServerUser("none", password="x", grants=()),
    ]
    root = ET.fromstring(render_users_xml(users))
    loader = root.find("users/loader")
    assert loader is not None
    assert loader.findtext("password_sha256_hex") == hashlib.sha256("pässword".encode()).hexdigest()
    assert [q.text for q in loader.findall("grants/query")] == ["GRANT INSERT ON db.*"]
    assert loader.findtext("profile") == "bulk"
    assert root.find("profiles/bulk/poll_interval") is not None
    assert root.find("users/default/grants") is None  # administrator: no grant list
    none = root.find("users/none/grants")
    assert none is not None and list(none) == []
    assert "pässword" not in render_users_xml(users)


def test_password_is_hidden_from_repr() -> None:
    assert "secret" not in repr(ServerUser("u", password="secret"))


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"name": "bad name"}, "invalid_user_name"),
        ({"name": "<x>"}, "invalid_user_name"),
        ({"name": "u", "profile": "a/b"}, "invalid_profile_name"),
        ({"name": "u", "grants": ("DROP DATABASE x",)}, "invalid_grant"),
    ],
)
def test_invalid_users_are_refused(kwargs: dict[str, object], code: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ServerUser(**kwargs)  # type: ignore[arg-type]
    assert caught.value.code == code


def test_duplicate_and_empty_user_lists_are_refused() -> None:
    with pytest.raises(ConfigurationError) as caught:
        render_users_xml([ServerUser("a"), ServerUser("a")])
    assert caught.value.code == "duplicate_user" and caught.value.details["users"] == ["a"]
    with pytest.raises(ConfigurationError) as empty:
        render_users_xml([])
    assert empty.value.code == "no_users"


def test_config_xml_escapes_paths_and_listens_on_loopback() -> None:
    root = ET.fromstring(
        render_config_xml(http_port=0, tcp_port=9000, log_dir="/tmp/a&b<c", users_file="/u&.xml")
    )
    assert root.findtext("listen_host") == "127.0.0.1"
    assert root.findtext("tcp_port") == "9000"
    assert root.findtext("users_config") == "/u&.xml"
    assert root.findtext("logger/log") == "/tmp/a&b<c/server.log"
