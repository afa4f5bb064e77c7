"""`hpcrl init`'s starter config: the shipped example of a backend, commented, set to a cluster (pure)."""

from __future__ import annotations

import re

from hpcrl.errors import HpcrlError, UnknownNameError
from hpcrl.resources import data_dir

_CLUSTER = re.compile(r"^(  cluster:).*$", re.M)


def starter_config(backend: str, cluster: str) -> str:
    """The text of the first shipped config (by name) that runs `backend`, with hpcrl.cluster `cluster`.
    Both names are checked, and the result loads as a run config."""
    from hpcrl.planning.backends import backend_names
    from hpcrl.planning.config import load_run_config
    from hpcrl.profiles import resolve_profile

    if backend not in backend_names():
        raise UnknownNameError("backend", backend, backend_names())
    resolve_profile(cluster)  # an unknown cluster is one line naming the known ones
    for path in sorted(data_dir("configs").glob("*.yaml")):
        if load_run_config(str(path)).hpcrl.backend != backend:
            continue
        text = path.read_text()
        head = (
            f"# Starter config written by `hpcrl init --backend {backend} --cluster {cluster}` from the\n"
            f"# shipped example {path.name}: edit the model, data and keys below, then\n"
            f"#   hpcrl plan --config THIS_FILE   and   hpcrl render --config THIS_FILE\n"
        )
        if _CLUSTER.search(text):
            return head + _CLUSTER.sub(lambda m: f"{m.group(1)} {cluster}", text, count=1)
        return head + text.replace("\nhpcrl:\n", f"\nhpcrl:\n  cluster: {cluster}\n", 1)
    raise HpcrlError(f"backend {backend}: no shipped example config to start from")


__all__ = ["starter_config"]
