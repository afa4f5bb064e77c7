"""Reading a YAML mapping from a file, with one-line errors naming the file and line."""

from __future__ import annotations

from pathlib import Path

import yaml

from hpcrl.errors import HpcrlError

# libyaml's parser where PyYAML has it: the same safe loader, several times faster.
_BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: object, line: int) -> None:
        super().__init__(f"{key}")
        self.key, self.line = key, line


class _UniqueKeyLoader(_BASE):  # type: ignore[misc, valid-type]
    """The safe loader, refusing a key given twice in one mapping (YAML itself keeps the last, silently)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_mapping(path: Path, error: type[HpcrlError], what: str) -> dict:
    """The mapping in `path`, or `error` naming the file (and line) and what was expected."""
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except _DuplicateKey as exc:
        raise error(f"{path}: line {exc.line}: key {exc.key!r} given twice (YAML would keep the last); "
                    "give it once") from None
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
