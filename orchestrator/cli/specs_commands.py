"""`orchestrate specs`: the sweep specs shipped with the package (orchestrator/search_spaces/, which
the checkout's search_spaces/ links to), listed with the first line of each one's header, and
copied into a folder to run or edit."""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

import click

from nli_models.errors import InputError


def shipped_specs() -> dict[str, Traversable]:
    """Every shipped spec by name (the file name without .yaml), sorted."""
    folder = files("orchestrator") / "search_spaces"
    found = {entry.name.removesuffix(".yaml"): entry for entry in folder.iterdir()
             if entry.name.endswith(".yaml")}
    return dict(sorted(found.items()))


def summary(spec: Traversable) -> str:
    """The first line of the spec's header comment."""
    for line in spec.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
        if line.strip():
            break
    return ""


@click.group(invoke_without_command=True)
@click.pass_context
def specs(ctx: click.Context) -> None:
    """List the sweep specs shipped with nli-orchestrator; `specs copy` copies them."""
    if ctx.invoked_subcommand is None:
        available = shipped_specs()
        width = max(map(len, available))
        for name, spec in available.items():
            click.echo(f"{name:<{width}}  {summary(spec)}")
        click.echo("copy one to run or edit it: orchestrate specs copy NAME [--to DIR]")


@specs.command("copy")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@click.option("--to", "folder", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="folder to copy into (made when missing)")
@click.option("--force", is_flag=True, help="overwrite a file of the same name")
def copy_specs(names: tuple[str, ...], folder: Path, force: bool) -> None:
    """Copy shipped specs by NAME (as `orchestrate specs` lists them) into a folder."""
    available = shipped_specs()
    unknown = [name for name in names if name.removesuffix(".yaml") not in available]
    if unknown:
        raise InputError(f"orchestrate specs copy: no shipped spec {', '.join(map(repr, unknown))}; "
                         f"shipped: {', '.join(available)}")
    targets = {folder / f"{name.removesuffix('.yaml')}.yaml": available[name.removesuffix(".yaml")]
               for name in names}
    existing = [str(target) for target in targets if target.exists()]
    if existing and not force:
        raise InputError(f"orchestrate specs copy: {', '.join(existing)} exists; "
                         "pass --force to overwrite")
    if folder.exists() and not folder.is_dir():
        raise InputError(f"orchestrate specs copy: --to {folder} is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    for target, spec in targets.items():
        target.write_text(spec.read_text(encoding="utf-8"), encoding="utf-8")
        click.echo(f"wrote {target}")
