"""open-instruct's argument list (names, types, defaults) at a known commit, as data."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from hpcrl.errors import ConfigError, UnknownNameError
from hpcrl.planning.backends import versions

ArgLayout = Literal["current", "legacy"]
_DATA = Path(__file__).with_name("data")
FRAMEWORK = "open-instruct"  # its name in versions.json


@lru_cache(maxsize=2)
def arg_table(layout: ArgLayout = "current") -> dict[str, dict[str, Any]]:
    """Field name -> {default, type, dataclass, cli_flag} for grpo_fast.py in `layout`."""
    if layout not in ("current", "legacy"):
        raise UnknownNameError("open-instruct argument layout", str(layout), ["current", "legacy"])
    data = json.loads((_DATA / f"open_instruct_args_{layout}.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def arg_meta(layout: ArgLayout = "current") -> dict[str, Any]:
    data = json.loads((_DATA / f"open_instruct_args_{layout}.json").read_text())
    meta: dict[str, Any] = data["_meta"]
    return meta


def _kind(type_text: str) -> str:
    t = type_text.replace(" ", "")
    if t.startswith(("list[", "List[", "tuple[", "Optional[List")) or "|list[" in t:
        return "list"
    if t in ("bool", "bool|None"):
        return "bool"
    if t in ("int", "int|None", "Optional[int]"):
        return "int"
    if t in ("float", "float|None", "Optional[float]"):
        return "float"
    return "any"


def version_layout(name: str) -> ArgLayout:
    """The argument layout of a known open-instruct version (its table's file says which)."""
    return "legacy" if versions.resolve(FRAMEWORK, name).args_file.endswith("_legacy.json") else "current"


def layout_version(layout: ArgLayout, named: str | None = None) -> str | None:
    """The version a run of `layout` targets: the one named, the legacy layout's own, else None (the newest)."""
    if named:
        return named
    return (
        next((v.commit for v in versions.known(FRAMEWORK) if version_layout(v.commit) == layout), None)
        if layout == "legacy"
        else None
    )


def check_args(args: dict[str, Any], layout: ArgLayout = "current", version: str | None = None) -> None:
    """Every key must be a grpo_fast.py field of `layout`, with a value of its type; a key only another
    known version has is refused naming those versions (KeyNotInVersionError)."""
    table = arg_table(layout)
    for key, value in args.items():
        if key not in table:
            other = "current" if layout == "legacy" else "legacy"  # the layout names the version
            versions.check_key(FRAMEWORK, layout_version(layout, version), key, f"set hpcrl.arg_layout={other}")
            where = f"grpo_fast.py at open-instruct {str(arg_meta(layout).get('commit', '?'))[:12]}"
            raise UnknownNameError(
                "open-instruct argument", key, table, detail=where if layout == "current" else f"legacy {where}"
            )
        kind = _kind(table[key]["type"])
        if value is None:
            continue
        ok = {
            "bool": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "list": isinstance(value, (list, tuple)),
        }.get(kind, True)
        if kind == "list" and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            ok = True  # a single value is a one-element list on the command line
        if ok and table[key]["type"].replace(" ", "") == "list[int]":
            items = value if isinstance(value, (list, tuple)) else [value]
            ok = all(isinstance(v, int) and not isinstance(v, bool) for v in items)
        if not ok:
            raise ConfigError(f"{key}: expected {table[key]['type']}, got {value!r}")
        if key in MIXER_LISTS:
            check_mixer_list(key, value)


# Lists of [dataset, amount, dataset, amount, ...]: open-instruct asserts an even length and reads each amount
# as an int (a count of samples: "1" is one) or, with a '.', a float (a fraction: "1.0" is all of it)
# (dataset_transformation.py:2337-2343 at e6c3044; :1827 at 1611e3df).
MIXER_LISTS = ("dataset_mixer_list", "dataset_mixer_eval_list")


def check_mixer_list(key: str, value: Any) -> None:
    """ConfigError for a mixer list the framework's own assertion would stop in the job."""
    items = [str(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    if len(items) % 2:
        raise ConfigError(
            f"{key} {value!r}: {len(items)} items; valid: pairs of a dataset and its amount, "
            f"e.g. [{items[0]!r}, '1.0'] ('1.0': all of it, '1000': 1000 samples)"
        )
    for name, amount in zip(items[::2], items[1::2]):
        try:
            number = float(amount) if "." in amount else int(amount)
        except ValueError:
            raise ConfigError(
                f"{key}: {name!r} has the amount {amount!r}; valid: a number of samples ('1000') or "
                "a fraction with a '.' ('1.0': all of it)"
            ) from None
        if not number > 0:
            raise ConfigError(f"{key}: {name!r} has the amount {amount!r}; valid: more than 0")


def default(name: str, layout: ArgLayout = "current") -> Any:
    """open-instruct's default for `name` as a Python value where it is a literal."""
    raw = arg_table(layout)[name]["default"]
    try:
        return json.loads(raw.replace("True", "true").replace("False", "false").replace("None", "null"))
    except (json.JSONDecodeError, AttributeError):
        return raw
