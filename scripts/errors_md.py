#!/usr/bin/env python3
"""Write docs/errors.md from the registry of error codes (src/dpone/error_codes.py).

Run after editing the registry: ``.venv/bin/python scripts/errors_md.py``. With
``--check`` it writes nothing and exits 1 when the file is not the registry's
(tests/unit/test_error_codes.py makes the same comparison).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dpone.error_codes import errors_markdown  # noqa: E402

DOCUMENT = ROOT / "docs" / "errors.md"


def main(argv: list[str]) -> int:
    """Write (or with ``--check`` compare) the document; the exit status."""
    text = errors_markdown()
    if "--check" in argv:
        current = DOCUMENT.read_text(encoding="utf-8") if DOCUMENT.exists() else ""
        if current != text:
            print(f"{DOCUMENT} is not the registry's: run scripts/errors_md.py", file=sys.stderr)
            return 1
        return 0
    DOCUMENT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
