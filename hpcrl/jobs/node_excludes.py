"""The per-cluster list of nodes to keep out of jobs, in the user's hpcrl data dir.

`hpcrl preflight --write-exclude` adds the nodes that failed; `hpcrl clusters exclude`
lists, adds, removes or clears them; `render` and `submit` add them to `#SBATCH --exclude`
(after the profile's and the config's own) and say in the script header which file they
came from. One file per cluster (the profile name without its variant: a variant is a node
type of the same machine), `<data dir>/exclude/<cluster>.txt`, one node per line, text after
`#` a comment (why, and when). The data dir is $HPCRL_DATA_DIR, else platformdirs'
`user_data_dir("hpcrl")` (where the registry lives too).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from hpcrl.errors import HpcrlError
from hpcrl.shell import sbatch_safe


class ExcludeList(NamedTuple):
    cluster: str
    path: Path
    nodes: tuple[str, ...]
    reasons: dict[str, str]  # node -> the comment on its line ("" when none)


def data_dir() -> Path:
    """hpcrl's user data dir: $HPCRL_DATA_DIR, else platformdirs' user_data_dir("hpcrl")."""
    env = os.environ.get("HPCRL_DATA_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("hpcrl"))


def cluster_key(cluster: str) -> str:
    """The list's name for a profile name: `berzelius:fat` shares berzelius' nodes."""
    name = cluster.split(":", 1)[0]
    if not name or "/" in name or name.startswith("."):
        raise HpcrlError(f"cluster {cluster!r}: not a profile name")
    return name


def list_path(cluster: str) -> Path:
    return data_dir() / "exclude" / f"{cluster_key(cluster)}.txt"


def check_node(node: str) -> str:
    """A node name as Slurm's --exclude takes it, or a one-line error."""
    node = node.strip()
    if not node or "," in node or not sbatch_safe(node):
        raise HpcrlError(f"node {node!r}: not a Slurm node name (letters, digits and _ . - [ ] only, one per entry)")
    return node


def load(cluster: str) -> ExcludeList:
    """The cluster's list (empty when there is no file)."""
    path = list_path(cluster)
    try:
        text = path.read_text()
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        raise HpcrlError(f"{path}: cannot read the exclude list ({exc.strerror})") from None
    reasons: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        entry, _, comment = line.partition("#")
        if not entry.strip():
            continue
        try:
            node = check_node(entry)
        except HpcrlError as exc:
            raise HpcrlError(f"{path}:{n}: {exc}; fix or remove the line (hpcrl clusters exclude --clear)") from None
        reasons.setdefault(node, comment.strip())
    return ExcludeList(cluster_key(cluster), path, tuple(reasons), reasons)


def _write(path: Path, reasons: dict[str, str]) -> None:
    """Write the list through a temporary file and a rename: never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        "# Nodes hpcrl render/submit exclude on this cluster; one per line, '#' starts a comment.\n"
        "# Managed by hpcrl preflight --write-exclude and hpcrl clusters exclude.\n"
    )
    body = "".join(f"{node}  # {why}\n" if why else f"{node}\n" for node, why in reasons.items())
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(header + body)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def add(cluster: str, nodes: dict[str, str]) -> tuple[ExcludeList, list[str]]:
    """Add nodes (node -> why) to the list; returns the new list and the nodes that were new."""
    checked = {check_node(n): why for n, why in nodes.items()}
    cur = load(cluster)
    reasons = dict(cur.reasons)
    new = [n for n in checked if n not in reasons]
    for n in new:
        reasons[n] = checked[n]
    if new:
        _write(cur.path, reasons)
    return load(cluster), new


def remove(cluster: str, nodes: list[str] | None = None) -> tuple[ExcludeList, list[str]]:
    """Remove these nodes (all when None); returns the new list and the nodes removed."""
    cur = load(cluster)
    gone = list(cur.nodes) if nodes is None else [check_node(n) for n in nodes]
    unknown = [n for n in gone if n not in cur.reasons]
    if unknown:
        listed = ", ".join(cur.nodes) or "none"
        raise HpcrlError(f"node {unknown[0]!r} is not on {cur.cluster}'s exclude list ({cur.path}); listed: {listed}")
    if gone:
        _write(cur.path, {n: why for n, why in cur.reasons.items() if n not in gone})
    return load(cluster), gone


def edit(
    cluster: str | None, add_nodes: list[str], remove_nodes: list[str], clear: bool, reason: str
) -> list[ExcludeList]:
    """`hpcrl clusters exclude`: apply the edits, then every list they touch (all lists when none)."""
    if (add_nodes or remove_nodes or clear) and not cluster:
        raise HpcrlError("--add, --remove and --clear change one cluster's list: pass --cluster C")
    if clear and (add_nodes or remove_nodes):
        raise HpcrlError("--clear empties the list: give it alone, not with --add or --remove")
    if clear and cluster:
        remove(cluster)
    if remove_nodes and cluster:
        remove(cluster, remove_nodes)
    if add_nodes and cluster:
        add(cluster, {n: reason for n in add_nodes})
    if cluster:
        return [load(cluster)]
    found = sorted((data_dir() / "exclude").glob("*.txt"))
    return [load(p.stem) for p in found]


def apply(rp):
    """The run plan with the cluster's exclude list added (render and submit call this)."""
    ex = load(rp.profile.name)
    if not ex.nodes:
        return rp
    return replace(rp, user_exclude=ex.nodes, user_exclude_file=str(ex.path))


__all__ = [
    "ExcludeList",
    "add",
    "apply",
    "check_node",
    "cluster_key",
    "data_dir",
    "edit",
    "list_path",
    "load",
    "remove",
]
