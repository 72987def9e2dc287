"""The publication's settings a project file may give (``[publication]`` of ``dpone.toml``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpone.publication.dispatch.executor import SESSION_MARGIN_SECONDS, SESSION_TIMEOUT_SECONDS


@dataclass(frozen=True)
class PublicationSettings:
    """The drain-gate session's timeout T and closure's margin past it.

    Closure waits T plus the margin after the EXCHANGE's answer before its probe; a
    slower network between this host and the server needs a larger margin.
    """

    session_timeout_seconds: int = SESSION_TIMEOUT_SECONDS
    session_margin_seconds: float = SESSION_MARGIN_SECONDS
    # Publish what was staged without a drain gate (the client transport): its ingest
    # closure then rests on process samples and the query log alone.
    accept_ungated_ingest: bool = False


# The margin's default for a remote server: the loopback default (372 was reliable from
# T + 2 s, measured) and a second for a network's delays between the answer dpone
# records and the server's own clock of the session.
REMOTE_SESSION_MARGIN_SECONDS = SESSION_MARGIN_SECONDS + 1.0


def check_timeout(value: int) -> str | None:
    """Why a ``session_timeout_seconds`` is refused (None: accepted)."""
    return None if 1 <= value <= 3600 else "must be between 1 and 3600"


def check_margin(value: float) -> str | None:
    """Why a ``session_margin_seconds`` is refused (None: accepted)."""
    return None if math.isfinite(value) and 0 <= value <= 3600 else "must be between 0 and 3600"


# Each key of ``[publication]``: its type, default and check (``dpone.project.config``).
SETTINGS: dict[str, tuple[type, object, Callable[[Any], str | None]]] = {
    "session_timeout_seconds": (int, SESSION_TIMEOUT_SECONDS, check_timeout),
    "session_margin_seconds": (float, SESSION_MARGIN_SECONDS, check_margin),
    "accept_ungated_ingest": (bool, False, lambda _: None),
}


def ungated_transport(transport: str, settings: PublicationSettings) -> str | None:
    """Why a staging ``transport`` is refused under ``settings`` (None: accepted).

    The client transport (the native protocol) has no sessions, so staging's writes
    over it run without the ingest drain gate; publishing them is the user's choice.
    """
    if transport != "client" or settings.accept_ungated_ingest:
        return None
    return (
        "'client' (the native protocol) has no session, so staging's writes run without a "
        "drain gate; use 'http', or set [publication] accept_ungated_ingest = true to "
        "publish on process samples and the query log alone"
    )
