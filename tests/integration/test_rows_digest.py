"""The server's rows digest equals the Python one for rows whose RowBinary ends in 0x0A."""

from __future__ import annotations

import pytest

from dpone.contracts.preparation import rows_digest, rows_digest_sql
from dpone.localserver import ServerInfo
from tests import chhttp


@pytest.mark.parametrize(
    "value",
    [b"\xd4\x8bN\n", b"\n", b"a\n\n", b"\n\x00", b""],
    ids=["ends-newline", "only-newline", "two-newlines", "newline-inside", "empty"],
)
def test_server_digest_counts_a_final_newline_byte(clickhouse: ServerInfo, value: bytes) -> None:
    # Found by `dpone demo`: formatRowNoNewline dropped the final byte of such rows, so
    # the catalog's digest differed from preparation's and publication refused.
    row = bytes([len(value)]) + value  # RowBinary of one String: varint length, bytes
    server = chhttp.rows(
        clickhouse.http_port,
        f"SELECT {rows_digest_sql(['s'])} AS d FROM (SELECT unhex('{value.hex()}') AS s)",
    )
    assert server == [{"d": rows_digest([row])}]
