"""The job description (hpcrl/planning/job_spec.py): what planning hands the renderer and the submitter.

It round-trips through JSON, the renderer formats one built by hand (no plan, no backend), `render --json`
and `plan --json` print it under `job`, the submitter reads the run directory from it, nothing under
hpcrl/rendering/ asks a backend, and the facts it carries are kept once (the Ray minimum, the disk need
preflight checks)."""

from __future__ import annotations

import ast
import json
import re
import tomllib
from pathlib import Path

import pytest

from hpcrl import contract
from hpcrl.planning.describe import describe_job
from hpcrl.planning.job_spec import (
    Chain,
    Checkpoints,
    Driver,
    Environment,
    GpuMonitor,
    Header,
    JobSpec,
    NodeRole,
    Phase,
    RunDirectory,
    ShellWord,
    SlurmRequest,
    Watchdog,
)
from hpcrl.planning.run_plan import make_run_plan
from hpcrl.rendering.render import render_script
from helpers import ROOT, lint, ok_json, run_hpcrl

# Each shipped config at a size it plans at (the config's own cluster).
SHIPPED = [
    ("grpo-olmo3-32b", "isambard-ai", 16),
    ("verl-grpo-qwen2.5-7b", "isambard-ai", 4),
    ("openrlhf-grpo-qwen2.5-7b", "isambard-ai", 4),
    ("custom-ppo-qwen2.5-3b-qlora", "berzelius:fat", 1),
]


@pytest.mark.parametrize("config,cluster,nodes", SHIPPED)
@pytest.mark.parametrize("smoke", [False, True])
def test_description_round_trips_through_json(config, cluster, nodes, smoke):
    job = describe_job(make_run_plan(config, nodes=nodes, cluster=cluster), smoke=smoke)
    again = JobSpec.from_json(json.dumps(job.to_json()))
    assert again == job
    assert render_script(again) == render_script(job)


def _hand_built(**over) -> JobSpec:
    """A two-node job without Ray, written out field by field (no plan, no backend)."""
    fields = dict(
        header=Header(
            hpcrl_version="0.0-test",
            cluster="handmade",
            config_name="-",
            config_digest="abc123",
            framework=None,
            summary=("two nodes, one trainer",),
            assumptions=(),
            warnings=(),
        ),
        slurm=SlurmRequest(
            job_name="hpcrl-hand",
            nodes=2,
            gpu_request="--gpus-per-node=4",
            share=("--exclusive",),
            time="01:00:00",
            partition="debug",
            output="hpcrl-hand-%j.out",
            signal_lead_s=300,
        ),
        gpus_per_node=4,
        cpus_per_node=32,
        roles=(NodeRole(role="head", count=1, does="the trainer"), NodeRole(role="worker", count=1, does="idle")),
        phases=(
            Phase(name="environment", does="set up"),
            Phase(name="stack_check", does="check"),
            Phase(name="head", does="this node"),
            Phase(name="services", does="none"),
            Phase(name="driver", does="the trainer"),
            Phase(name="stop", does="record the end"),
        ),
        environment=Environment(hf_home="/scratch/hf", umask="077"),
        run_dir=RunDirectory(root="/scratch/runs", name="hand made", node_local="/tmp/local", ray_log_keep_mib=8),
        ray=None,
        port_range=(20000, 21000),
        driver=Driver(
            backend="handmade",
            label="a hand-made trainer",
            workdir="$HOME/work",
            python="python3",
            entry_point="mytrainer.main",
            entry_module=True,
            module_owner="its package",
            args=(
                (ShellWord(text="--lr"), ShellWord(text="0.5")),
                (ShellWord(text="--note"), ShellWord(text="it's fine; rm -rf /")),
                (ShellWord(text="--out"), ShellWord(text="$RUN_DIR/output", expand=True)),
            ),
            env=(("TRAINER_MODE", ShellWord(text="fast")),),
        ),
        watchdog=Watchdog(zero_reward_steps=7, hang_minutes=12, grad_norm_steps=3, zero_variance_steps=4),
        checkpoints=Checkpoints(
            key="save_every", marker="output/latest", every=None, variable="CKPT_EVERY", signal_lead_s=300
        ),
        chain=Chain(max_restarts=2, max_failure_restarts=1, failure_backoff_s=5),
        gpu_monitor=GpuMonitor(),
        kill_wait_s=30,
        signal_before_end_s=300,
        grace_s=180,
        plan={"nodes": 2, "note": "by hand"},
    )
    return JobSpec(**{**fields, **over})


