"""The open-instruct driver command: grpo_fast.py's flags from a run config and a layout.

Pure. Every flag is checked against the argument table of the config's layout
(`current` or `legacy`), so a rendered script never passes a flag grpo_fast.py lacks.
Flag syntax is HfArgumentParser's: `--name value`, booleans `--name True|False`,
lists `--name v1 v2 ...`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from hpcrl.backends.oi_args import _kind, arg_table, default
from hpcrl.config import RUN_DIR_FIELDS, RunConfig
from hpcrl.errors import ConfigError, PlanError
from hpcrl.layout import Layout

# Run-directory fields: name -> sub-directory of RUN_DIR (docs/run-dir.md).
RUN_DIR_SUBDIRS = {"output_dir": "output", "checkpoint_state_dir": "checkpoints"}
assert set(RUN_DIR_SUBDIRS) == set(RUN_DIR_FIELDS)


@dataclass(frozen=True)
class DriverArg:
    """One flag: literal values (quoted when rendered), or a sub-directory of $RUN_DIR."""

    name: str
    values: tuple[str, ...] = ()
    run_dir_subdir: str | None = None


def _number(value: float) -> str:
    if not math.isfinite(value):
        raise ConfigError(f"{value!r} is not a finite number")
    return repr(float(value))


def _scalar(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    text = str(value)
    if text.startswith("-") and not _is_number(text):
        raise ConfigError(
            f"{name}: value {text!r} starts with '-', which grpo_fast.py's parser would read as a flag"
        )
    return text


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def format_values(name: str, value: Any, type_text: str) -> tuple[str, ...] | None:
    """The command-line words of one field's value; None to leave the flag out."""
    kind = _kind(type_text)
    if kind == "list":
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        return tuple(_scalar(name, v) for v in items) if items else None
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return (_number(value),)
    return (_scalar(name, value),)


def layout_args(layout: Layout, nodes: int, table: dict[str, dict]) -> dict[str, Any]:
    """The planner's fields as open-instruct arguments (num_nodes where the layout has it)."""
    fields = dict(layout.open_instruct_fields())
    if "num_nodes" in table:
        fields["num_nodes"] = nodes
    for name in fields:
        if name not in table:
            raise ConfigError(f"layout field {name} is not an argument of this open-instruct layout")
    return fields


def driver_args(cfg: RunConfig, layout: Layout, nodes: int) -> list[DriverArg]:
    """grpo_fast.py's flags, in config order, then the planner's fields, then the run directory."""
    arg_layout = cfg.hpcrl.arg_layout
    table = arg_table(arg_layout)
    planned = layout_args(layout, nodes, table)
    pinned_nodes = cfg.args.get("num_nodes")
    if pinned_nodes is not None and "num_nodes" in table and int(pinned_nodes) != nodes:
        raise PlanError(f"num_nodes {pinned_nodes} is pinned in the config but the job has {nodes} nodes; "
                        f"remove it or pass --nodes {pinned_nodes}")
    merged: dict[str, Any] = {}
    for key, value in cfg.args.items():
        merged[key] = planned.pop(key, value)
    merged.update(planned)
    out: list[DriverArg] = []
    for key, value in merged.items():
        if key not in table:
            raise ConfigError(
                f"{key} is not a grpo_fast.py argument in open-instruct's {arg_layout} layout "
                f"(hpcrl.arg_layout); see hpcrl/backends/data/open_instruct_args_{arg_layout}.json"
            )
        if key in RUN_DIR_SUBDIRS:
            continue
        if value is None:
            if default(key, arg_layout) is not None:
                raise ConfigError(f"{key}: null cannot be passed on grpo_fast.py's command line; remove it")
            continue
        words = format_values(key, value, table[key]["type"])
        if words is None:
            if default(key, arg_layout) not in (None, []):
                raise ConfigError(f"{key}: an empty list cannot be passed on grpo_fast.py's command line")
            continue
        out.append(DriverArg(key, words))
    for key, sub in RUN_DIR_SUBDIRS.items():
        if key not in table:
            raise ConfigError(f"{key} is not an argument of open-instruct's {arg_layout} layout")
        out.append(DriverArg(key, run_dir_subdir=sub))
    return out
