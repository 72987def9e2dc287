"""dpone installed the way a user installs it carries its compiled parts, and uses them.

One test, under a minute here: from a copy of the repository without any built library,
it builds the sdist, builds the wheel from the unpacked sdist with pip (in pip's isolated
build environment, with the pinned backend, as ``pip install .`` does), installs that
wheel in a fresh venv (not editable), and then, outside the source tree, asks the
installed ``dpone doctor``, converts a file through the installed package with the
Python reference made unusable, and runs the installed ``dpone export`` and ``dpone
stage`` against a server it did not start (a project's remote ``[clickhouse]``), whose
report and journal must say the compiled converter wrote the RowBinary. On the way, a compiler that fails half way must fail the
package build and leave no library behind, and a library the build did not write must
not be shipped. This is the suite's non-editable install (see ``.ci/run``).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest

from tests import chhttp
from tests.remote_server import remote_server

pytestmark = pytest.mark.package_build

ROOT = Path(__file__).resolve().parents[2]
# What a tree builds or caches, never a source of the package: a built library copied
# along would hide a build that does not happen.
NOT_SOURCES = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".dpone",
    "__pycache__",
    "*.pyc",
    "*.so",
    "*.so.tmp.*",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "dist",
    "*.egg-info",
)
LIBRARY = "dpone/preparation/native/_rowbinary.so"
# The embedded engine (chdb, with pandas and pyarrow: about 0.9 GB) serves only the
# managed server: it is the `embedded` extra, so a plain install has none of it.
EMBEDDED = {"chdb==4.4.0; extra == 'embedded'", "chdb-core==26.9.0; extra == 'embedded'"}
# Run by the installed interpreter from outside the tree: the compiled converter must
# convert the whole file, since the reference is replaced by a function that fails.
CONVERT = """
import json, sys
from pathlib import Path
import dpone
from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.preparation import file_validation, native_conversion, spool
from dpone.preparation.file_validation import validate_file

work = Path(sys.argv[1])
schema = SourceSchema.of(
    [SourceColumn("id", "int", False), SourceColumn("name", "nvarchar(20)", True)]
)
path = work / "in.tsv"
path.write_bytes(b"".join(b"%d\\tname %d\\n" % (i, i) for i in range(1000)))
receipt = validate_file(path, schema, mode=spool.MODE_PYTHON)
reference = spool.prepare_rowbinary(path, receipt, work / "reference").path.read_bytes()


def no_reference(*args, **kwargs):
    raise AssertionError("the Python reference was used")


spool.convert_records = file_validation.convert_records = no_reference
assert validate_file(path, schema) == receipt
native = spool.prepare_rowbinary(path, receipt, work / "native", mode=native_conversion.MODE_NATIVE)
print(json.dumps({
    "dpone": dpone.__file__,
    "library": str(native_conversion.library()[0]),
    "same_bytes": native.path.read_bytes() == reference,
    "rows": native.identity.prepared_rows,
}))
"""


def run(
    *argv: str | Path, cwd: Path, env: dict[str, str] | None = None, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in ``cwd`` with nothing of the source tree on its path; with ``ok``,
    it must succeed."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DPONE_NATIVE")}
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=clean | (env or {}),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if ok:
        assert done.returncode == 0, (
            f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done


def venv(path: Path) -> Path:
    """A fresh venv at ``path``; its bin folder."""
    run(sys.executable, "-m", "venv", path, cwd=path.parent)
    return path / "bin"


def out(*argv: str | Path, cwd: Path) -> str:
    """The standard output of ``argv``, which must succeed."""
    return run(*argv, cwd=cwd).stdout


def copy_and_build(tmp: Path) -> tuple[Path, Path, Path]:
    """A copy of the repository, its sdist, and the wheel pip builds from it unpacked;
    the build tools' bin folder."""
    repo = tmp / "repo"
    shutil.copytree(ROOT, repo, ignore=NOT_SOURCES)
    assert not list(repo.rglob("*.so"))
    dist = tmp / "dist"
    tools = venv(tmp / "tools")
    requires = tomllib.loads((repo / "pyproject.toml").read_text())["build-system"]["requires"]
    run(tools / "pip", "install", "--quiet", *requires, cwd=tmp)
    make_sdist = f"import hatchling.build as b; b.build_sdist({str(dist)!r})"
    run(tools / "python", "-c", make_sdist, cwd=repo)
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp / "unpacked", filter="data")
    (unpacked,) = (tmp / "unpacked").iterdir()
    run(tools / "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", dist, unpacked, cwd=tmp)
    (wheel,) = dist.glob("*.whl")
    return sdist, wheel, tools


