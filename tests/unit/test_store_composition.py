"""The snapshot store is composed, not assembled from mixins (issue 34).

Every class of ``dpone.publication.store`` stands on its own: none inherits from
another class of dpone except an error, a Protocol, a NamedTuple, a dataclass, or the
facade itself (the two thin stores that choose its connections). The facade
delegates every public method of every part, with the part's signature, so a method
added to a part cannot be forgotten on the store.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import dpone.publication.store as store_package
from dpone.errors import DponeError
from dpone.publication.store import SnapshotStore
from dpone.publication.store.admission import RunAdmission
from dpone.publication.store.leases import PrincipalLeases
from dpone.publication.store.records import SnapshotRecords
from dpone.publication.store.retirement import SlotRetirement
from dpone.publication.store.steps import StepNotes

PARTS = (SnapshotRecords, StepNotes, RunAdmission, PrincipalLeases, SlotRetirement)


def _modules() -> list[ModuleType]:
    names = [info.name for info in pkgutil.iter_modules(store_package.__path__)]
    return [importlib.import_module(f"{store_package.__name__}.{name}") for name in names]


def _classes() -> list[type]:
    return sorted(
        {
            value
            for module in _modules()
            for value in vars(module).values()
            if inspect.isclass(value) and value.__module__ == module.__name__
        },
        key=lambda cls: cls.__qualname__,
    )


def _allowed_base(base: type) -> bool:
    """An error, a Protocol, a NamedTuple, a dataclass, or the facade itself."""
    if issubclass(base, DponeError) or base is SnapshotStore:
        return True
    if getattr(base, "_is_protocol", False):
        return True
    return issubclass(base, tuple) or dataclasses.is_dataclass(base)


def test_the_store_modules_are_found() -> None:
    names = {cls.__name__ for cls in _classes()}
    assert {part.__name__ for part in PARTS} | {"SnapshotStore", "SqliteConnections"} <= names


@pytest.mark.parametrize("cls", _classes(), ids=lambda cls: cls.__qualname__)
def test_no_store_class_inherits_another_of_dpone(cls: type) -> None:
    inherited = [
        base
        for base in cls.__mro__[1:]
        if base.__module__.startswith("dpone") and not _allowed_base(base)
    ]
    assert inherited == [], f"{cls.__qualname__} inherits {inherited}: compose it instead"


@pytest.mark.parametrize("part", PARTS, ids=lambda part: part.__name__)
def test_the_facade_delegates_every_public_method_of_a_part(part: type) -> None:
    public = [name for name in vars(part) if not name.startswith("_")]
    assert public
    for name in public:
        facade = getattr(SnapshotStore, name, None)
        assert facade is not None, f"SnapshotStore has no {name} ({part.__name__}'s)"
        assert inspect.signature(facade) == inspect.signature(getattr(part, name)), name
