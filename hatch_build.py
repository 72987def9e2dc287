"""Hatch build hook: dpone's compiled parts built with the package and carried by its wheel.

``scripts/build_native.sh`` stays the one place that knows how each library is built; this
hook only runs it (in the tree being built: the checkout, or the unpacked sdist), with
``PYTHON`` set to the interpreter that builds the wheel (an extension module is built for
it), and puts every library it wrote, each ``_*.so`` under ``src/dpone/**/native/``, into
the wheel at the same place, so ``pip install .`` and a built wheel carry them. The wheel
is then tagged for what it holds: ``py3-none-linux_x86_64`` (say) when every library is
loaded with ctypes (``_rowbinary.so``: tied to the machine, not to a Python), and
``cp311-cp311-linux_x86_64`` when one is a CPython extension module
(``_render.cpython-311-x86_64-linux-gnu.so``).

An editable install runs the script too (the editable package loads the libraries from
the tree) and adds nothing to its wheel.
"""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.config import BuilderConfig
from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SCRIPT = "scripts/build_native.sh"
# Where the libraries land, relative to the root, and the package folder they sit in.
SOURCES = "src"
LIBRARIES = "dpone/**/native/_*.so"


class NativeBuildFailed(RuntimeError):
    """The compiled parts could not be built or would not be the ones the script built."""

    code = "native_build_failed"


def _for_another_python(path: Path) -> bool:
    """Whether ``path`` is an extension module built for another interpreter
    (``_render.cpython-312-x86_64-linux-gnu.so`` in a tree built for several): never this
    wheel's, nor a stale library of it."""
    tagged = tuple(s for s in importlib.machinery.EXTENSION_SUFFIXES if s != ".so")
    return path.suffixes != [".so"] and not path.name.endswith(tagged)


def _libraries(root: Path) -> dict[Path, tuple[int, int]]:
    """This interpreter's libraries in the tree, with what tells a rewritten file from the
    same one."""
    found = {}
    for path in sorted((root / SOURCES).glob(LIBRARIES)):
        if not _for_another_python(path):
            stat = path.stat()
            found[path] = (stat.st_ino, stat.st_mtime_ns)
    return found


def wheel_tag(built: list[Path]) -> str:
    """The wheel's tag for the libraries ``built`` on this machine."""
    from packaging.tags import sys_tags

    # Not manylinux or musllinux: the libraries link the build machine's libcrypto, which
    # is no promise about other distributions (hatchling skips them for the same reason).
    tag = next(t for t in sys_tags() if not t.platform.startswith(("manylinux", "musllinux")))
    # A name with more than ".so" (".cpython-311-x86_64-linux-gnu.so", ".abi3.so") is an
    # extension module, which holds the wheel to this interpreter and its ABI.
    if any(path.suffixes != [".so"] for path in built):
        return f"{tag.interpreter}-{tag.abi}-{tag.platform}"
    return f"py3-none-{tag.platform}"


def build_libraries(root: Path) -> list[Path]:
    """Run the build script in ``root``; the libraries it wrote.

    Every library there must be one the script just wrote (it writes each to a new file
    and renames it over the old one, so a rewritten library is a new inode): one it left
    alone is from another build, and is refused rather than shipped as if it were this
    one's. A failed build leaves no partial library (the script's rename) and fails here.
    """
    before = _libraries(root)
    try:
        env = os.environ | {"PYTHON": sys.executable}
        subprocess.run(["bash", str(root / SCRIPT)], cwd=root, env=env, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise NativeBuildFailed(
            f"{SCRIPT} failed ({exc}): building dpone's compiled parts needs a C compiler "
            f"and the headers named at the top of {SCRIPT}"
        ) from exc
    after = _libraries(root)
    stale = [path for path, seen in after.items() if before.get(path) == seen]
    if stale:
        names = ", ".join(str(path.relative_to(root)) for path in stale)
        raise NativeBuildFailed(
            f"{names}: not rebuilt by {SCRIPT}; remove it, or build it there, so the wheel "
            "carries only libraries built from these sources"
        )
    if not after:
        raise NativeBuildFailed(f"{SCRIPT} built no library matching {SOURCES}/{LIBRARIES}")
    return list(after)


class NativeBuildHook(BuildHookInterface[BuilderConfig]):
    """Builds the compiled parts and puts them in the wheel (see the module docstring)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Called by hatchling before the wheel is assembled."""
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        built = build_libraries(root)
        if version == "editable":
            return
        for path in built:
            build_data["force_include"][str(path)] = path.relative_to(root / SOURCES).as_posix()
        build_data["pure_python"] = False
        build_data["tag"] = wheel_tag(built)
