"""A managed server of a test module's own, for what the session server cannot declare.

Files under ``run/`` (``users.d/*.xml``, ``config.d/*.xml``) are merged by the server
at start only, so they are written before it starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from dpone.localserver import LocalServer, ServerInfo, ServerUser
from tests import chhttp


@contextlib.contextmanager
def own_server(
    data: Path, users: Sequence[ServerUser], run_files: Mapping[str, str]
) -> Iterator[ServerInfo]:
    """Start a managed server in ``data`` with ``run_files`` (paths under ``run/``) in place."""
    for relative, text in run_files.items():
        path = data / "run" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    local = LocalServer(data, users=users)
    info = local.start()
    chhttp.register_server(info.http_port, data)
    try:
        yield info
    finally:
        local.stop()
