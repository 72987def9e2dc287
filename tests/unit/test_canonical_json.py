"""Canonical JSON: exact bytes, strict parsing, digests."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpone.contracts import canonical_json as cj


def test_exact_bytes() -> None:
    value = {"b": [1, -2, True, None], "a": 'é\u0001"\\\n\x7f😀', "c": {}}
    assert cj.dumps(value) == (
        '{"a":"é\\u0001\\"\\\\\\n\x7f😀","b":[1,-2,true,null],"c":{}}'.encode()
    )
    assert cj.sha256_hex(value) == hashlib.sha256(cj.dumps(value)).hexdigest()


def test_keys_sort_by_code_point() -> None:
    assert cj.dumps({"b": 1, "B": 2, "é": 3, "a": 4}) == '{"B":2,"a":4,"b":1,"é":3}'.encode()


@pytest.mark.parametrize(
    "value", [1.5, float("nan"), float("inf"), {"x": 0.0}, "\ud800", {1: "x"}, b"x"]
)
def test_unencodable_values(value: object) -> None:
    with pytest.raises(cj.CanonicalJsonError):
        cj.dumps(value)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b'{"a":1,"a":2}', "duplicate_member"),
        (b'{"a":1.0}', "float_not_allowed"),
        (b'{"a":NaN}', "float_not_allowed"),
        (b'{"a":1e3}', "float_not_allowed"),
        (b'{"a": 1}', "noncanonical_json"),
        (b'{"b":1,"a":2}', "noncanonical_json"),
        (b'{"a":"\\u00e9"}', "noncanonical_json"),
        (b'{"a":-0}', "noncanonical_json"),
        (b'{"a":01}', "noncanonical_json"),
        (b"\xef\xbb\xbf{}", "noncanonical_json"),
        (b'{"a":"\xff"}', "noncanonical_json"),
        (b'{"a":1}\n', "noncanonical_json"),
        (b"{", "noncanonical_json"),
    ],
)
def test_strict_parse_refuses(data: bytes, code: str) -> None:
    with pytest.raises(cj.CanonicalJsonError) as caught:
        cj.loads(data)
    assert caught.value.code == code


def test_loose_parse_still_refuses_duplicates_and_floats() -> None:
    assert cj.loads(b'{ "b": 1,\n "a": 2 }', canonical=False) == {"a": 2, "b": 1}
    with pytest.raises(cj.CanonicalJsonError):
        cj.loads(b'{"a": 1, "a": 1}', canonical=False)
    with pytest.raises(cj.CanonicalJsonError):
        cj.loads(b'{"a": 0.5}', canonical=False)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(alphabet=st.characters(exclude_categories=["Cs"])),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_round_trip(value: object) -> None:
    data = cj.dumps(value)
    assert cj.loads(data) == value
    assert cj.dumps(cj.loads(data)) == data


_LEAVES = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text()
_VALUES = st.recursive(
    _LEAVES | st.sampled_from(["\ud800", "a\udfffb", b"bytes", 1j]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text() | st.sampled_from(["\udc80", 3]), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(_VALUES)
def test_the_fast_check_accepts_exactly_what_the_explaining_walk_accepts(value: object) -> None:
    """dumps checks without building paths first; only a refused value is walked again
    to say where. Both must agree on every value."""
    try:
        cj._check_value(value, "$")
        walked = True
    except cj.CanonicalJsonError:
        walked = False
    assert cj._plain(value) is walked
