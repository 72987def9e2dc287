"""The hostile values every codec and staging test runs through."""

from __future__ import annotations

HOSTILE_TEXT: list[str] = [
    "NULL",
    "null",
    "\\N",
    "",
    " ",
    "  ",
    "\t",
    "\n",
    "\r",
    "\r\n",
    *[chr(c) for c in range(0x20)],
    "\x7f",
    *["\x1d" + letter for letter in "EPTRNUSXe"],
    "\x1d",
    "\x1d\x1d",
    "a\x1d",
    "\x1dEa",
    "'",
    '"',
    "''",
    "\\",
    "\\t",
    "\\\\",
    "a'b\"c\\d",
    "e\u0301",
    "ñ",
    "👩\u200d👩\u200d👧",
    "🎉",
    "עברית",
    "مرحبا",
    "\u202eabc",
    "\ufeff",
    "\u00a0",
    "x" * 127,
    "x" * 128,
    "x" * 16383,
    "x" * 16384,
    "é" * 64,
]

HOSTILE_BINARY: list[bytes] = [
    b"",
    b"\x00",
    bytes(range(256)),
    bytes(range(255, -1, -1)),
    b"\x1d",
    b"\t\n\r",
    b"\xff" * 127,
    b"\x00" * 128,
    b"\xab" * 16383,
    b"\xcd" * 16384,
]


# Identifiers and literals that quoting must carry through unchanged.
HOSTILE_NAMES = [
    "plain",
    "with space",
    "back`tick",
    "quote'd",
    'double"q',
    "back\\slash",
    "new\nline",
    "tab\there",
    "nul\0byte",
    "semi;DROP TABLE x;--",
    "ünïcødé ✓ 表",
    "\x01\x1f\x7f",
]
