"""Administrative SQL on the managed local server over its HTTP interface.

This is for server management only (creating the demo database, reading the
version). Data movement goes through the controlled transports, which own framing,
budgets and deadlines; this helper reads small answers and nothing more.
"""

from __future__ import annotations

import http.client

from dpone.errors import TransportError
from dpone.localserver.probe import LOOPBACK
from dpone.ports.clickhouse_request import Credentials

MAX_ANSWER_BYTES = 1 << 20


def run_admin_sql(
    http_port: int, sql: str, *, credentials: Credentials, timeout: float = 30.0
) -> str:
    """Run one statement as ``credentials`` (the administrator); return its text answer.

    The password travels in a header, never in the URL.
    """
    conn = http.client.HTTPConnection(LOOPBACK, http_port, timeout=timeout)
    try:
        conn.request(
            "POST",
            "/?wait_end_of_query=1",
            body=sql.encode("utf-8"),
            headers={
                "X-ClickHouse-User": credentials.user,
                # Bytes: http.client refuses non-Latin-1 text in a header.
                "X-ClickHouse-Key": credentials.password.encode("utf-8"),
            },
        )
        response = conn.getresponse()
        body = response.read(MAX_ANSWER_BYTES + 1)
        tagged = response.getheader("X-ClickHouse-Exception-Code")
    except (OSError, http.client.HTTPException) as exc:
        raise TransportError(
            f"admin query to 127.0.0.1:{http_port} failed: {exc}", code="admin_query_failed"
        ) from exc
    finally:
        conn.close()
    text = body[:MAX_ANSWER_BYTES].decode("utf-8", errors="replace")
    if response.status != 200 or tagged or len(body) > MAX_ANSWER_BYTES:
        raise TransportError(
            f"admin query failed with HTTP {response.status}: {text.strip()[:500]}",
            code="admin_query_failed",
            status=response.status,
        )
    return text
