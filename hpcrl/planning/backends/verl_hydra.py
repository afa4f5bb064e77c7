"""verl's command line: values in Hydra's override grammar and the type checks of verl's config keys (pure)."""

from __future__ import annotations

import math
import re
from typing import Any

from hpcrl.errors import ConfigError
from hpcrl.planning.backends.base import is_number

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./@+-]*$")
_HYDRA_WORDS = {"true", "false", "null", "nan", "inf", "none"}


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar (quoted where a bare word would parse otherwise)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return (
            repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
        )
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{hydra_key(k)}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if (_PLAIN.match(text) and text.lower() not in _HYDRA_WORDS and not is_number(text)) or is_interpolation(text):
        return text
    # Quoted: a backslash run that precedes a quote (or the closing quote) is doubled.
    body = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    body = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body)
    return f"'{body}'"


def hydra_key(key: Any) -> str:
    text = str(key)
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", text):
        raise ConfigError(f"{text!r}: a dict key in a verl override must be a plain name")
    return text


def is_interpolation(text: str) -> bool:
    return text.startswith("${") and text.endswith("}") and "\n" not in text


def expected_kind(meta: dict[str, Any]) -> str:
    """bool | int | float | str | list | dict | any, from the annotation or the default's type."""
    ann = str(meta.get("annotation") or "").replace(" ", "")
    for kind in ("bool", "int", "float", "str"):
        if ann in (kind, f"Optional[{kind}]", f"{kind}|None"):
            return kind
    if ann.startswith(("list", "List", "Optional[list", "Optional[List")):
        return "list"
    if ann.startswith(("dict", "Dict", "Optional[dict", "Optional[Dict")):
        return "dict"
    return str(meta["type"]) if meta.get("type") in ("bool", "int", "float", "str", "list", "dict") else "any"


def type_ok(kind: str, value: Any) -> bool:
    if value is None or (isinstance(value, str) and is_interpolation(value)):
        return True
    return {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "str": isinstance(value, str),
        "list": isinstance(value, (list, tuple)),
        "dict": isinstance(value, dict),
    }.get(kind, True)
