"""The options `plan`, `render` and `submit` share, declared once: a command decorated with
`run_request_options` takes them all and receives them as one RunRequest, `request`.

An option added here reaches the three commands at once; tests/test_request_path.py holds
`submit` to every option `render` has.
"""

from __future__ import annotations

import functools
import inspect
import typing
from pathlib import Path
from typing import Any, Callable, List, Optional

import typer

from hpcrl.planning.request import RunRequest

# (RunRequest field, type as Typer reads it, the option). Help texts say what each means in all three.
_SHARED: tuple[tuple[str, Any, Any], ...] = (
    (
        "config",
        Optional[str],
        typer.Option(None, "--config", help="Run config file or shipped name (default grpo-olmo3-32b)"),
    ),
    (
        "sets",
        List[str],
        typer.Option([], "--set", help="Override a config field: key=value (hpcrl.key=value for the hpcrl section)"),
    ),
    (
        "pins",
        List[str],
        typer.Option([], "--pin", help="Fix a choice: learners=N, learner_nodes=N, tp=N, engines=N, util=F"),
    ),
    ("nodes", Optional[int], typer.Option(None, "--nodes", "-N", help="Nodes in the job (default: the config's)")),
    (
        "gpus",
        Optional[int],
        typer.Option(
            None,
            "--gpus",
            help="GPUs of one node for a job smaller than a node (1 up to the node's; default: the config's hpcrl.gpus, else whole nodes)",
        ),
    ),
    (
        "cluster",
        Optional[str],
        typer.Option(
            None, "--cluster", "-c", help="Cluster profile; name:variant picks a node type (default: the config's)"
        ),
    ),
    ("cluster_file", Optional[Path], typer.Option(None, "--cluster-file", help="Load this profile file instead")),
    (
        "quota_gib",
        Optional[float],
        typer.Option(
            None,
            "--quota-gib",
            help="The run root's quota in GiB, for the disk check (default: hpcrl.quota_gib, else the profile's)",
        ),
    ),
    (
        "allow_over_limit",
        bool,
        typer.Option(False, "--allow-over-limit", help="Warn instead of failing past partition/QOS limits"),
    ),
)
_SMOKE = ("smoke", bool, typer.Option(False, "--smoke", help="Replace training by a Ray smoke test of the same layout"))


def _field_value(name: str, value: Any) -> Any:
    if name in ("sets", "pins"):
        return tuple(value)
    if name == "cluster_file":
        return None if value is None else str(value)
    return value


def option_names(request: RunRequest, *, but: tuple[str, ...] = ()) -> list[str]:
    """The options given (not left at their defaults) that made request, as the user typed them."""
    given = request.given(but=but)
    return [opt.param_decls[0] for name, _, opt in (*_SHARED, _SMOKE) if name in given]


def run_request_options(*, smoke: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the shared run options (and --smoke when smoke): its `request` parameter
    receives them as one RunRequest; its own parameters stay as they are."""
    shared = (*_SHARED, _SMOKE) if smoke else _SHARED

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(command)
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(command).parameters.values()
            if p.name != "request"
        ]
        added = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=tp)
            for name, tp, opt in shared
        ]

        @functools.wraps(command)
        def with_request(**kwargs: Any) -> Any:
            fields = {name: _field_value(name, kwargs.pop(name)) for name, _, _ in shared}
            return command(request=RunRequest(**fields), **kwargs)

        # Typer reads a command's options from its signature and type hints: give it both, resolved.
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in (*added, *own)]
        with_request.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        with_request.__annotations__ = {p.name: p.annotation for p in params}
        return with_request

    return decorate


__all__ = ["RunRequest", "option_names", "run_request_options"]