def _main_phases(text: str) -> list[str]:
    body = text[text.index("\nmain() {\n") :]
    body = body[: body.index("\n}\n")]
    return re.findall(r"^\s+phase_(\w+)\s+#", body, re.M)


def test_renderer_formats_a_description_built_by_hand(tmp_path, shellcheck):
    text = render_script(_hand_built())
    lint(text, tmp_path, shellcheck)
    assert "#SBATCH --nodes=2" in text and "#SBATCH --exclusive" in text and "#SBATCH --time=01:00:00" in text
    assert _main_phases(text) == ["environment", "stack_check", "head", "services", "driver", "stop"]
    assert not re.search(r"^[^#\n]*\bray start\b", text, re.M) and "phase_readiness" not in text
    # Each argument a word of its own, the user's text quoted, the run dir expanded by the shell.
    assert "        --lr 0.5\n" in text
    assert """        --note 'it'"'"'s fine; rm -rf /'\n""" in text
    assert '        --out "$RUN_DIR/output"\n' in text
    assert "export TRAINER_MODE=fast" in text
    assert "RUN_DIR=/scratch/runs/'hand made'" in text
    assert "--zero-reward-steps 7 --hang-minutes 12" in text
    assert "PYTHON=python3" in text and 'WORKDIR="${HOME}"/work' in text
    assert '"nodes": 2' in text and '"note": "by hand"' in text  # plan.json, as written into the run dir


def test_phases_come_from_the_description(tmp_path, shellcheck):
    phases = (
        Phase(name="environment", does="a"),
        Phase(name="head", does="b"),
        Phase(name="driver", does="c"),
        Phase(name="stop", does="d"),
    )
    text = render_script(_hand_built(phases=phases))
    assert _main_phases(text) == ["environment", "head", "driver", "stop"]


@pytest.mark.parametrize(
    "args",
    [
        ("--nodes", "16"),
        ("--config", "verl-grpo-qwen2.5-7b", "--nodes", "4"),
        ("--config", "openrlhf-grpo-qwen2.5-7b", "--nodes", "4"),
    ],
)
def test_render_json_prints_the_job(args):
    data = ok_json(run_hpcrl("render", *args, "--json"))
    job = JobSpec.from_json(data["job"])
    assert job.slurm.nodes == int(args[-1])
    assert render_script(job) == data["script"]
    assert _main_phases(data["script"]) == [p.name for p in job.phases]
    assert [p.name for p in job.phases] == [
        "environment",
        "stack_check",
        "head",
        "workers",
        "readiness",
        "services",
        "driver",
        "stop",
    ]
    assert job.ray is not None and job.driver is not None


def test_plan_json_prints_the_same_job_as_render():
    rendered = ok_json(run_hpcrl("render", "--config", "verl-grpo-qwen2.5-7b", "--nodes", "4", "--json"))
    planned = ok_json(run_hpcrl("plan", "--config", "verl-grpo-qwen2.5-7b", "--nodes", "4", "--json"))
    assert planned["job"] == rendered["job"]
    what_if = ok_json(run_hpcrl("plan", "--nodes", "16", "--model", "7b", "--json"))
    assert what_if["job"] is None  # another model than the config's: no script, no job


def test_a_backend_without_ray_has_no_ray_section():
    job = describe_job(make_run_plan("custom-ppo-qwen2.5-3b-qlora", nodes=1, cluster="berzelius:fat"))
    assert job.ray is None
    assert [p.name for p in job.phases] == ["environment", "stack_check", "head", "services", "driver", "stop"]
    assert not re.search(r"^[^#\n]*\bray start\b", render_script(job), re.M)


