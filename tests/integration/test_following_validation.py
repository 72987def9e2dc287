"""The validation that follows a file while it is written gives validate_file's receipt,
or no verdict at all: never a different one (issue 25, the overlap)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.exporters import export as export_module
from dpone.exporters.export import export_table
from dpone.exporters.sources import SqliteSource
from dpone.preparation import following_validation, native_conversion
from dpone.preparation.conversion import ValueNotRepresentable
from dpone.preparation.file_validation import validate_file
from dpone.preparation.following_validation import FollowingValidation
from tests.plugins.staging import make_hostile_db

SCHEMA = SourceSchema.of(
    [
        SourceColumn("id", "int", False),
        SourceColumn("name", "nvarchar(40)", True),
        SourceColumn("price", "decimal(18, 2)", True),
    ]
)


def records(first: int, last: int) -> bytes:
    return b"".join(
        b"%d\tname \x1dT%d\t%d.%02d\n" % (i, i, i, i % 100) for i in range(first, last + 1)
    )


def write_following(path: Path, pieces: list[bytes], pause: float = 0.0) -> FollowingValidation:
    """Write ``pieces`` to ``path`` one by one, telling the follower after each flush."""
    stream = path.open("wb")
    following = FollowingValidation.start(str(path), SCHEMA)
    assert following is not None
    size = 0
    for piece in pieces:
        stream.write(piece)
        stream.flush()
        size += len(piece)
        following.flushed(size)
        time.sleep(pause)
    stream.close()
    return following


@pytest.fixture(autouse=True)
def tiny_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ranges of a few KiB, so that a small file is followed over many of them.
    monkeypatch.setattr(native_conversion, "MIN_RANGE_BYTES", 4096)
    monkeypatch.setattr(native_conversion, "MAX_RANGE_BYTES", 4096)


def test_a_followed_file_gets_the_receipt_validate_file_gives(tmp_path: Path) -> None:
    path = tmp_path / "f.tsv"
    pieces = [records(i * 1000 + 1, (i + 1) * 1000) for i in range(20)]
    following = write_following(path, pieces, pause=0.005)
    followed = following.finish(path.stat().st_size)
    assert followed is not None
    assert followed == validate_file(path, SCHEMA)
    assert followed.rows_validated == 20_000


def test_a_bad_value_leaves_the_verdict_to_validate_file(tmp_path: Path) -> None:
    path = tmp_path / "f.tsv"
    bad = b"15001\tname\t12.345\n"  # three decimals do not fit decimal(18, 2)
    following = write_following(path, [records(1, 15000), bad, records(15002, 16000)])
    assert following.finish(path.stat().st_size) is None
    with pytest.raises(ValueNotRepresentable) as caught:
        validate_file(path, SCHEMA)
    assert caught.value.details["record"] == 15001


def test_a_size_the_file_does_not_have_gives_no_receipt(tmp_path: Path) -> None:
    path = tmp_path / "f.tsv"
    following = write_following(path, [records(1, 3000)])
    with path.open("ab") as late:  # appended behind the writer's back
        late.write(records(3001, 3002))
    assert following.finish(len(records(1, 3000))) is None


def test_an_abandoned_follower_stops_and_decides_nothing(tmp_path: Path) -> None:
    path = tmp_path / "f.tsv"
    stream = path.open("wb")
    following = FollowingValidation.start(str(path), SCHEMA)
    assert following is not None
    stream.write(records(1, 100))
    stream.flush()
    following.flushed(len(records(1, 100)))
    before = threading.active_count()
    following.abandon()  # its thread waited for more: it ends now
    assert threading.active_count() < before
    assert following.finish(len(records(1, 100))) is None
    stream.close()


def test_no_follower_where_the_compiled_converter_takes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As where the converter is not built or DPONE_NATIVE=0 (read once, at import).
    monkeypatch.setattr(following_validation, "not_taken", lambda plans: "is switched off")
    assert FollowingValidation.start(str(tmp_path / "f.tsv"), SCHEMA) is None
    assert not (tmp_path / "f.tsv").exists()  # nothing was opened or made


def test_an_export_is_decided_by_its_follower_with_validate_files_receipt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_hostile_db(tmp_path / "src.db")
    source = SqliteSource(tmp_path / "src.db")
    called: list[str] = []
    real = validate_file

    def counted(*args: object, **kwargs: object) -> object:
        called.append("validate_file")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(export_module, "validate_file", counted)
    followed = export_table(source, "hostile", tmp_path / "a.tsv")
    assert called == []  # the follower decided it
    assert followed.receipt == validate_file(tmp_path / "a.tsv", followed.receipt.schema)
    # Without a follower the export validates the whole file after writing it: the
    # same receipt, byte for byte.
    monkeypatch.setattr(FollowingValidation, "start", lambda *a, **k: None)
    after = export_table(source, "hostile", tmp_path / "b.tsv")
    assert called == ["validate_file"]
    assert after.receipt.to_bytes() == followed.receipt.to_bytes()
    assert (tmp_path / "a.tsv").read_bytes() == (tmp_path / "b.tsv").read_bytes()
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["src.db", "a.tsv", "a.tsv.receipt.json", "b.tsv", "b.tsv.receipt.json"]
    )
