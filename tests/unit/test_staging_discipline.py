"""Staging fixes that no test held before (issue 37, item 14), each on the real file
system: a one-line reversal of the fix makes its test fail (said in each test).
"""

from __future__ import annotations

import inspect
import math
import time
from pathlib import Path

import pytest

from dpone.errors import ConfigurationError, DponeError, JournalError
from dpone.preparation.artifact import FileVerificationBudget
from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
from dpone.staging.contract import StagingPolicy
from dpone.staging.journal import ClickHouseFileAttemptJournal, read_events
from dpone.staging.service import ClickHouseValidatedFileService
from tests.plugins.staging import export_hostile

EVENT = {"state": "checking", "outcome": "admitted", "cleanup_inventory": {}}


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 0, -1, True, "5"])
@pytest.mark.parametrize("field", ["max_rows", "max_spool_bytes", "preparation_seconds"])
def test_the_staging_policy_refuses_every_bound_that_is_not_finite_and_positive(
    field: str, bad: object
) -> None:
    """Reversal: without the `inf` check, max_rows = inf was a policy with no bound."""
    with pytest.raises(ConfigurationError) as caught:
        StagingPolicy(**{field: bad})  # type: ignore[arg-type]
    assert (caught.value.code, caught.value.details["field"]) == ("invalid_policy", field)


def test_the_service_has_no_journal_by_default() -> None:
    """Reversal: a default journal_factory would let a caller stage with a journal it
    never chose (and whose storage it never bounded)."""
    parameter = inspect.signature(ClickHouseValidatedFileService).parameters["journal_factory"]
    assert parameter.default is inspect.Parameter.empty
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY


def test_two_writers_of_one_attempt_diverge_and_the_second_records_nothing(
    tmp_path: Path,
) -> None:
    """Reversal: without journal_diverged, the second writer took the first's event
    aside as torn and wrote its own in its place."""
    first = ClickHouseFileAttemptJournal(tmp_path, "a1")
    first.open()
    first.record(EVENT)
    second = ClickHouseFileAttemptJournal(tmp_path, "a1")
    assert [e.sequence for e in second.resume()] == [1]
    first.record({**EVENT, "outcome": "first"})  # event 2, the first writer's
    with pytest.raises(JournalError) as caught:
        second.record({**EVENT, "outcome": "second"})
    assert caught.value.code == "journal_diverged"
    events = read_events(tmp_path / "a1")
    assert [e.document["outcome"] for e in events] == ["admitted", "first"]
    assert not (tmp_path / "a1" / "torn").exists()


def test_a_journal_whose_attempt_directory_became_a_link_records_nothing(
    tmp_path: Path,
) -> None:
    """Reversal: without O_NOFOLLOW, the event went through the link, into a directory
    the attempt never made."""
    journal = ClickHouseFileAttemptJournal(tmp_path / "work", "a1")
    journal.open()
    journal.record(EVENT)
    journal.close()
    elsewhere = tmp_path / "elsewhere"
    (tmp_path / "work" / "a1").rename(elsewhere)
    (tmp_path / "work" / "a1").symlink_to(elsewhere, target_is_directory=True)
    later = ClickHouseFileAttemptJournal(tmp_path / "work", "a1")
    later.sequence, later.last_sha256 = 1, journal.last_sha256
    with pytest.raises(DponeError):
        later.record({**EVENT, "outcome": "through the link"})
    assert sorted(p.name for p in (elsewhere / "events").iterdir()) == ["000001"]


def test_a_receipt_replaced_during_the_verification_scan_is_refused(tmp_path: Path) -> None:
    """Reversal: with the check after the scan removed, a receipt replaced while the
    scan read the file went unnoticed (the check before the scan had passed), and the
    attempt ended staged."""
    path, receipt, _ = export_hostile(tmp_path)
    (tmp_path / "other").mkdir()
    _, other, _ = export_hostile(tmp_path / "other", rows=3)
    armed = [False]

    def clock() -> float:  # asked before and after every read of the scan
        if armed[0]:
            armed[0] = False
            incoming = receipt.with_name("incoming.json")
            incoming.write_bytes(other.read_bytes())
            incoming.replace(receipt)  # atomically, as a user's tool would
        return time.monotonic()

    budget = FileVerificationBudget(time.monotonic() + 600, 2**40, clock)
    artifact = ContractValidatedFileArtifact(path, receipt)
    with artifact.file_validation_attempt("scan-1", verification_budget=budget) as attempt:
        armed[0] = True
        with pytest.raises(DponeError) as caught:
            attempt.verify()
    assert caught.value.code == "receipt_replaced"
    assert armed[0] is False  # the replacement happened inside the scan