def check_refused_builds(tools: Path, tmp: Path) -> None:
    """A compiler that fails half way fails the package build and leaves no library, whole
    or partial; a library the script did not write this time is never shipped."""
    repo = tmp / "repo"
    pip_wheel = (tools / "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", tmp / "refused", repo)
    # Writes part of its output, then fails, as a compiler killed mid-write would.
    half = tmp / "half-cc"
    half.write_text(
        '#!/bin/sh\nwhile [ "$1" != -o ]; do shift; done\necho partial > "$2"\nexit 1\n'
    )
    half.chmod(0o755)
    failed = run(*pip_wheel, cwd=tmp, env={"CC": str(half)}, ok=False)
    assert failed.returncode != 0
    assert "scripts/build_native.sh failed" in failed.stdout + failed.stderr
    assert sorted(p.name for p in (repo / "src").rglob("_*.so*")) == []
    stale = repo / "src/dpone/preparation/native/_stale.so"
    stale.write_bytes(b"from another build")
    refused = run(*pip_wheel, cwd=tmp, ok=False)
    assert refused.returncode != 0
    assert "src/dpone/preparation/native/_stale.so: not rebuilt" in refused.stdout + refused.stderr
    assert not (tmp / "refused").exists() or list((tmp / "refused").iterdir()) == []


def check_sdist(sdist: Path) -> None:
    """The sdist carries every C file, the build script and the hook, and no library."""
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    sources = {
        p.relative_to(ROOT).as_posix()
        for p in (*ROOT.glob("src/dpone/**/*.c"), *ROOT.glob("src/dpone/**/*.h"))
    }
    assert "src/dpone/preparation/native/rowbinary.c" in sources
    needed = sources | {"scripts/build_native.sh", "hatch_build.py", "pyproject.toml"}
    assert needed - names == set()
    assert [n for n in names if n.endswith(".so")] == []


