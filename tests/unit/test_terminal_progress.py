"""The progress line's figures: a rate only once it means something, no empty counts."""

from __future__ import annotations

import pytest

from dpone.cli.output import TerminalProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_rate_is_shown_only_after_half_a_second(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    line = TerminalProgress("export", clock)
    clock.now += 0.001  # the "169,109,357,616 rows/s" came from such an interval
    line(169_109, 2**20)
    clock.now += 1.999
    line(400_000, 3 * 2**20)
    TerminalProgress.finish()
    shown = capsys.readouterr().err.split("\r")[1:]
    assert [s.strip() for s in shown] == [
        "export: 169,109 rows, 1.0 MiB",
        "export: 400,000 rows, 3.0 MiB, 200,000 rows/s",
    ]


def test_a_phase_without_rows_shows_what_it_has(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    line = TerminalProgress("preparing", clock)
    clock.now += 5
    line(0, int(7.6 * 2**20))  # before: "preparing: 0 rows, 7.6 MiB, 0 rows/s"
    line(0, 0)
    TerminalProgress.finish()
    shown = capsys.readouterr().err.split("\r")[1:]
    assert [s.strip() for s in shown] == ["preparing: 7.6 MiB", "preparing: running"]
