"""Which worker runs an attempt: noted in the store before the attempt's first mutation.

Workers that share a PostgreSQL store keep their journals in work directories of their
own. So that ``dpone status`` on any of them can say whose files an unfinished attempt
needs, a refresh notes its attempt under ``attempt/<attempt_id>`` (host, process, the
attempt's journal directory) before it leases anything for it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from dpone.publication.store import SnapshotStore

_KEY_PREFIX = "attempt/"


def register_attempt(store: SnapshotStore, attempt_id: str, attempts_dir: Path) -> None:
    """Note that this process, in ``attempts_dir``, runs ``attempt_id``."""
    store.note_step(
        f"{_KEY_PREFIX}{attempt_id}",
        {
            "step": "registered",
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "journal": str((attempts_dir / attempt_id).absolute()),
        },
    )


def attempt_worker(store: SnapshotStore, attempt_id: str) -> dict[str, Any] | None:
    """Where ``attempt_id`` ran (host, pid, journal), or None when it was not noted."""
    notes = store.step_notes(f"{_KEY_PREFIX}{attempt_id}")
    if not notes:
        return None
    facts = notes[0].facts
    return {key: facts.get(key) for key in ("host", "pid", "journal")}
