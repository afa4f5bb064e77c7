"""A fifth backend plugs in by adding one module: tests/data/backends/toy.py, found by the registry
as if it were hpcrl/planning/backends/toy.py, is planned, disk-checked and rendered (issue 22)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hpcrl.planning.backends as registry
from hpcrl.errors import UnknownNameError

HERE = Path(__file__).resolve().parent
TOY_DIR = HERE / "data" / "backends"
CONFIG = "hpcrl:\n  backend: toy\n  cluster: isambard-ai\n  nodes: 2\nmodel: 7b\nsteps: 100\nsave_every: 50\n"


def _forget_toy() -> None:
    registry.get_backend.cache_clear()
    sys.modules.pop(f"{registry.__name__}.toy", None)


@pytest.fixture
def toy(monkeypatch):
    _forget_toy()
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(TOY_DIR)])
    yield
    _forget_toy()


@pytest.fixture
def toy_plan(toy, tmp_path):
    from hpcrl.planning.run_plan import make_run_plan

    path = tmp_path / "toy.yaml"
    path.write_text(CONFIG)
    return make_run_plan(str(path))


def test_without_its_module_there_is_no_toy_backend():
    _forget_toy()
    with pytest.raises(UnknownNameError):
        registry.get_backend("toy")


def test_the_registry_finds_the_module(toy):
    assert registry.get_backend("toy").label == "the toy trainer"


def test_the_config_takes_the_toys_own_defaults(toy_plan):
    assert toy_plan.config.hpcrl.entry_point == "toy.train"


def test_the_disk_check_uses_the_toys_checkpoint_rule(toy_plan):
    from hpcrl.planning.disk_check import check_run_disk

    # 100 steps, a save every 50: two saves, all kept (the toy's rule, by hand).
    state = check_run_disk(toy_plan).item("state")
    assert (state.written, state.at_peak) == (2, 2)


def test_the_rendered_script_runs_the_toys_driver(toy_plan, tmp_path):
    from hpcrl.planning.describe import describe_job
    from hpcrl.rendering.render import render_script

    script = tmp_path / "job.sbatch"
    script.write_text(render_script(describe_job(toy_plan)))
    assert "ENTRY_POINT=toy.train" in [line.strip() for line in script.read_text().splitlines()]


def test_the_rendered_script_parses(toy_plan, tmp_path):
    from hpcrl.planning.describe import describe_job
    from hpcrl.rendering.render import render_script

    script = tmp_path / "job.sbatch"
    script.write_text(render_script(describe_job(toy_plan)))
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_a_config_imports_only_the_backend_it_names():
    """Found by module name, not by importing them all: planning and disk-checking a verl run
    loads no other backend's module."""
    code = (
        "import sys\n"
        "from hpcrl.planning.run_plan import make_run_plan\n"
        "from hpcrl.planning.disk_check import check_run_disk\n"
        "check_run_disk(make_run_plan('verl-grpo-qwen2.5-7b'))\n"
        "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('hpcrl.planning.backends.')\n"
        "             and m.rsplit('.', 1)[1] in ('open_instruct', 'openrlhf', 'custom', 'verl')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=HERE.parent,
        env={**os.environ, "PYTHONPATH": str(HERE.parent)},
    )
    assert out.stdout.split() == ["['verl']"]


def test_a_backend_that_leaves_a_fact_to_the_base_class_is_refused(toy, tmp_path, monkeypatch):
    """A backend that does not say its smoke placement would be placed as open-instruct is: refused, by name."""
    source = (TOY_DIR / "toy.py").read_text()
    (tmp_path / "halfdone.py").write_text(
        source.replace(
            '    smoke_facts = SmokeFacts(placement="learner-spread", comment="place learners and engines apart")\n', ""
        ).replace('name = "toy"', 'name = "halfdone"')
    )
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(tmp_path)])
    registry.get_backend.cache_clear()
    try:
        with pytest.raises(TypeError, match="HalfdoneBackend|ToyBackend") as caught:
            registry.get_backend("halfdone")
        assert "does not declare smoke_facts;" in str(caught.value)
    finally:
        sys.modules.pop(f"{registry.__name__}.halfdone", None)
        registry.get_backend.cache_clear()