def test_the_submitter_reads_the_run_directory_from_the_description(tmp_path):
    from hpcrl.jobs import submission
    from hpcrl.jobs.run_script import build
    from hpcrl.planning.request import RunRequest

    built = build(
        RunRequest(
            config="grpo-olmo3-7b", nodes=3, cluster="local-dev", sets=(f"hpcrl.run_root={tmp_path}/from-config",)
        )
    )
    moved = built.job.model_copy(
        update={"run_dir": built.job.run_dir.model_copy(update={"root": str(tmp_path / "from-job"), "name": "renamed"})}
    )
    sub = submission.from_run_script(built._replace(job=moved))
    assert sub.run_dir.path == tmp_path / "from-job" / "renamed" and sub.name == "renamed"
    assert sub.plan == moved.plan and sub.cluster == "local-dev"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_renderer_imports_only_the_job_description_from_planning():
    """The renderer formats; it asks no backend or planner (planning.backends, describe, run_plan, ...)."""
    found = {
        f"{p.name}: {m}"
        for p in (ROOT / "hpcrl" / "rendering").glob("*.py")
        for m in _imports(p)
        if m.startswith("hpcrl.planning") and m != "hpcrl.planning.job_spec"
    }
    assert found == set()


def test_templates_read_no_plan_or_backend_object():
    """The templates see only the renderer's context: no attribute of a plan, config, profile or backend."""
    text = "".join(p.read_text() for p in (ROOT / "templates").glob("*.j2"))
    jinja = " ".join(re.findall(r"\{\{.*?\}\}|\{%.*?%\}", text, re.S))
    assert "phases" in jinja  # the expressions were found
    assert not re.findall(r"\b(?:rp|backend|config|profile|layout_args|run_plan|workload)\.\w+", jinja)


def test_the_ray_minimum_is_one_fact():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ray"]
    bound = next(re.search(r">=\s*(\d+)\.(\d+)", d) for d in extra if d.startswith("ray"))
    assert (int(bound[1]), int(bound[2])) == contract.RAY_TOKEN_MIN
    job = describe_job(make_run_plan("grpo-olmo3-7b", nodes=3, cluster="local-dev"))
    assert job.ray is not None and job.ray.min_version == contract.RAY_TOKEN_MIN
    assert "needs Ray >= 2.52" in render_script(job)


@pytest.mark.parametrize(
    "config", ["verl-grpo-qwen2.5-7b", "grpo-olmo3-32b", "openrlhf-grpo-qwen2.5-7b", "custom-ppo-qwen2.5-3b-qlora"]
)
def test_preflight_asks_the_disk_plan_disk_plans(config):
    """preflight's run-root need is the run's own backend's budget, as `plan-disk --config` prints it."""
    from hpcrl.jobs.preflight import target

    want = ok_json(run_hpcrl("plan-disk", "--config", config, "--json"))["peak_gib"]
    assert target(config=config).disk_need_gib == pytest.approx(want, abs=0.05)


def test_the_plan_uses_the_inputs_it_is_given():
    """Inputs are resolved once and handed down: a plan made from resolved inputs whose profile was changed
    by hand plans on that profile, not on one looked up again by name."""
    from dataclasses import replace

    from hpcrl.planning.inputs import resolve_inputs
    from hpcrl.planning.run_plan import plan_run

    inputs = resolve_inputs("grpo-olmo3-7b", nodes=3, cluster="local-dev")
    bigger = inputs.profile.model_copy(update={"gpu": inputs.profile.gpu.model_copy(update={"count_per_node": 8})})
    rp = plan_run(replace(inputs, profile=bigger))
    assert rp.profile is bigger
    assert rp.layout.learner_gpus + rp.layout.engines * rp.layout.tp + rp.layout.idle_gpus == 3 * 8
    assert describe_job(rp).gpus_per_node == 8
