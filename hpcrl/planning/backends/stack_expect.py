"""What a run's training environment must hold: the expectation the job's stack check reads.

Pure. From a backend, the framework version the run targets (versions.py) and the install facts of
every version hpcrl has read of it (data/stack.json by commit, or a release's own stack.json, each
with path:line at the version's commit or in its wheel), `expectation` builds the JSON that
`python3 -m hpcrl.runtime.stack --expect ...` checks in the job before Ray starts, and that
`hpcrl preflight --config` and `hpcrl check-stack` check before. The check picks the table of the
release it finds installed (hpcrl/runtime/stack.py pick_table), so every table travels. hpcrl's
own needs (Ray's token authentication) come in as arguments, with their reason.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrl.planning.backends.oi_args import FRAMEWORK, layout_version
from hpcrl.planning.backends.versions import Version, known, resolve

if TYPE_CHECKING:
    from hpcrl.planning.run_types import RunConfig

_DATA = Path(__file__).with_name("data")


@lru_cache(maxsize=1)
def _facts() -> dict[str, Any]:
    facts: dict[str, Any] = json.loads((_DATA / "stack.json").read_text())
    return facts


def has_facts(backend: str) -> bool:
    """Whether hpcrl knows what `backend`'s install asks for (not for custom scripts)."""
    return backend in _facts() and not backend.startswith("_")


def facts_of(v: Version) -> dict[str, Any] | None:
    """The install facts of one version: its own stack file, else stack.json under its commit."""
    if v.stack_file:
        own: dict[str, Any] = json.loads((_DATA / v.stack_file).read_text())
        return own
    facts: dict[str, Any] | None = _facts().get(v.backend, {}).get(v.key)
    return facts


def _cited(item: dict[str, Any], at: str) -> dict[str, Any]:
    return dict(item, source=f"{item['source']} {at}")


def table(v: Version, arch: str | None) -> dict[str, Any] | None:
    """One version's facts as the check reads them: the release the framework declares, python, packages
    (each source with where it was read), the CUDA its torch is built for on `arch`, and its parser."""
    facts = facts_of(v)
    if facts is None:
        return None
    at = v.at()
    packages = []
    for p in facts["packages"]:
        p = {k: val for k, val in _cited(p, at).items() if k not in ("needs_reading", "extra")}
        if "when" in p:
            p["when"] = _cited(p["when"], at)
        packages.append(p)
    packages[0]["spec"] = ""  # the framework's own release picks the table (runtime/stack.py pick_table)
    cuda = facts.get("torch_cuda")
    if cuda and cuda.get("arch") not in (None, arch):
        cuda = None  # the version's install gets that CUDA build only on the named architecture
    python = facts.get("python")
    parser = {k: val for k, val in (facts.get("parser") or {}).items() if k != "needs_reading"}
    return {
        "name": v.name,
        "label": v.label(),
        "version": facts.get("declares"),
        "python": _cited(python, at) if python else None,
        "packages": packages,
        "torch_cuda": {k: val for k, val in _cited(cuda, at).items() if k != "needs_reading"} if cuda else None,
        "parser": parser or None,
    }


def expectation(
    backend: str,
    version: str | None = None,
    *,
    arch: str | None = None,
    ray_min: str | None = None,
    ray_min_why: str = "",
) -> dict[str, Any] | None:
    """The stack check's expectation for a run of `backend` at `version` (None: the default) on a
    node of `arch` (the profile's node.arch); None for a backend without install facts.

    ray_min: the lowest Ray the job script itself accepts (hpcrl's token authentication), checked
    beside the framework's own pins."""
    if not has_facts(backend):
        return None
    v = resolve(backend, version)
    target = table(v, arch)
    if target is None:
        return None
    own = []
    if ray_min:
        own.append(
            {
                "name": "ray",
                "dists": ["ray"],
                "module": "ray",
                "spec": f">={ray_min}",
                "by": "hpcrl",
                "source": ray_min_why or "hpcrl",
            }
        )
    tables = [t for o in known(backend) if (t := table(o, arch)) is not None]
    return {
        "schema": 2,
        "backend": backend,
        "version": v.label(),
        "commit": v.commit,
        "framework": target["packages"][0]["name"],
        "python": target["python"],
        "packages": target["packages"],
        "torch_cuda": target["torch_cuda"],
        "parser": target["parser"],
        "hpcrl_packages": own,
        "tables": tables,
    }


def run_version(cfg: RunConfig) -> str | None:
    """The framework version a run config targets: hpcrl.framework_version where the config has it,
    open-instruct's legacy layout's commit, else None (the newest known)."""
    named = cfg.hpcrl.framework_version
    if cfg.hpcrl.backend == FRAMEWORK:
        return layout_version(cfg.hpcrl.arg_layout, named)
    return named or None


def run_expectation(cfg: RunConfig, arch: str, ray_min: tuple[int, ...] | None) -> dict[str, Any] | None:
    """The expectation for a run config on a node of `arch`; ray_min: the lowest Ray the job script
    accepts (hpcrl/contract.py's RAY_TOKEN_MIN) where the backend brings up Ray, else None."""
    need = ".".join(map(str, ray_min)) if ray_min else None
    return expectation(
        cfg.hpcrl.backend,
        run_version(cfg),
        arch=arch,
        ray_min=need,
        ray_min_why=f"hpcrl: Ray below {need} ignores RAY_AUTH_MODE=token",
    )


def driver_argv(words: list[tuple[Any, ...]], run_dir: str) -> list[str]:
    """The driver command's words (Backend.driver_command) as the job passes them, with `$RUN_DIR`
    put in as the shell would."""
    return [w.text.replace("$RUN_DIR", run_dir) if w.run_dir else w.text for line in words for w in line]


__all__ = ["driver_argv", "expectation", "facts_of", "has_facts", "run_expectation", "run_version", "table"]
