"""The preparation modes: which converter turns a file into RowBinary.

Two implementations of one policy: the compiled converter (``native``, the default),
which hands anything it declines to the Python reference, and the Python reference
alone (``python-reference``), the specification both are tested against. A mode an
earlier dpone had is refused with a typed error that names its replacement, wherever
it is given (a flag, ``dpone.toml``, a library call).
"""

from __future__ import annotations

from dpone.errors import ConfigurationError

MODE_NATIVE = "native"
MODE_PYTHON = "python-reference"
MODES = (MODE_NATIVE, MODE_PYTHON)
DEFAULT_MODE = MODE_NATIVE
# Removed modes, and the mode that does their work now. engine-chdb converted with the
# embedded ClickHouse engine what the compiled converter declined: nearly always a
# refused file, which the reference must name anyway.
REMOVED_MODES = {"engine-chdb": MODE_NATIVE}


class PreparationModeRemoved(ConfigurationError):
    """A preparation mode this dpone no longer has; ``details`` name its replacement."""

    code = "preparation_mode_removed"


def removed_mode_message(mode: str) -> str:
    """What to say about the removed ``mode``: that it is gone, and what to use instead."""
    return (
        f"the preparation mode {mode!r} was removed (the embedded-engine converter is gone); "
        f"use {REMOVED_MODES[mode]!r}, the default, which hands what it declines to "
        f"{MODE_PYTHON!r}"
    )


def refuse_removed_mode(mode: str) -> str:
    """``mode``, unless it is a removed one: then :class:`PreparationModeRemoved`."""
    if mode in REMOVED_MODES:
        raise PreparationModeRemoved(
            removed_mode_message(mode), mode=mode, replacement=REMOVED_MODES[mode]
        )
    return mode
