"""`hpcrl clusters list | show | validate`: what the cluster profiles say, and whether a file is valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.output import console, print_json, warn
from hpcrl.errors import HpcrlError

clusters_app = typer.Typer(
    help="Cluster profiles: list them, show one with its sources, validate a file.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(clusters_app, name="clusters")

JSON_OPT = typer.Option(False, "--json", help="Print JSON (stable schema) instead of a table.")

# Leaves of a profile that describe the profile rather than a cluster fact.
_NOT_FACTS = ("name", "description", "extends", "variants", "default_variant", "variant", "unconfirmed", "sources")


def _list_row(name: str, profile, path: Path) -> dict[str, Any]:
    part = profile.default_partition
    return {
        "name": name,
        "gpu": profile.gpu.model,
        "gpus_per_node": profile.gpu.count_per_node,
        "gpu_memory_gib": profile.gpu.memory_gib,
        "nodes_max": profile.max_nodes,
        "max_time": part.max_time if part else None,
        "file": str(path),
    }


def _list_rows() -> list[dict[str, Any]]:
    """One row per profile (its default variant) and one per other variant, as `name:variant`."""
    from hpcrl.profiles import load_profile, profile_files

    rows = []
    for name, path in sorted(profile_files().items()):
        try:
            profile = load_profile(name)
            rows.append(_list_row(name, profile, path))
            for variant in profile.variants:
                if variant != profile.variant:
                    full = f"{name}:{variant}"
                    rows.append(_list_row(full, load_profile(full), path))
        except HpcrlError as exc:
            # One broken user profile must not hide the others.
            warn(f"skipped: {exc}")
    return rows


def _short(path: str) -> str:
    """A path as the user would type it: relative to the current directory, or from ~."""
    p = Path(path)
    for base, shown in ((Path.cwd(), ""), (Path.home(), "~/")):
        if p.is_relative_to(base):
            return shown + str(p.relative_to(base))
    return path


@clusters_app.command("list")
def list_(as_json: bool = JSON_OPT) -> None:
    """List the known cluster profiles (shipped, user config dir, ./clusters)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    rows = _list_rows()
    if as_json:
        print_json(rows)
        return
    table = Table(
        title="Cluster profiles",
        caption="GPUs per node, GiB per GPU, most nodes per job, wall-time limit",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col in ("name", "GPU", "GPUs", "GiB", "nodes", "time"):
        table.add_column(col, no_wrap=True)
    table.add_column("file", overflow="fold", ratio=1)
    for r in rows:
        cells = [r["name"], r["gpu"], r["gpus_per_node"], r["gpu_memory_gib"], r["nodes_max"], r["max_time"]]
        table.add_row(*(Text("-" if c is None else str(c)) for c in cells), Text(_short(r["file"])))
    console.print(table)


def _show_text(value: Any) -> str:
    if value is None or value == [] or value == {}:
        return "-"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def _print_profile(profile, where: str) -> None:
    from rich.table import Table
    from rich.text import Text

    from hpcrl.profiles import flat_items

    title = profile.name + (f":{profile.variant}" if profile.variant else "")
    console.print(Text(f"{title} - {profile.description}".strip(" -")))
    console.print(Text(f"file: {where}" + (f" (extends {profile.extends})" if profile.extends else "")))
    if profile.variants:
        console.print(Text(f"variants: {', '.join(f'{profile.name}:{v}' for v in profile.variants)}"))
    table = Table(show_lines=False)
    table.add_column("fact", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("source", overflow="fold")
    data = {k: v for k, v in profile.model_dump(mode="json").items() if k not in _NOT_FACTS}
    for path, value in flat_items(data):
        shown = Text(_show_text(value))
        if profile.is_unconfirmed(path):
            shown.append("  (unconfirmed)", style="bold yellow")
        table.add_row(Text(path), shown, Text(profile.source_of(path) or "-", style="dim"))
    console.print(table)


@clusters_app.command("show")
def show(
    name: Optional[str] = typer.Argument(None, help="Profile name, e.g. isambard-ai or berzelius:fat."),
    cluster_file: Optional[Path] = typer.Option(None, "--cluster-file", help="Show this profile file instead."),
    as_json: bool = JSON_OPT,
) -> None:
    """Show one profile: every fact with its source; unconfirmed facts are marked."""
    from hpcrl.profiles import profile_files, resolve_profile

    if name and cluster_file:
        raise HpcrlError(f"give a cluster name ({name!r}) or --cluster-file ({cluster_file}), not both")
    profile = resolve_profile(name, cluster_file)
    if as_json:
        print_json(profile.model_dump(mode="json"))
        return
    where = cluster_file or profile_files().get(profile.name) or "?"
    _print_profile(profile, str(where))


@clusters_app.command("validate")
def validate(
    file: Path = typer.Argument(..., help="Profile YAML file to check."),
    as_json: bool = JSON_OPT,
) -> None:
    """Validate a profile file and every variant it defines; exit 2 naming the first problem."""
    from rich.text import Text

    from hpcrl.profiles import load_profile_file

    profile = load_profile_file(file)
    for variant in profile.variants:
        load_profile_file(file, variant)
    if as_json:
        print_json({"file": str(file), "ok": True, "name": profile.name})
        return
    variants = f" (variants: {', '.join(profile.variants)})" if profile.variants else ""
    console.print(Text(f"{file}: ok - profile {profile.name}{variants}"))


@clusters_app.command("exclude")
def exclude(
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster profile (default: list every list)."),
    add: list[str] = typer.Option([], "--add", help="Add this node (repeatable)."),
    remove: list[str] = typer.Option([], "--remove", help="Remove this node (repeatable)."),
    clear: bool = typer.Option(False, "--clear", help="Remove every node from the cluster's list."),
    list_: bool = typer.Option(False, "--list", help="List the nodes (what it does without --add/--remove/--clear)."),
    reason: str = typer.Option("added by hand", "--reason", help="Comment kept with the nodes of --add."),
    as_json: bool = JSON_OPT,
) -> None:
    """Nodes render/submit exclude per cluster (hpcrl preflight --write-exclude adds the failing ones)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from hpcrl.jobs import node_excludes
    from hpcrl.profiles import resolve_profile

    name = resolve_profile(cluster).name if cluster else None
    lists = node_excludes.edit(name, add, remove, clear, reason)
    if as_json:
        print_json(
            [
                {
                    "cluster": ex.cluster,
                    "file": str(ex.path),
                    "nodes": [{"node": n, "reason": ex.reasons[n]} for n in ex.nodes],
                }
                for ex in lists
            ]
        )
        return
    if not lists:
        console.print(Text(f"no exclude lists ({_short(str(node_excludes.data_dir() / 'exclude'))})"))
    for ex in lists:
        if not ex.nodes:
            console.print(Text(f"{ex.cluster}: no excluded nodes ({_short(str(ex.path))})"))
            continue
        console.print(Text(f"{ex.cluster}: {len(ex.nodes)} excluded node(s), from {_short(str(ex.path))}"))
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("node", no_wrap=True)
        table.add_column("reason", overflow="fold")
        for n in ex.nodes:
            table.add_row(Text(n), Text(ex.reasons[n] or "-"))
        console.print(table)
