"""Reading a YAML mapping from a file, with one-line errors naming the file and line."""

from __future__ import annotations

from pathlib import Path

import yaml

from hpcrl.errors import HpcrlError


def read_mapping(path: Path, error: type[HpcrlError], what: str) -> dict:
    """The mapping in `path`, or `error` naming the file (and line) and what was expected."""
    try:
        # libyaml's parser where PyYAML has it: the same safe loader, several times faster.
        data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, expected a YAML file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark else ""
        raise error(f"{path}: {line}not valid YAML") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise error(f"{path}: (top level): expected a mapping of {what}")
    return data
