"""Server and user configuration files for the managed local ClickHouse server.

The embedded engine reads ``config.xml`` from its working directory and users,
passwords and grants only from the ``users.xml`` that file names (SQL ``CREATE USER``
is refused in this mode). Passwords are stored as SHA-256 hex; the clear text never
reaches a file, an argument vector or a log.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from dpone.errors import ConfigurationError

_USER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_PROFILE_NAME = _USER_NAME


@dataclass(frozen=True)
class ServerUser:
    """One declared user of the managed server.

    ``grants`` are ``GRANT`` statements applied at start; ``None`` means the user may
    do everything (the built-in administrator), an empty tuple means nothing at all.
    The password is kept only long enough to hash it and is hidden from ``repr``.
    """

    name: str
    password: str | None = field(default=None, repr=False)
    grants: tuple[str, ...] | None = None
    profile: str = "default"
    networks: tuple[str, ...] = ("127.0.0.1", "::1")

    def __post_init__(self) -> None:
        if not _USER_NAME.fullmatch(self.name):
            raise ConfigurationError(
                f"user name {self.name!r} must match {_USER_NAME.pattern}",
                code="invalid_user_name",
                user=self.name,
            )
        if not _PROFILE_NAME.fullmatch(self.profile):
            raise ConfigurationError(
                f"profile name {self.profile!r} is not a plain identifier",
                code="invalid_profile_name",
                user=self.name,
            )
        for grant in self.grants or ():
            if not grant.lstrip().upper().startswith("GRANT "):
                raise ConfigurationError(
                    f"grant for user {self.name!r} must be a GRANT statement",
                    code="invalid_grant",
                    user=self.name,
                )

    @property
    def password_sha256_hex(self) -> str:
        """SHA-256 of the UTF-8 password, as ClickHouse's ``password_sha256_hex``."""
        return hashlib.sha256((self.password or "").encode("utf-8")).hexdigest()


# The user the embedded engine's own session signs in as, always without a password
# (chdb 4.4 offers no way to give that session one). It may only open the listeners:
# everything else, the query log's save and restore included, is the administrator's.
ENGINE_USER = "default"
ENGINE_GRANTS: tuple[str, ...] = ("GRANT SYSTEM LISTEN ON *.*",)
# dpone's administrator on the managed server: a generated password, every privilege.
ADMIN_USER = "dpone_admin"
RESERVED_USERS = (ENGINE_USER, ADMIN_USER)

# Users declared besides the two dpone always declares (see :func:`managed_users`).
DEFAULT_USERS: tuple[ServerUser, ...] = ()


def managed_users(declared: Sequence[ServerUser]) -> tuple[ServerUser, ...]:
    """The engine's ``default``, the administrator, then the caller's ``declared`` users.

    The two reserved names belong to dpone: declaring either is refused, because a
    ``default`` with more grants would reopen the server to every local process and
    one with a password would keep the engine from starting.
    """
    for user in declared:
        if user.name in RESERVED_USERS:
            raise ConfigurationError(
                f"user {user.name!r} is reserved on the managed server: dpone declares it "
                f"({ENGINE_USER!r} for the engine's own session, {ADMIN_USER!r} as the "
                "administrator); declare your users under other names",
                code="reserved_user",
                user=user.name,
            )
    return (
        ServerUser(ENGINE_USER, grants=ENGINE_GRANTS),
        ServerUser(ADMIN_USER, grants=None),
        *declared,
    )


def render_config_xml(*, http_port: int, tcp_port: int, log_dir: str, users_file: str) -> str:
    """The server ``config.xml``: loopback only, given ports, query log on."""
    return f"""<clickhouse>
  <listen_host>127.0.0.1</listen_host>
  <http_port>{int(http_port)}</http_port>
  <tcp_port>{int(tcp_port)}</tcp_port>
  <!-- a short keep-alive lets the server stop while a client connection is idle -->
  <keep_alive_timeout>2</keep_alive_timeout>
  <users_config>{escape(users_file)}</users_config>
  <query_log>
    <database>system</database>
    <table>query_log</table>
    <flush_interval_milliseconds>1000</flush_interval_milliseconds>
  </query_log>
  <session_log>
    <database>system</database>
    <table>session_log</table>
    <flush_interval_milliseconds>1000</flush_interval_milliseconds>
  </session_log>
  <logger>
    <level>information</level>
    <log>{escape(log_dir)}/server.log</log>
    <errorlog>{escape(log_dir)}/server.err.log</errorlog>
    <size>10M</size>
    <count>3</count>
    <console>0</console>
  </logger>
</clickhouse>
"""


def render_users_xml(users: Sequence[ServerUser]) -> str:
    """The ``users.xml`` for ``users``; refuses an empty or duplicated list."""
    if not users:
        raise ConfigurationError("at least one server user is required", code="no_users")
    names = [u.name for u in users]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigurationError(
            f"server users declared twice: {', '.join(duplicates)}",
            code="duplicate_user",
            users=duplicates,
        )
    profiles = sorted({u.profile for u in users} | {"default"})
    profile_xml = "".join(
        # poll_interval 1 lets an idle connection notice shutdown promptly; async_insert 0
        # makes every insert synchronous even from clients too old to send the setting.
        f"    <{p}><poll_interval>1</poll_interval><async_insert>0</async_insert></{p}>\n"
        for p in profiles
    )
    return (
        "<clickhouse>\n  <profiles>\n"
        + profile_xml
        + "  </profiles>\n  <users>\n"
        + "".join(_render_user(u) for u in users)
        + "  </users>\n  <quotas><default/></quotas>\n</clickhouse>\n"
    )


def _render_user(user: ServerUser) -> str:
    networks = "".join(f"<ip>{escape(n)}</ip>" for n in user.networks)
    lines = [
        f"    <{user.name}>",
        f"      <password_sha256_hex>{user.password_sha256_hex}</password_sha256_hex>",
        f"      <networks>{networks}</networks>",
        f"      <profile>{user.profile}</profile>",
        "      <quota>default</quota>",
    ]
    if user.grants is not None:
        lines.append("      <grants>")
        lines.extend(f"        <query>{escape(g)}</query>" for g in user.grants)
        lines.append("      </grants>")
    lines.append(f"    </{user.name}>")
    return "\n".join(lines) + "\n"
