"""The docs' example outputs are what the commands print: every `<!-- example: CMD -->` block in
docs/**/*.md is re-run (scripts/docs-examples, in its sandbox) and compared with the page, timestamps
aside. A drifted example fails here; `scripts/docs-examples` rewrites it from a fresh run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "docs-examples"
_spec = spec_from_loader("docs_examples", SourceFileLoader("docs_examples", str(SCRIPT)))
docs_examples = module_from_spec(_spec)
_spec.loader.exec_module(docs_examples)

EXAMPLES = [ex for page in sorted((ROOT / "docs").rglob("*.md")) for ex in docs_examples.examples(page)]


def test_the_command_pages_have_examples_to_check():
    marked = {ex.page.name for ex in EXAMPLES}
    assert {"plan.md", "plan-memory.md", "plan-disk.md", "render.md", "api.md"} <= marked


@pytest.mark.parametrize("ex", EXAMPLES, ids=lambda ex: f"{ex.page.relative_to(ROOT)}:{ex.line}")
def test_example_output_is_the_commands(ex):
    if "| jq" in ex.command and shutil.which("jq") is None:
        pytest.skip("jq is not installed")
    real = docs_examples.run(ex.command)
    assert docs_examples.normalised(real) == docs_examples.normalised(ex.shown), (
        f"{ex.page.relative_to(ROOT)}:{ex.line}: the example's output drifted; run scripts/docs-examples"
    )


DRIFTED = """\
# A page

<!-- example: hpcrl plan --nodes 100000 -->
```
$ hpcrl plan --nodes 100000
hpcrl: error: --nodes 100000: too many
```
"""


def test_the_script_rewrites_a_drifted_example(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(DRIFTED)
    subprocess.run([sys.executable, str(SCRIPT), str(page)], check=True, capture_output=True, timeout=300)
    # Isambard-AI has 1,362 nodes (clusters/isambard-ai.yaml, slurm.system_nodes).
    assert (
        "hpcrl: error: --nodes 100000: isambard-ai has 1,362 nodes in all; valid: 1 to 1,362\n```" in page.read_text()
    )


def test_check_names_a_drifted_example_and_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(DRIFTED)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(page), "--check"], capture_output=True, text=True, timeout=300
    )
    assert (proc.returncode, proc.stderr) == (1, f"{page}:3: hpcrl plan --nodes 100000: drifted\n")
