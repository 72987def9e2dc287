"""The engine session: its answers are all taken, and its workers run side by side."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dpone.preparation import engine_child
from dpone.preparation.engine_conversion import REFUSAL, EngineSession, EngineUnavailable
from dpone.sql import quote_literal

# A peer that answers like the engine but writes its "ready" line and two answers in
# one write, so they reach the parent's pipe together (the real engine does this
# only by chance, when two workers finish at once).
_BURST = """#!{python}
import sys, time
sys.stdout.write('{{"id": -1, "out": "ready"}}\\n{{"id": 0, "out": "a"}}\\n{{"id": 1, "out": "b"}}\\n')
sys.stdout.flush()
time.sleep(60)
"""


def _fake_engine(tmp_path: Path, program: str) -> tuple[Path, Path]:
    """An executable that stands in for the engine's Python, and a work directory."""
    peer = tmp_path / "peer"
    peer.write_text(program.format(python=sys.executable))
    peer.chmod(peer.stat().st_mode | stat.S_IXUSR)
    work = tmp_path / "work"
    work.mkdir()
    return peer, work


def _within(seconds: float) -> Callable[[], bool]:
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() >= deadline


def test_answers_that_arrive_together_are_all_returned(tmp_path: Path) -> None:
    peer, work = _fake_engine(tmp_path, _BURST)
    with EngineSession(work, workers=2, python=str(peer)) as session:
        # Before the fix the second answer stayed in a read buffer that select does not
        # see: the wait ran into this deadline although the answer had arrived.
        first = session.next_result(_within(20))
        second = session.next_result(_within(20))
    assert [first, second] == [(0, "a"), (1, "b")]


def test_two_workers_run_their_queries_side_by_side(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    with EngineSession(tmp_path, workers=2) as session:
        # Job 0 says it started (a file), then holds its worker for three seconds.
        session.submit(
            0,
            [
                f"SELECT 1 INTO OUTFILE {quote_literal(str(marker))} FORMAT TSV",
                "SELECT sum(sleep(1)) FROM numbers(3) SETTINGS max_block_size = 1, max_threads = 1",
            ],
        )
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert marker.exists()
        session.submit(1, ["SELECT count() FROM system.processes"])
        answers = [session.next_result(_within(60)) for _ in range(2)]
    # Job 1 answers first, while job 0 still sleeps: with one shared connection it
    # would wait behind job 0.
    assert [job for job, _ in answers] == [1, 0] and answers[1] == (0, "0\n")


def test_a_session_adopts_the_early_engine_and_removes_its_directory(tmp_path: Path) -> None:
    engine_child.start_early()
    early = engine_child._early
    assert early is not None and early.home is not None and early.home.is_dir()
    with EngineSession(tmp_path, workers=early.workers) as session:
        assert session._process is early.process  # adopted, not a second engine
        session.submit(0, ["SELECT 40 + 2"])
        assert session.next_result(_within(60)) == (0, "42\n")
    assert early.process.returncode is not None and not early.home.exists()
    assert engine_child._early is None


def test_an_early_engine_that_does_not_fit_is_ended(tmp_path: Path) -> None:
    engine_child.start_early()
    early = engine_child._early
    assert early is not None and early.home is not None
    with EngineSession(tmp_path, workers=early.workers + 1) as session:
        assert session._process is not early.process
        assert early.process.returncode is not None and not early.home.exists()
        session.submit(0, ["SELECT 1"])
        assert session.next_result(_within(60)) == (0, "1\n")


@pytest.mark.parametrize(
    "args",
    [
        ["validate", "missing.tsv", "--schema", "missing.json", "--json"],
        ["stage", "missing.tsv", "--receipt", "missing.json", "--database", "d", "--json"],
    ],
)
def test_a_command_that_fails_early_leaves_no_engine_behind(
    tmp_path: Path, args: list[str]
) -> None:
    # The early engine starts before the command looks at its arguments; a command that
    # stops at once must still end it and remove its directory.
    done = subprocess.run(
        [sys.executable, "-m", "dpone", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path), engine_child.SCRATCH_ENV: str(tmp_path)},
        timeout=120,
        check=False,
    )
    assert done.returncode != 0 and json.loads(done.stdout)["ok"] is False
    assert not list(tmp_path.glob("dpone-engine-*"))


_DIES_AFTER_READY = """#!{python}
import sys
sys.stdout.write('{{"id": -1, "out": "ready"}}\\n')
sys.stdout.flush()
"""


def test_an_engine_that_died_with_work_unsent_gives_the_engine_error(tmp_path: Path) -> None:
    peer, work = _fake_engine(tmp_path, _DIES_AFTER_READY)

    def submit_to_the_dead() -> None:
        with EngineSession(work, python=str(peer)) as session:
            session._process.wait(timeout=60)
            # The line stays in the writer's buffer when its flush meets the broken pipe,
            # so closing stdin later meets it again. That must not replace this error.
            session.submit(0, ["SELECT 1"])

    # It says that the engine ended and how, not only that a pipe broke.
    with pytest.raises(EngineUnavailable, match=r"the engine exited \(0\)"):
        submit_to_the_dead()


