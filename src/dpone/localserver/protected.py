"""The databases a managed server protects, recorded in its data directory.

The server reads the pool's grants at start only, so each start that declares the pool
records its databases in ``<data_dir>/protected.json`` (canonical JSON, 0600, replaced
atomically), a later start without ``--protect`` starts the server as it was, and every
hint to (re)start the server prints :func:`start_command`, the exact command.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence

from dpone.contracts import canonical_json
from dpone.errors import ConfigurationError, DponeError
from dpone.localserver.errors import ProtectedRecordCorrupt
from dpone.localserver.layout import DataDirLayout, write_private_file
from dpone.localserver.principal_pool import check_databases, check_pool_name

# What a start protects when neither --protect nor a record names anything: the demo's.
DEFAULT_PROTECTED_DATABASE = "dpone_demo"
RECORD_VERSION = 1

DataDir = str | os.PathLike[str] | None


def record_protected(
    data_dir: DataDir, databases: Sequence[str], pools: Mapping[str, Sequence[str]] | None = None
) -> None:
    """Record ``databases`` as what the server on ``data_dir`` protects for its default
    pool, and the named ``pools`` with the databases each protects (replacing the record)."""
    named = check_pools(databases, pools or {})
    document: dict[str, object] = {
        "databases": list(check_databases(databases)),
        "version": RECORD_VERSION,
    }
    if named:
        document["pools"] = {name: list(dbs) for name, dbs in named.items()}
    layout = DataDirLayout.at(data_dir)
    write_private_file(layout.protected_file, canonical_json.dumps(document).decode("utf-8"))


def check_pools(
    databases: Sequence[str], pools: Mapping[str, Sequence[str]]
) -> dict[str, tuple[str, ...]]:
    """The named pools, each over its own databases: a database protected by two pools
    (the default one's ``databases`` included) would let one pool's principals write the
    other's targets, so it is refused (``database_in_two_pools``)."""
    seen = {d: "the default pool" for d in databases}
    named: dict[str, tuple[str, ...]] = {}
    for name, dbs in pools.items():
        check_pool_name(name)
        if not name:
            raise ConfigurationError("a named pool needs a name", code="invalid_pool")
        named[name] = check_databases(dbs)
        for database in named[name]:
            if database in seen:
                raise ConfigurationError(
                    f"database {database} is protected by {seen[database]} and by pool "
                    f"{name!r}: each database belongs to one pool, whose principals alone "
                    "may write it",
                    code="database_in_two_pools",
                    database=database,
                )
            seen[database] = f"pool {name!r}"
    return named


def parse_pools(given: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``--pool NAME:DB[,DB...]`` options as pools and their databases (a name given
    twice gathers both lists); ``invalid_pool`` names an option that is not that."""
    pools: dict[str, list[str]] = {}
    for option in given:
        name, colon, listed = option.partition(":")
        databases = [d for d in listed.split(",") if d]
        if not colon or not name or not databases:
            raise ConfigurationError(
                f"--pool {option!r} must be NAME:DB[,DB...] (the pool and the databases it "
                "protects)",
                code="invalid_pool",
                option=option,
            )
        pools.setdefault(check_pool_name(name), []).extend(databases)
    return {name: check_databases(dbs) for name, dbs in pools.items()}


def recorded_protected(data_dir: DataDir) -> tuple[str, ...] | None:
    """The recorded protected databases of the default pool, None when nothing was recorded.

    A damaged record is ``protected_record_corrupt`` (naming the file): it is never
    guessed around, because a start from it would drop a database's pool.
    """
    found = _recorded(data_dir)
    return None if found is None else found[0]


def recorded_pools(data_dir: DataDir) -> dict[str, tuple[str, ...]]:
    """The named pools the recorded start declared, with their databases (none without
    a record)."""
    found = _recorded(data_dir)
    return {} if found is None else found[1]


def _recorded(data_dir: DataDir) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]] | None:
    path = DataDirLayout.at(data_dir).protected_file
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None  # no record (the start reports a data directory it cannot make)
    except OSError as exc:
        raise ProtectedRecordCorrupt(
            f"cannot read the protected databases' record {path}: {exc.strerror}", path=str(path)
        ) from exc
    try:
        document = canonical_json.loads(data, what=f"protected databases' record {path}")
        if not isinstance(document, dict) or document.get("version") != RECORD_VERSION:
            raise ValueError(f"not a version-{RECORD_VERSION} record")
        databases = document.get("databases")
        if not isinstance(databases, list) or not all(isinstance(d, str) for d in databases):
            raise ValueError("its databases are not a list of names")
        pools = document.get("pools", {})
        if not isinstance(pools, dict) or not all(
            isinstance(dbs, list) and all(isinstance(d, str) for d in dbs) for dbs in pools.values()
        ):
            raise ValueError("its pools are not names with lists of databases")
        return check_databases(databases), check_pools(databases, pools)
    except (DponeError, ValueError) as exc:
        raise ProtectedRecordCorrupt(
            f"the protected databases' record {path} is damaged ({exc}); start the server "
            "with every database it protects named by --protect, which rewrites it",
            path=str(path),
        ) from exc


def databases_to_start(
    data_dir: DataDir, given: Sequence[str]
) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """What a start protects and the record it replaces (None when none was recorded).

    ``given`` (the start's ``--protect``) wins and replaces the record; without it the
    recorded set is started again, and without a record the default database.
    """
    recorded = recorded_protected(data_dir)
    if given:
        return check_databases(given), recorded
    return recorded or (DEFAULT_PROTECTED_DATABASE,), recorded


def start_command(
    data_dir: DataDir, *, also: Sequence[str] = (), pools: Mapping[str, Sequence[str]] | None = None
) -> str:
    """The exact ``dpone server start`` that starts the server on ``data_dir`` as it was.

    Every recorded database (the default one without a record) gets its ``--protect``,
    then each of ``also`` that is not among them (a database a hint needs protected);
    every recorded named pool its ``--pool NAME:DB,...``, with the databases ``pools``
    adds to it (or a new pool of ``pools``). Never raises: a hint must not fail on a
    damaged record, which the start reports.
    """
    layout = DataDirLayout.at(data_dir)
    try:
        found = _recorded(layout.root)
    except ProtectedRecordCorrupt:
        found = None
    recorded, named = found if found is not None else (None, {})
    databases = dict.fromkeys((*(recorded or (DEFAULT_PROTECTED_DATABASE,)), *also))
    argv = ["dpone", "server", "start", "--data-dir", str(layout.root)]
    for database in databases:
        argv += ["--protect", database]
    merged = {name: list(dbs) for name, dbs in named.items()}
    for name, dbs in (pools or {}).items():
        merged[name] = list(dict.fromkeys((*merged.get(name, ()), *dbs)))
    for name, dbs in merged.items():
        argv += ["--pool", f"{name}:{','.join(dbs) or 'DB'}"]
    return shlex.join(argv)


def restart_commands(
    data_dir: DataDir, *, also: Sequence[str] = (), pools: Mapping[str, Sequence[str]] | None = None
) -> str:
    """``dpone server stop ...; dpone server start ...``: the restart as it was (plus
    ``also`` and ``pools``)."""
    stop = shlex.join(
        ["dpone", "server", "stop", "--data-dir", str(DataDirLayout.at(data_dir).root)]
    )
    return f"{stop}; {start_command(data_dir, also=also, pools=pools)}"
