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
        return f"'$' may only start a variable ($NAME or ${{NAME}}); found {rest[at : at + 3]!r}"
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


# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$")


def slurm_seconds(text: object) -> int:
    """Seconds in a Slurm time value; ValueError when it is not one (a field under a larger one past its
    range, such as the minutes of 12:61:00, included: sbatch refuses those)."""
    value = str(text).strip()
    m = _TIME.match(value)
    if not m:
        raise ValueError(f"{value!r}: expected Slurm's format, e.g. 24:00:00 or 1-12:00:00 or 30")
    days, a, b, c = m.groups()
    if days is not None:  # D-H, D-H:M, D-H:M:S
        h, mi, s = int(a), int(b or 0), int(c or 0)
        if h > 23 or mi > 59 or s > 59:
            raise ValueError(f"{value!r}: past a day's 23:59:59 after the '-'; e.g. 1-12:00:00")
        return ((int(days) * 24 + h) * 60 + mi) * 60 + s
    if b is None:  # M
        return int(a) * 60
    if c is None:  # M:S
        if int(b) > 59:
            raise ValueError(f"{value!r}: {b} seconds; valid: 0 to 59 after the minutes")
        return int(a) * 60 + int(b)
    if int(b) > 59 or int(c) > 59:  # H:M:S
        raise ValueError(f"{value!r}: minutes and seconds run 0 to 59 in H:M:S, e.g. 12:59:00 or 13:01:00")
    return (int(a) * 60 + int(b)) * 60 + int(c)


def slurm_time(value: object) -> object:
    """A positive Slurm time limit as given, else ValueError (a profile's max_time, checked as render checks it)."""
    if not isinstance(value, str) or slurm_seconds(value) <= 0:
        raise ValueError(f"{value!r}: valid: a positive Slurm time, e.g. 2-00:00:00, 24:00:00 or 1440")
    return value


def sbatch_words(value: object) -> object:
    """A value (or each of a list's) that can stand in an #SBATCH line, else ValueError; None passes."""
    for word in value if isinstance(value, list) else [] if value is None else [value]:
        if not sbatch_safe(word):
            raise ValueError(f"{word!r}: not a valid Slurm value (letters, digits and _ . , : @ - [ ] only)")
    return value


def regex(value: object) -> object:
    """A regular expression that compiles, else ValueError; None passes."""
    try:
        re.compile(str(value)) if value is not None else None
    except re.error as exc:
        raise ValueError(f"{value!r}: not a regular expression ({exc})") from None
    return value