_KILLED_WITH_EARLY_ENGINE = """
import os, signal, sys
from dpone.preparation import engine_child
engine_child.start_early()
child = engine_child._early
print(child.process.pid, child.home, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_an_early_engine_whose_parent_is_killed_removes_its_directory(tmp_path: Path) -> None:
    parent = subprocess.run(
        [sys.executable, "-c", _KILLED_WITH_EARLY_ENGINE],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path), engine_child.SCRATCH_ENV: str(tmp_path)},
        timeout=120,
        check=False,
    )
    assert parent.returncode == -9, parent.stderr
    pid, home = parent.stdout.split()
    assert Path(home).parent == tmp_path
    deadline = time.monotonic() + 90  # not a speed check: it loads, then sees stdin close
    while Path(home).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if Path(home).exists():
        subprocess.run(["kill", "-9", pid], check=False)
    assert not Path(home).exists()


def test_a_refused_job_runs_its_fallback_and_only_the_fallback_answers(tmp_path: Path) -> None:
    refuse = f"SELECT throwIf(1, {quote_literal(REFUSAL)})"
    with EngineSession(tmp_path, workers=1) as session:
        session.submit(0, [refuse], fallback=["SELECT 7"])
        assert session.next_result(_within(60)) == (0, "7\n")
        # A fallback that refuses too is the job's refusal.
        session.submit(1, ["SELECT 1", refuse], fallback=[refuse])
        assert session.next_result(_within(60)) == (1, None)
        # A job that does not refuse never runs its fallback (which would fail).
        session.submit(2, ["SELECT 2"], fallback=["SELECT throwIf(1, 'not run')"])
        assert session.next_result(_within(60)) == (2, "2\n")
        # Only a refusal falls back: any other failure is the engine's.
        session.submit(3, ["SELECT throwIf(1, 'broken')"], fallback=["SELECT 3"])
        with pytest.raises(EngineUnavailable, match="broken"):
            session.next_result(_within(60))


def test_a_session_without_a_directory_works_in_a_home_of_its_own_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "shm"
    scratch.mkdir()
    monkeypatch.delenv(engine_child.SCRATCH_ENV, raising=False)
    monkeypatch.setattr(engine_child, "MEMORY_SCRATCH", str(scratch))
    monkeypatch.setattr(engine_child, "MEMORY_SCRATCH_MIN_FREE", 1)
    # The embedded engine makes a directory in TMPDIR at each start and leaves it
    # there: the child's TMPDIR is its home, so it goes with the home.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    with EngineSession(workers=1) as session:
        home = session.work_dir
        assert home.parent == scratch and stat.S_IMODE(home.stat().st_mode) == 0o700
        (home / "in-0").write_text("a\tb\n")
        session.submit(
            0, [f"SELECT count() FROM file({quote_literal(str(home / 'in-0'))}, 'LineAsString')"]
        )
        assert session.next_result(_within(60)) == (0, "1\n")
        assert [
            p.name.startswith("clickhouse-embedded-") for p in home.iterdir() if p.is_dir()
        ] == [True]
    assert not home.exists()
    assert list(temporary.iterdir()) == []
    monkeypatch.setenv(engine_child.SCRATCH_ENV, str(tmp_path))
    assert engine_child.scratch_root() == str(tmp_path)  # the user's choice first
    monkeypatch.delenv(engine_child.SCRATCH_ENV)
    # Too little free there, or no such directory: the temporary directory instead.
    monkeypatch.setattr(engine_child, "MEMORY_SCRATCH_MIN_FREE", 1 << 62)
    assert engine_child.scratch_root() is None
    monkeypatch.setattr(engine_child, "MEMORY_SCRATCH_MIN_FREE", 1)
    assert engine_child.scratch_root() == str(scratch)
    monkeypatch.setattr(engine_child, "MEMORY_SCRATCH", str(tmp_path / "missing"))
    assert engine_child.scratch_root() is None


def test_a_scratch_directory_the_user_names_is_used_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(engine_child.SCRATCH_ENV, "rel")
    (tmp_path / "rel").mkdir()
    with EngineSession(workers=1) as session:
        assert session.work_dir.is_absolute() and session.work_dir.parent == tmp_path / "rel"
    # Unusable: the engine does not start, and says why (no silent other place).
    monkeypatch.setenv(engine_child.SCRATCH_ENV, str(tmp_path / "missing"))
    with pytest.raises(EngineUnavailable, match="could not start") as caught:
        EngineSession(workers=1)
    assert caught.value.code == "engine_scratch"
    assert caught.value.details["path"] == str(tmp_path / "missing")
    assert f"{tmp_path / 'missing'} (from {engine_child.SCRATCH_ENV})" in str(caught.value)
    assert not (tmp_path / "missing").exists()


_BOTH_KILLED = """
import os, signal
from dpone.preparation import engine_child
child = engine_child.start_at_home(1)
print(child.home, flush=True)
os.kill(child.process.pid, signal.SIGKILL)
child.process.wait()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_home_left_by_an_engine_killed_with_its_parent_is_swept(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _BOTH_KILLED],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, engine_child.SCRATCH_ENV: str(tmp_path)},
        check=False,
    )
    assert done.returncode == -9, done.stderr
    left = Path(done.stdout.strip())
    assert left.parent == tmp_path and (left / engine_child.OWNER_MARK).is_file()
    # A live owner's home and a home without a mark (being made) are not touched.
    live = tmp_path / "dpone-engine-live"
    live.mkdir()
    me = engine_child._started(os.getpid())
    (live / engine_child.OWNER_MARK).write_text(f"{os.getpid()} {me}")
    unmarked = tmp_path / "dpone-engine-new"
    unmarked.mkdir()
    assert engine_child.sweep_stale_homes(str(tmp_path)) == [left]
    assert not left.exists() and live.is_dir() and unmarked.is_dir()
    # Same pid, another start time: a reused pid, so the home's engine is gone.
    (live / engine_child.OWNER_MARK).write_text(f"{os.getpid()} 1")
    assert engine_child.sweep_stale_homes(str(tmp_path)) == [live]
