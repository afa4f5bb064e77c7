"""Shell quoting for rendered scripts: every user value passes through one of these.

Three kinds of value reach a script:

- literals (model names, env values, dataset names): `shq` makes them one shell word
  that bash reads back byte for byte;
- paths that may name environment variables expanded on the compute node (`$PROJECTDIR/runs`,
  `${HOME}/open-instruct`, `~/x`): `shq_path` expands `$NAME`/`${NAME}` and a leading `~`
  and nothing else (no command substitution, globbing or word splitting);
- text inside `#` comments and `#SBATCH` lines: `comment_safe` and `sbatch_value` keep a
  newline in a value from ending the comment and starting a command.
"""

from __future__ import annotations

import re
import shlex

_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
# What sbatch accepts unquoted in an #SBATCH line for names, times and node lists.
_SBATCH_SAFE = re.compile(r"^[A-Za-z0-9_.,:@%+=/\[\]-]+$")


def shq(value: object) -> str:
    """One shell word that evaluates to str(value) exactly."""
    return shlex.quote(str(value))


def shq_path(value: object) -> str:
    """A shell word for a path: `$VAR`, `${VAR}` and a leading `~` expand, nothing else does."""
    text = str(value)
    parts: list[str] = []
    if text == "~" or text.startswith("~/"):
        parts.append('"${HOME}"')
        text = text[1:]
    pos = 0
    for match in _VAR.finditer(text):
        if match.start() > pos:
            parts.append(shlex.quote(text[pos : match.start()]))
        parts.append('"${%s}"' % (match.group(1) or match.group(2)))
        pos = match.end()
    if pos < len(text) or not parts:
        parts.append(shlex.quote(text[pos:]))
    return "".join(parts)


def path_problem(value: object) -> str | None:
    """Why a path cannot be written as shq_path writes it, or None: a `$` must start `$NAME` or
    `${NAME}` (a `$(...)` would be a literal directory here but a command to a reader)."""
    text = str(value)
    if "\0" in text or "\n" in text:
        return "it has a newline or NUL character"
    rest = _VAR.sub("", text)
    if "$" in rest:
        at = rest.index("$")
        return f"'$' may only start a variable ($NAME or ${{NAME}}); found {rest[at:at + 3]!r}"
    return None


def has_vars(value: object) -> bool:
    """Whether shq_path would expand something in value at run time."""
    text = str(value)
    return bool(_VAR.search(text)) or text == "~" or text.startswith("~/")


def comment_safe(value: object) -> str:
    """Text for a `#` comment: control characters (newlines) become `?`."""
    return "".join(ch if ch.isprintable() else "?" for ch in str(value))


def sbatch_safe(value: object) -> bool:
    """Whether value can stand unquoted in an #SBATCH line (Slurm names, times, node lists)."""
    return bool(_SBATCH_SAFE.match(str(value)))


def sanitize_name(value: object, limit: int = 64) -> str:
    """A Slurm job name from free text: unsafe characters become `_`."""
    text = re.sub(r"[^A-Za-z0-9_.-]", "_", str(value))
    return text[:limit] or "_"
