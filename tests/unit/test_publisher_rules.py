"""The publisher is composed, not inherited, and each pre-publish rule is written once.

- No class of ``publication/publisher/`` inherits from another class of dpone (only
  errors, Protocols, NamedTuples and dataclasses may have a base): the paths receive
  the ports and the paths they call.
- Each rule of :mod:`dpone.publication.publisher.rules` is named in its docstring, and
  a rule both paths apply refuses prepare with the same code it gives the dispatch as
  its NOT_SENT reason.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Callable

import pytest

import dpone.publication.publisher as publisher_package
from dpone.contracts.composition_snapshot import DEFAULT_LIMITS, SnapshotRecord, SnapshotState
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import Blocker
from dpone.publication.publisher import ClickHouseAtomicSnapshotPublisher, rules
from tests.fakes.snapshot_ports import GENERATION, World

CLOCK = "2024-05-01T12:00:00.000000Z"


def publisher_modules() -> list[str]:
    prefix = publisher_package.__name__ + "."
    return [publisher_package.__name__] + [
        info.name for info in pkgutil.iter_modules(publisher_package.__path__, prefix)
    ]


def allowed_base(base: type) -> bool:
    """A base of dpone that composition allows: an error, a Protocol, a NamedTuple."""
    return (
        issubclass(base, BaseException)
        or bool(getattr(base, "_is_protocol", False))
        or (issubclass(base, tuple) and hasattr(base, "_fields"))
    )


def test_no_publisher_class_inherits_from_another_class_of_dpone() -> None:
    inherited = []
    for name in publisher_modules():
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != name:
                continue
            for base in cls.__mro__[1:]:
                if base.__module__.startswith("dpone") and not allowed_base(base):
                    inherited.append(f"{cls.__qualname__}({base.__qualname__})")
    assert inherited == []
    # Composed: the publisher holds one object per path, each over the same ports.
    world = World.build()
    built = ClickHouseAtomicSnapshotPublisher(
        authority=world.authority,
        store=world.store,
        catalog=world.catalog,
        executor=world.executor,
    )
    held = [
        built.prepare_path.ports,
        built.publish_path.ports,
        built.reconcile_path.ports,
        built.cancel_path.ports,
        built.abandon_path.ports,
    ]
    assert all(ports is built.ports for ports in held)
    assert built.publish_path.reconciler is built.reconcile_path
    assert (built.store, built.catalog, built.limits) == (
        world.store,
        world.catalog,
        DEFAULT_LIMITS,
    )


def test_the_rules_docstring_names_every_rule() -> None:
    doc = rules.__doc__ or ""
    judged = [
        name
        for name, function in vars(rules).items()
        if inspect.isfunction(function)
        and function.__module__ == rules.__name__
        and not name.startswith("_")
        and inspect.signature(function).return_annotation == "Refusal | None"
    ]
    assert {"side_effects", "design", "content", "ceilings"} <= set(judged)
    assert [name for name in judged if f":func:`{name}`" not in doc] == []


def publisher(world: World) -> ClickHouseAtomicSnapshotPublisher:
    limits = dataclasses.replace(DEFAULT_LIMITS, generation_storage_bytes=1500)
    return ClickHouseAtomicSnapshotPublisher(
        authority=world.authority,
        store=world.store,
        catalog=world.catalog,
        executor=world.executor,
        limits=limits,
        clock=lambda: CLOCK,
    )


def _blocker(world: World) -> None:
    world.catalog.tables[GENERATION].blockers = (Blocker("mutation", "ALTER in flight"),)


def _design(world: World) -> None:
    world.catalog.tables[GENERATION].design_sha256 = "0" * 64


def _rows(world: World) -> None:
    world.catalog.tables[GENERATION].rows += 1


def _digest(world: World) -> None:
    world.catalog.tables[GENERATION].content_digest = "9" * 32


def _storage(world: World) -> None:
    world.catalog.tables[GENERATION].total_bytes = 2000  # over generation_storage_bytes


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (_blocker, "side_effect_present"),
        (_design, "design_mismatch"),
        (_rows, "content_mismatch"),
        (_digest, "content_mismatch"),
        (_storage, "limit_exceeded"),
    ],
    ids=["side_effects", "design", "rows", "digest", "ceilings"],
)
def test_one_rule_refuses_prepare_and_dispatch_with_one_code(
    change: Callable[[World], None], code: str
) -> None:
    before = World.build()
    change(before)
    with pytest.raises(DponeError) as refused:
        publisher(before).prepare(before.attempt, before.generation_ref)
    assert refused.value.code == code
    assert before.store.entries == {}

    after = World.build()
    sha = publisher(after).prepare(after.attempt, after.generation_ref).intent_sha256
    change(after)
    receipt = publisher(after).publish(sha)
    assert after.executor.exchanges == []
    assert (receipt.state, receipt.revision) == (SnapshotState.NOT_PUBLISHED, 3)
    record = SnapshotRecord.from_bytes(after.store.load(sha).record_bytes)
    assert record.dispatch is not None and record.dispatch.outcome == "not_sent"
    assert record.reason == f"not_sent_{code}"
    noted = [h.facts for h in after.store.history(sha) if h.facts.get("step") == "dispatch_refused"]
    assert [n["reason"] for n in noted] == [code]
