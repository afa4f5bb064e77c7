"""No module outside hpcrl/planning/backends/ names a backend: every framework fact is reached
through the Backend object (issue 22). A string literal (docstrings aside) or a comparison that
names one, and a template condition on one, fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "hpcrl"
BACKENDS_DIR = PKG / "planning" / "backends"
# The names as a user or a config writes them (the registry's own list would hide a backend
# whose module went missing), and the spelling of their modules.
NAMES = ("open-instruct", "verl", "openrlhf", "custom", "trl")
SPELLINGS = tuple(sorted({n for name in NAMES for n in (name, name.replace("-", "_"))}))
# Names that are also ordinary words count only as a whole literal ("a custom run" is English).
WORDS = {"custom"}


def _names_in(text: str) -> list[str]:
    found = []
    for name in SPELLINGS:
        whole = text.strip() == name
        word = name not in WORDS and re.search(rf"(?<![\w-]){re.escape(name)}(?![\w])", text)
        if whole or word:
            found.append(name)
    return found


def _rel(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def python_findings(path: Path) -> list[str]:
    """`file:line: what` for each literal or comparison in `path` that names a backend."""
    tree = ast.parse(path.read_text())
    skip, out = _docstrings(tree), []
    rel = _rel(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            consts = [c for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            for c in consts:
                if c.value in SPELLINGS:
                    out.append(f"{rel}:{node.lineno}: compares with {c.value!r}")
                    skip.add(id(c))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            names = _names_in(node.value)
            if names:
                out.append(f"{rel}:{node.lineno}: literal names {', '.join(names)}: {node.value[:60]!r}")
    return sorted(set(out))


# A quoted name inside a Jinja tag or expression: a condition (or a value) tied to a backend.
_TAG = re.compile(r"\{[%{](.*?)[%}]\}", re.S)


def template_findings(path: Path) -> list[str]:
    text, out = path.read_text(), []
    for m in _TAG.finditer(text):
        for name in SPELLINGS:
            if re.search(rf"""["']{re.escape(name)}["']""", m.group(1)):
                line = text[: m.start()].count("\n") + 1
                out.append(f"{_rel(path)}:{line}: template names {name!r}: {m.group(0)[:60]!r}")
    return out


PY_FILES = [p for p in sorted(PKG.rglob("*.py")) if not p.is_relative_to(BACKENDS_DIR)]
TEMPLATES = sorted((ROOT / "templates").glob("*.j2"))


def test_no_module_outside_the_backends_names_a_backend():
    found = [f for p in PY_FILES for f in python_findings(p)]
    assert not found, "backend names outside hpcrl/planning/backends/:\n" + "\n".join(found)


def test_no_template_condition_names_a_backend():
    found = [f for p in TEMPLATES for f in template_findings(p)]
    assert not found, "templates branch on a backend's name:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "planted",
    [
        'if backend == "verl":\n    pass\n',
        'x = name in ("openrlhf", "y")\n',
        'KEYS = {"open-instruct": 1}\n',
        'msg = f"{x}: open_instruct/grpo_fast.py"\n',
        'if rp.backend.name != "custom":\n    pass\n',
    ],
)
def test_a_planted_name_is_found(tmp_path, planted):
    path = tmp_path / "planted.py"
    path.write_text('"""open-instruct in a docstring is documentation."""\n' + planted)
    assert python_findings(path), planted


def test_docstrings_and_words_pass(tmp_path):
    path = tmp_path / "clean.py"
    path.write_text(
        '"""verl, openrlhf and open-instruct, documented."""\n\n'
        'def f():\n    """As open_instruct does."""\n    return "a custom run"\n'
    )
    assert python_findings(path) == []


def test_a_planted_template_condition_is_found(tmp_path):
    path = tmp_path / "t.j2"
    path.write_text("# verl in a comment is text\n{% if backend == 'verl' %}x{% endif %}\n")
    assert [f.split(": ", 1)[0] for f in template_findings(path)] == [f"{path}:2"]
