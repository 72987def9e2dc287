"""ContractValidatedFileArtifact and FileVerificationBudget."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dpone.contracts.receipt import FileReceipt
from dpone.errors import DeadlineError, StateError
from dpone.preparation.artifact import ArtifactMismatch, FileVerificationBudget, HeldArtifact
from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
from tests.plugins.staging import export_hostile


def test_binding_complete_and_busy(tmp_path: Path) -> None:
    path, receipt, data = export_hostile(tmp_path)
    artifact = ContractValidatedFileArtifact(path, receipt)
    with artifact.file_validation_attempt("a1") as attempt:
        with pytest.raises(StateError) as busy, artifact.file_validation_attempt("a2"):
            pass
        assert busy.value.code == "artifact_busy"
        assert artifact.active is attempt  # the busy entry did not reset the active attempt
        for bad in (True, float(len(data)), str(len(data))):
            with pytest.raises(StateError) as caught:
                attempt.complete(bad)
            assert caught.value.code == "invalid_count"
        with pytest.raises(StateError) as mismatch:
            attempt.complete(len(data) + 1)
        assert mismatch.value.code == "count_mismatch"
        summary = attempt.complete(len(data))
    assert artifact.latest_summary == summary and summary.rows == len(data)
    with pytest.raises(RuntimeError), artifact.file_validation_attempt("a3"):
        raise RuntimeError("boom")
    assert artifact.latest_summary is None  # exceptional exit resets the summary


def test_receipt_replacement_is_rejected(tmp_path: Path) -> None:
    path, receipt, data = export_hostile(tmp_path)
    original = receipt.read_bytes()
    artifact = ContractValidatedFileArtifact(path, receipt)
    with artifact.file_validation_attempt("a1") as attempt:
        receipt.write_bytes(original)  # same bytes rewritten: still the same receipt
        attempt.verify()
        # Another valid receipt for the same file, renamed over the original.
        forged = original.replace(
            b'"rows_validated":%d' % len(data), b'"rows_validated":%d' % (len(data) + 1)
        )
        assert forged != original and FileReceipt.from_bytes(forged).artifact_sha256
        replacement = tmp_path / "r2"
        replacement.write_bytes(forged)
        os.replace(replacement, receipt)
        with pytest.raises(ArtifactMismatch) as caught:
            attempt.verify()
        assert caught.value.code == "receipt_replaced"
        with pytest.raises(ArtifactMismatch) as completing:
            attempt.complete(len(data))
        assert completing.value.code == "receipt_replaced"
        assert attempt.completed is None
        receipt.unlink()
        with pytest.raises(ArtifactMismatch) as removed:
            attempt.verify()
        assert removed.value.code == "receipt_replaced"


def test_verification_budget_deadline_and_cap(tmp_path: Path) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    from dpone.contracts.receipt import FileReceipt

    parsed = FileReceipt.from_bytes(receipt.read_bytes())
    ticks = iter([0.0, 0.0, 5.0, 5.0, 5.0])
    with HeldArtifact(path, parsed) as held:
        with pytest.raises(DeadlineError) as late:
            held.verify(
                FileVerificationBudget(
                    deadline=1.0, max_scan_bytes=10**9, clock=lambda: next(ticks)
                )
            )
        assert late.value.code == "verification_deadline"
        with pytest.raises(ArtifactMismatch) as big:
            held.verify(
                FileVerificationBudget(deadline=float("inf"), max_scan_bytes=10, clock=lambda: 0.0)
            )
        assert big.value.code == "verification_budget_exceeded"
        os.lseek(held.fd, 3, os.SEEK_SET)
        held.verify(
            FileVerificationBudget(deadline=float("inf"), max_scan_bytes=10**9, clock=lambda: 0.0)
        )
        assert os.lseek(held.fd, 0, os.SEEK_CUR) == 3


def test_a_missing_receipt_is_a_coded_error_naming_it(tmp_path: Path) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    gone = Path(receipt).with_name("no-such.receipt.json")
    artifact = ContractValidatedFileArtifact(path, gone)
    with pytest.raises(ArtifactMismatch) as caught, artifact.file_validation_attempt("a1"):
        pass
    assert caught.value.code == "receipt_unreadable"
    assert caught.value.details["receipt"] == str(gone)
    assert isinstance(caught.value.__cause__, FileNotFoundError)
    # The same artifact is free again (a failed entry holds no lock) once its receipt is there.
    artifact.receipt_path = Path(receipt)
    with artifact.file_validation_attempt("a2") as attempt:
        assert attempt.attempt_id == "a2"