def check_wheel(wheel: Path) -> list[str]:
    """The wheel carries the libraries and says what it runs on; its dependencies."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/WHEEL"))
        assert "Root-Is-Purelib: false" in archive.read(info).decode()
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = Parser().parsestr(archive.read(metadata).decode()).get_all("Requires-Dist")
    assert LIBRARY in names
    assert [n for n in names if n.endswith((".c", ".h"))] == []
    # Tied to this machine; to this Python too when it holds an extension module
    # (named with this interpreter's suffix), else to no Python version.
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    tied = any(n.endswith(suffix) for n in names)
    assert wheel.name.endswith(
        f"-{python}-{python}-{platform}.whl" if tied else f"-py3-none-{platform}.whl"
    )
    # The runtime dependencies: click alone; the engine only in the `embedded` extra.
    assert set(requires or []) >= EMBEDDED, requires
    runtime = [r for r in requires or [] if ";" not in r]
    assert runtime == ["click==8.5.1"], runtime
    return runtime


def test_a_built_wheel_installed_in_a_fresh_venv_uses_the_compiled_converter(
    tmp_path: Path,
) -> None:
    sdist, wheel, tools = copy_and_build(tmp_path)
    check_sdist(sdist)
    check_wheel(wheel)
    check_refused_builds(tools, tmp_path)
    user = venv(tmp_path / "user")
    run(user / "pip", "install", "--quiet", wheel, cwd=tmp_path)  # as a user does
    found = "import importlib.util as u; print(u.find_spec('chdb'), u.find_spec('pandas'))"
    assert out(user / "python", "-c", found, cwd=tmp_path).split() == ["None", "None"]
    platlib = "import sysconfig; print(sysconfig.get_path('platlib'))"
    site = Path(out(user / "python", "-c", platlib, cwd=tmp_path).strip())
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    report = json.loads(out(user / "dpone", "doctor", "--json", cwd=outside))
    assert report["ok"] is True
    assert report["package"] == str(site / "dpone")
    assert report["compiled"][0] == {
        "name": "converter",
        "library": str(site / LIBRARY),
        "present": True,
        "loaded": True,
        "reason": None,
        "registered": True,
    }
    # Every other compiled part too (the renderer, say): in the venv, and loaded.
    for part in report["compiled"]:
        assert part["loaded"] and part["registered"], part
        assert Path(part["library"]).is_relative_to(site / "dpone"), part
    text = out(user / "dpone", "doctor", cwd=outside)
    assert f"converter: loaded from {site / LIBRARY}" in text.splitlines()
    off = run(user / "dpone", "doctor", "--json", cwd=outside, env={"DPONE_NATIVE": "0"}, ok=False)
    switched_off = json.loads(off.stdout)
    assert (off.returncode, switched_off["ok"]) == (1, False)
    assert {p["reason"] for p in switched_off["compiled"]} == {"is switched off (DPONE_NATIVE=0)"}

    converted = json.loads(out(user / "python", "-c", CONVERT, outside, cwd=outside))
    assert converted == {
        "dpone": str(site / "dpone" / "__init__.py"),
        "library": str(site / LIBRARY),
        "same_bytes": True,
        "rows": 1000,
    }
    check_stage_on_a_remote_server(user, outside, tmp_path / "remote")


def check_stage_on_a_remote_server(user: Path, outside: Path, root: Path) -> None:
    """The installed ``dpone export`` and ``dpone stage`` of a small table, on a server
    named by a project's ``[clickhouse]`` host, ports and credentials file."""
    with sqlite3.connect(outside / "shop.db") as db:
        db.execute("CREATE TABLE items (id INTEGER NOT NULL PRIMARY KEY, name TEXT, price REAL)")
        db.executemany(
            "INSERT INTO items VALUES (?, ?, ?)",
            [(i, f"item\t{i}\n", i * 1.25) for i in range(1, 501)],
        )
    for server in remote_server(root, ["pkg_db"]):
        (outside / "dpone.toml").write_text(server["clickhouse_toml"])
        export = (
            *("export", "--source", f"sqlite:{outside / 'shop.db'}", "--table", "items"),
            *("--out", outside / "items.tsv", "--receipt-out", outside / "items.receipt.json"),
        )
        run(user / "dpone", *export, cwd=outside)
        stage = (
            *("stage", outside / "items.tsv", "--receipt", outside / "items.receipt.json"),
            *("--database", "pkg_db", "--work-dir", outside / "attempts"),
            *("--config", outside / "dpone.toml", "--store", outside / "store.sqlite"),
            *("--attempt-id", "pkg-1", "--json"),
        )
        staged = json.loads(out(user / "dpone", *stage, cwd=outside))
        assert (staged["ok"], staged["rows"], staged["converter"]) == (True, 500, "native")
        shown = out(user / "dpone", "journal", "show", staged["journal"], cwd=outside)
        events = [json.loads(line) for line in shown.splitlines()]
        assert [e["converter"] for e in events if e["state"] == "prepared"] == ["native"]
        port, table = server["http_port"], f"pkg_db.{staged['table']}"
        found = chhttp.rows(port, f"SELECT count() AS n, max(id) AS top FROM {table}")
        assert found == [{"n": 500, "top": 500}]
        name = chhttp.rows(port, f"SELECT name FROM {table} WHERE id = 7")
        assert name == [{"name": "item\t7\n"}]
        check_refresh_without_the_engine(user, outside, server)


def check_refresh_without_the_engine(user: Path, outside: Path, server: dict[str, Any]) -> None:
    """Without the `embedded` extra: check and refresh on the remote server work, and
    a managed server start is refused naming the extra (issue 35, item 7). The project's
    store is the one the stage used: the server records it as the pool's owner."""
    (outside / "dpone.toml").write_text(
        '[project]\nwork_dir = "work"\nstore = "store.sqlite"\n'
        + server["clickhouse_toml"]
        + '[sources.shop]\nkind = "sqlite"\npath = "shop.db"\n'
        '[tables.items]\nsource = "shop"\ntable = "items"\ntarget = "pkg_db.items"\n'
        'order_by = "id"\n'
    )
    checked = json.loads(out(user / "dpone", "check", "--json", cwd=outside))
    assert checked["ok"] is True, checked
    refreshed = json.loads(out(user / "dpone", "refresh", "items", "--json", cwd=outside))
    assert refreshed["tables"][0]["outcome"] == "published", refreshed
    found = chhttp.rows(server["http_port"], "SELECT count() AS n, sum(id) AS s FROM pkg_db.items")
    assert found == [{"n": 500, "s": 125_250}]
    start = ("server", "start", "--data-dir", outside / "ch", "--json")
    refused = run(user / "dpone", *start, cwd=outside, ok=False)
    error = json.loads(refused.stdout)["error"]
    assert (refused.returncode, error["code"]) == (1, "chdb_not_installed"), refused.stdout
    assert "pip install 'dpone[embedded]'" in error["message"], error
    assert not (outside / "ch").exists()  # refused before anything was written
