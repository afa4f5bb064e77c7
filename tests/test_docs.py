"""The user documentation holds together: links resolve, and every command and cluster has a page.

- Every relative Markdown link `](path)` or `](path#anchor)` in README.md and docs/**/*.md
  names a file that exists relative to the linking file; an anchor names a heading of that
  file (GitHub's slug: lowercase, spaces to '-', other characters than letters, digits, '-'
  and '_' dropped). http(s) links are not checked; an in-page `](#anchor)` must name a heading
  of the same page.
- Every top-level command in the real `python -m hpcrl --help` has a page under docs/ that
  names `hpcrl <command>` in its title or in the usage lines under it, and a command group's
  page names each of its subcommands (`hpcrl clusters show`, ...).
- Every shipped cluster profile (clusters/*.yaml) has its page, docs/clusters/<name>.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (code in them is not Markdown)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, spaces to '-', keep letters, digits, '-' and '_'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.strip().lower().replace(" ", "-")
    return "".join(ch for ch in text if ch.isalnum() or ch in "-_")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every heading anchor of a page; repeated headings get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(page.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link outside code."""
    out = []
    fenced = False
    for no, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            out.append((no, m.group(1)))
    return out


def test_slug_is_githubs():
    assert slug("Watchdog (circuit breaker)") == "watchdog-circuit-breaker"
    assert slug("`hpcrl diagnose LOG`: why did the run fail?") == "hpcrl-diagnose-log-why-did-the-run-fail"
    assert slug("The seeds' 219 GB") == "the-seeds-219-gb"
    assert slug("berzelius (thin) and berzelius:fat") == "berzelius-thin-and-berzeliusfat"
    assert slug("`--json` schema (version 1)") == "--json-schema-version-1"
    assert slug("run_dir and plan.json") == "run_dir-and-planjson"


def test_the_docs_have_links_to_check():
    assert len(PAGES) > 10
    assert sum(len(links(p)) for p in PAGES) > 20


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    problems = []
    for no, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http(s), mailto: not checked
            continue
        path, _, anchor = target.partition("#")
        where = f"{page.relative_to(ROOT)}:{no}: ]({target})"
        if not path:  # an in-page anchor
            if anchor not in anchors(page):
                problems.append(f"{where}: no heading with anchor #{anchor} in this page")
            continue
        dest = (page.parent / path).resolve()
        if not dest.is_file():
            problems.append(f"{where}: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist")
        elif anchor and anchor not in anchors(dest):
            problems.append(
                f"{where}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}; "
                f"anchors there: {', '.join(sorted(anchors(dest)))}"
            )
    assert not problems, "\n".join(problems)


def test_readme_names_existing_pages():
    """README's Documentation list names pages in code spans (`docs/x.md`): they must exist."""
    named = re.findall(r"`(docs/[^`\s]+\.md)`", (ROOT / "README.md").read_text())
    assert named
    missing = [n for n in named if not (ROOT / n).is_file()]
    assert not missing, f"README.md names pages that do not exist: {missing}"


def help_text(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    proc = subprocess.run(
        [sys.executable, "-m", "hpcrl", *args, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return ANSI.sub("", proc.stdout)


def commands_in_help(text: str) -> list[str]:
    """Names in the Commands section of a help page (Rich panel or plain click layout)."""
    names, inside = [], False
    for line in text.splitlines():
        if not inside:
            inside = re.match(r"^\s*(╭─+\s*Commands\b|Commands:)", line) is not None
            continue
        if line.lstrip().startswith("╰") or (not line.strip() and names):
            break
        content = line.rstrip()
        if content.lstrip().startswith("│"):  # inside a Rich panel: drop the borders
            content = content.lstrip()[1:].rstrip("│")
        m = re.match(r"^ {1,2}([a-z][a-z0-9-]*)(?:\s{2,}|\s*$)", content)
        if m:
            names.append(m.group(1))
    return names


@cache
def top_level_commands() -> tuple[str, ...]:
    names = commands_in_help(help_text())
    assert {"plan", "render", "submit", "clusters"} <= set(names), names  # the parser found the panel
    return tuple(names)


def mentions(text: str, command: str) -> bool:
    return re.search(rf"hpcrl {re.escape(command)}(?![\w-])", text) is not None


def opening(page: Path) -> str:
    """A page's title and the usage lines right under it (the indented block after the title)."""
    lines = page.read_text().splitlines()
    if not lines or not lines[0].startswith("# "):
        return ""
    rest = lines[1:]
    while rest and not rest[0].strip():
        rest = rest[1:]
    usage = []
    for line in rest:
        if not line.startswith("    "):
            break
        usage.append(line)
    return "\n".join([lines[0], *usage])


def test_every_command_has_a_page():
    pages = sorted(DOCS.rglob("*.md"))
    missing = [c for c in top_level_commands() if not any(mentions(opening(p), c) for p in pages)]
    assert not missing, f"no page under docs/ names `hpcrl <command>` in its title or usage lines for: {missing}"


def test_every_subcommand_is_on_its_groups_page():
    commands = top_level_commands()
    with ThreadPoolExecutor(max_workers=8) as pool:
        subs = dict(zip(commands, pool.map(lambda c: commands_in_help(help_text(c)), commands)))
    groups = {c: s for c, s in subs.items() if s}
    assert groups, "no command group found (clusters and checkpoints have subcommands)"
    problems = []
    for group, names in groups.items():
        pages = [p for p in sorted(DOCS.rglob("*.md")) if mentions(opening(p), group)]
        if not any(all(mentions(p.read_text(), f"{group} {n}") for n in names) for p in pages):
            problems.append(
                f"no page of `hpcrl {group}` ({', '.join(str(p.relative_to(ROOT)) for p in pages)}) "
                f"names every one of `hpcrl {group} " + "|".join(names) + "`"
            )
    assert not problems, "\n".join(problems)


def test_every_shipped_cluster_has_a_page():
    profiles = sorted(p.stem for p in (ROOT / "clusters").glob("*.yaml"))
    assert profiles
    missing = [n for n in profiles if not (DOCS / "clusters" / f"{n}.md").is_file()]
    assert not missing, f"no docs/clusters/<name>.md for: {missing}"
    listed = (DOCS / "clusters.md").read_text()
    unlinked = [n for n in profiles if f"](clusters/{n}.md)" not in listed]
    assert not unlinked, f"docs/clusters.md does not link the pages of: {unlinked}"
