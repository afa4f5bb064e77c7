"""An option given twice: click keeps the last value without a word (`--registry A --registry B` used B);
hpcrl refuses it, as it refuses a repeated `--pin` or `--set` key."""

from __future__ import annotations

from typing import Any

from hpcrl.errors import HpcrlError


def _options(command: Any) -> dict[str, Any]:
    """Every spelling of every option of a click command -> (the parameter, whether this spelling turns it off)."""
    names: dict[str, Any] = {}
    for param in getattr(command, "params", ()):
        for name in getattr(param, "opts", ()):
            names[name] = (param, False)
        for name in getattr(param, "secondary_opts", ()):
            names[name] = (param, True)
    return names


def refuse_repeated_options(command: Any, argv: list[str]) -> None:
    """HpcrlError naming the first option that takes one value and is given twice (or a flag given both on and
    off); options meant to repeat (--set, --pin, --add) and arguments are left to click."""
    current, names = command, _options(command)
    seen: dict[str, tuple[str, str]] = {}  # parameter name -> (spelling, value as typed)
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word == "--":
            return
        subcommands = getattr(current, "commands", None)
        if subcommands is not None and not word.startswith("-"):
            if word not in subcommands:
                return  # click names the unknown command
            current, names, seen = subcommands[word], _options(subcommands[word]), {}
            continue
        spelling, eq, attached = word.partition("=") if word.startswith("--") else (word, "", "")
        if spelling not in names and word.startswith("-") and not word.startswith("--") and len(word) > 2:
            spelling, eq, attached = word[:2], "=", word[2:]  # -N4
        if spelling not in names:
            continue
        param, off = names[spelling]
        takes_value = not getattr(param, "is_flag", False) and not getattr(param, "count", False)
        if takes_value and not eq:
            attached = argv[i] if i < len(argv) else ""
            i += 1
        if getattr(param, "multiple", False) or getattr(param, "count", False):
            continue
        value = attached if takes_value else ("off" if off else "on")
        if param.name in seen and (takes_value or seen[param.name][1] != value):
            first, before = seen[param.name]
            shown = spelling if first == spelling else f"{first} / {spelling}"
            raise HpcrlError(f"{shown} given twice ({before}, {value}); give it once")
        seen[param.name] = (spelling, value)
