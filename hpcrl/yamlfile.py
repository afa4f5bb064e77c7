"""Reading a YAML mapping from a file, with one-line errors naming the file and line."""

from __future__ import annotations

import stat
from pathlib import Path

import yaml

from hpcrl.errors import HpcrlError

# The largest YAML file read (a run config or a profile is a few KiB).
YAML_MAX = 4 * 2**20

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


def read_text(path: Path, error: type[HpcrlError], what: str = "a YAML file") -> str:
    """The UTF-8 text of a regular file of at most YAML_MAX bytes, or `error` naming the file and why not
    (a directory, a FIFO or device that would be read forever, unreadable, binary or UTF-16 text)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as exc:
        raise error(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{path}: is a directory, expected {what}")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path}: not a regular file (a device, FIFO or socket), expected {what}")
    if st.st_size > YAML_MAX:
        raise error(f"{path}: {st.st_size:,} bytes, expected {what} (at most {YAML_MAX:,} bytes)")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read it: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        utf16 = raw[:2] in (b"\xff\xfe", b"\xfe\xff")
        raise error(
            f"{path}: byte {exc.start}: not UTF-8 text"
            + (" (UTF-16: save it as UTF-8)" if utf16 else "")
            + f", expected {what}"
        ) from None


def read_mapping(path: Path, error: type[HpcrlError], what: str) -> dict:
    """The mapping in `path`, or `error` naming the file (and line) and what was expected."""
    text = read_text(path, error)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as exc:
        raise error(
            f"{path}: line {exc.line}: key {exc.key!r} given twice (YAML would keep the last); give it once"
        ) from None
    except RecursionError:
        raise error(f"{path}: nested too deeply to be a YAML file of {what}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark else ""
        raise error(f"{path}: {line}not valid YAML") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise error(f"{path}: (top level): expected a mapping of {what}")
    return data
