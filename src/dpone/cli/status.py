"""``dpone status``: the project's targets, rollback copies, and what needs a person."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from dpone.cli.output import config_option, emit_json, json_option, reported_errors
from dpone.connectors.http_connections import POOL
from dpone.project.config import load_project
from dpone.project.status import project_status

# Not 1 (something needs a person) nor 2 (usage): a monitor tells "cannot know" apart.
SERVER_UNREACHABLE_EXIT = 3


@click.command()
@config_option
@json_option
def status(config_path: Path, as_json: bool) -> None:
    """Targets with their last publication, rollback copies kept, and what needs a person.

    Exit 0 when nothing needs a person, 1 otherwise; 3 when the server could not be
    reached or refused the sign-in (what needs a person there is then unknown).
    """
    with reported_errors(as_json):
        project = load_project(config_path)
        found = project_status(project)
        if as_json:
            # What this command sent: status is one process, so all of it is status's.
            traffic = POOL.traffic().to_dict()
            ok = found.server_running and not found.needs_person
            emit_json({"ok": ok, **found.to_dict(), "traffic": traffic})
        else:
            if not found.server_running:
                _echo_unreachable(project.clickhouse.access.describe(), found.server_unreachable)
            for target in found.targets:
                last = target["last_publication"]
                retired = target.get("retired")
                if retired is not None:
                    click.echo(
                        f"{target['table']} -> {target['target']}: {retired['state']} "
                        f"{retired['at']}, never published since"
                    )
                elif last is None:
                    click.echo(f"{target['table']} -> {target['target']}: never published")
                else:
                    how = "rolled back" if last.get("rollback") else "published"
                    click.echo(
                        f"{target['table']} -> {target['target']}: {last['rows']} rows, "
                        f"{how} {last['published_at']}, uuid {last['uuid']}"
                    )
                for copy in target["rollback_copies"] or []:
                    click.echo(
                        f"  rollback copy {copy['table']} (uuid {copy['uuid']}, "
                        f"replaced {copy['published_at']})"
                    )
            for slot in found.removed:
                _echo_removed(slot)
            if not found.server_running:
                click.echo("what the server holds is unknown: status is incomplete")
            elif not found.needs_person:
                click.echo("nothing needs a person")
            for item in found.needs_person:
                what = (
                    item.get("intent_sha256")
                    or item.get("lease_id")
                    or item.get("attempt_id")
                    or item.get("target")
                )
                click.echo(f"NEEDS A PERSON: {item['kind']} {what}")
                if item.get("message"):
                    click.echo(f"  {item['message']}")
                worker = item.get("worker")
                if worker:
                    click.echo(
                        f"  ran on {worker['host']} (pid {worker['pid']}), journal "
                        f"{worker['journal']}"
                    )
                if item.get("command"):
                    click.echo(f"  run: {item['command']}")
        if not found.server_running:
            raise SystemExit(SERVER_UNREACHABLE_EXIT)
        if found.needs_person:
            raise SystemExit(1)


def _echo_unreachable(where: str, why: dict[str, Any] | None) -> None:
    """The server did not answer: why, by its code and message, and what fixes it."""
    if why is None:  # not said: never guessed
        click.echo(f"{where} is not reachable (rollback copies unknown)")
        return
    if why["reason"] == "not running":
        click.echo(f"{where} is not running (rollback copies unknown)")
    else:
        click.echo(
            f"{where} is not reachable: {why['reason']} (rollback copies unknown)\n"
            f"  [{why['code']}] {why['message']}"
        )
    if why.get("fix"):
        click.echo(f"  fix: {why['fix']}")


def _echo_removed(slot: dict[str, Any]) -> None:
    """A slot no longer in the project file: retired, or what it still holds."""
    retired = slot.get("retired")
    if retired is not None and retired["state"] == "retired":
        click.echo(
            f"{slot['target']}: removed from the project file, retired {retired['at']} "
            f"({len(retired['dropped'])} tables dropped)"
        )
    else:
        how = "its retire is unfinished" if retired is not None else "not retired"
        click.echo(f"{slot['target']}: removed from the project file, {how}")
    held = slot.get("target_table")
    if held is not None and held.get("uuid"):
        click.echo(f"  target {held['table']} (uuid {held['uuid']}) still exists")
    for copy in slot.get("rollback_copies") or []:
        click.echo(f"  rollback copy {copy['table']} (uuid {copy['uuid']}) still exists")
    if slot.get("command"):
        click.echo(f"  to remove what it holds: {slot['command']}")
