"""What `hpcrl versions` lists: every framework version hpcrl has read, per backend (release, commit, date,
what it was read from, the stack its install pins), and the vLLM releases whose memory accounting it has
read. Pure: data/versions.json, the install facts (stack_expect) and hpcrl/memory/data/vllm_accounting.json."""

from __future__ import annotations

from typing import Any

from hpcrl.errors import HpcrlError
from hpcrl.memory import vllm_accounting as va
from hpcrl.planning.backends import backend_names, stack_expect, versions


def _pins(v: versions.Version) -> list[str]:
    facts = stack_expect.facts_of(v) or {}
    python = (facts.get("python") or {}).get("spec")
    out = [f"python{python}"] if python else []
    return out + [f"{p['name']}{p['spec']}" for p in facts.get("packages", [])[1:] if p.get("spec")]


def release_list(backend: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """{frameworks: [...], vllm: [...]}, oldest first per backend; one backend's (no vLLM list) when named."""
    names = [b for b in backend_names() if versions.known(b)]
    if backend is not None and backend not in names:
        raise HpcrlError(f"versions {backend}: hpcrl keeps no versions of it; valid: {', '.join(names)}")
    rows: list[dict[str, Any]] = []
    pinned_by: dict[str, Any] = {}
    for name in names:
        default = versions.default(name)
        for v in versions.known(name):
            pins = _pins(v)
            for p in pins:
                if p.startswith("vllm=="):
                    pinned_by.setdefault(p.removeprefix("vllm=="), []).append(f"{name} {v.label()}")
            if backend not in (None, name):
                continue
            rows.append(
                {
                    "backend": name,
                    "version": v.name,
                    "release": v.release,
                    "commit": v.commit[:8] or None,
                    "date": v.date,
                    "default": v == default,
                    "source": v.source or f"commit {v.commit[:8]}",
                    "pins": pins,
                    "note": v.note,
                }
            )
    vllm = (
        []
        if backend
        else [{"version": r, "source": va.read_from(r), "pinned_by": pinned_by.get(r, [])} for r in va.known_versions()]
    )
    return {"frameworks": rows, "vllm": vllm}


__all__ = ["release_list"]
