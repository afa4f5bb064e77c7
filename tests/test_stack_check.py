"""The job's stack check (hpcrl/runtime/stack.py) on stand-in environments made here: distributions
are dist-info folders with the version the test names, packages empty folders (nothing of them is
imported), the frameworks' parsers small stand-ins (a Hydra config, an argparse __main__ block)
run by the real Hydra and argparse. Expected lines come from the stand-in and the framework facts
(data/stack.json, cited at each commit), not from the check. No GPU here: the driver's CUDA is
given to `verdict` directly, which is the only place a driver is stood in for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import scontrol_job

from hpcrl.planning.backends import stack_expect, versions
from hpcrl.contract import RAY_TOKEN_MIN
from hpcrl.runtime.stack import PARSE_REJECTED, STACK_MISMATCH_EXIT, satisfies, verdict

ROOT = Path(__file__).resolve().parents[1]
RAY_MIN = ".".join(map(str, RAY_TOKEN_MIN))
RAY_WHY = f"hpcrl: Ray below {RAY_MIN} ignores RAY_AUTH_MODE=token"
# verl 0.10.0.dev's install (pyproject.toml at 1dda039b): what a good environment holds.
GOOD_VERL = {
    "verl": "0.10.0.dev0",
    "TransferQueue": "0.1.6",
    "ray": "2.55.0",
    "vllm": "0.24.0",
    "torch": "2.11.0+cu130",
    "transformers": "5.5.3",
}
MODULES = {
    "verl": "verl",
    "TransferQueue": "transfer_queue",
    "ray": "ray",
    "vllm": "vllm",
    "torch": "torch",
    "transformers": "transformers",
    "openrlhf": "openrlhf",
    "deepspeed": "deepspeed",
}
# A stand-in of verl's config tree: the keys the overrides below touch.
PPO_TRAINER = "trainer:\n  use_v1: true\n  nnodes: 1\nactor_rollout_ref:\n  model:\n    path: x\n"
OPENRLHF_MAIN = textwrap.dedent("""\
    import argparse
    import ray  # not standard library: the dry parse leaves it out

    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--pretrain", type=str)
        parser.add_argument("--actor_num_nodes", type=int, default=1)
        args = parser.parse_args()
        ray.init()
""")


def stand_in(tmp_path: Path, dists: dict[str, str]) -> Path:
    """A folder for PYTHONPATH holding each distribution's metadata and an empty package."""
    site = tmp_path / "site"
    for name, version in dists.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        pkg = site / MODULES[name]
        pkg.mkdir(exist_ok=True)
        (pkg / "__init__.py").write_text("raise ImportError('the stack check must not import me')\n")
    if "torch" in dists:
        (site / "torch" / "version.py").write_text("cuda: Optional[str] = '13.0'\n")
    if "verl" in dists:
        (site / "verl" / "trainer" / "config").mkdir(parents=True)
        (site / "verl" / "trainer" / "config" / "ppo_trainer.yaml").write_text(PPO_TRAINER)
    if "openrlhf" in dists:
        (site / "openrlhf" / "cli").mkdir(parents=True)
        (site / "openrlhf" / "cli" / "train_ppo_ray.py").write_text(OPENRLHF_MAIN)
    return site


def run_check(site: Path, expect: dict, *argv: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{ROOT}")
    return subprocess.run(
        [sys.executable, "-m", "hpcrl.runtime.stack", "--expect", json.dumps(expect), "--python", python, "--", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=site.parent,
        timeout=120,
    )


def verl_expect() -> dict:
    return stack_expect.expectation("verl", None, ray_min=RAY_MIN, ray_min_why=RAY_WHY)


def test_a_good_verl_environment_passes_with_its_overrides_composed(tmp_path):
    out = run_check(stand_in(tmp_path, GOOD_VERL), verl_expect(), "trainer.nnodes=2", "actor_rollout_ref.model.path=Q")
    assert (out.returncode, out.stdout.splitlines()[0]) == (
        0,
        (
            "stack: ok: python {}, verl 0.10.0.dev0, transfer_queue 0.1.6, ray 2.55.0, vllm 0.24.0, torch 2.11.0+cu130, "
            "transformers 5.5.3".format(".".join(map(str, sys.version_info[:3])))
        ),
    )


def test_a_verl_of_another_version_is_a_warning_naming_the_table_and_the_version_the_plan_targets(tmp_path):
    """0.8.0.dev0 is b178a3cd's declared version (verl/version/version:1 there): its own table is used, and the
    job goes on; the installed framework's own parse decides."""
    out = run_check(stand_in(tmp_path, dict(GOOD_VERL, verl="0.8.0.dev0")), verl_expect())
    assert (out.returncode, out.stdout.splitlines()[1]) == (
        0,
        (
            "stack: warning: verl 0.8.0.dev0 installed, a release hpcrl has read (0.8.0.dev (b178a3cd)); the plan "
            "targets verl 0.10.0.dev (1dda039b): render with hpcrl.framework_version=0.8.0.dev to plan for "
            "0.8.0.dev (b178a3cd)"
        ),
    )


def test_a_missing_transfer_queue_is_named_with_the_line_that_imports_it(tmp_path):
    env = {k: v for k, v in GOOD_VERL.items() if k != "TransferQueue"}
    out = run_check(stand_in(tmp_path, env), verl_expect())
    assert (out.returncode, out.stdout) == (
        STACK_MISMATCH_EXIT,
        (
            "stack: transfer_queue not installed; verl 0.10.0.dev (1dda039b) runs trainer.use_v1=true, which imports it "
            "(verl/trainer/main_ppo.py:137)\n"
        ),
    )


def test_transfer_queue_is_not_asked_for_when_the_run_turns_the_v1_trainer_off(tmp_path):
    env = {k: v for k, v in GOOD_VERL.items() if k != "TransferQueue"}
    out = run_check(stand_in(tmp_path, env), verl_expect(), "trainer.use_v1=false")
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_ray_below_hpcrl_s_token_floor_is_refused_though_verl_allows_it(tmp_path):
    """verl asks ray>=2.41.0 (pyproject.toml:51); the job script needs 2.52 for token authentication."""
    out = run_check(stand_in(tmp_path, dict(GOOD_VERL, ray="2.49.0")), verl_expect())
    assert (out.returncode, out.stdout) == (
        STACK_MISMATCH_EXIT,
        f"stack: ray 2.49.0 installed; hpcrl needs ray>={RAY_MIN} ({RAY_WHY})\n",
    )


def test_a_key_the_installed_verl_s_config_lacks_is_rejected_by_hydra(tmp_path):
    out = run_check(stand_in(tmp_path, GOOD_VERL), verl_expect(), "actor_rollout_ref.model.lora.rank=16")
    line = out.stdout.strip()
    assert (
        out.returncode,
        line.startswith("stack: verl 0.10.0.dev0 rejects the driver's command line: "),
        "Could not override 'actor_rollout_ref.model.lora.rank'" in line,
        len(out.stdout.splitlines()),
    ) == (STACK_MISMATCH_EXIT, True, True, 1)


def test_openrlhf_s_own_argparse_block_rejects_an_unknown_flag_without_importing_ray(tmp_path):
    good = {"openrlhf": "0.11.0", "ray": "2.55.0", "vllm": "0.27.1", "deepspeed": "0.19.5", "transformers": "5.15.0"}
    out = run_check(stand_in(tmp_path, good), stack_expect.expectation("openrlhf"), "--pretrain", "m", "--bogus", "1")
    assert (out.returncode, out.stdout) == (
        STACK_MISMATCH_EXIT,
        "stack: openrlhf 0.11.0 rejects the driver's command "
        "line: train_ppo_ray.py: error: unrecognized arguments: --bogus 1 (the plan "
        "targets openrlhf 0.11.0 (3c3be623))\n",
    )


def test_open_instruct_s_python_3_12_is_a_warning_not_a_stop():
    """open-instruct e6c3044a: requires-python ==3.12.* (pyproject.toml:6): a pin the framework's own import decides."""
    found = {"python": "3.11.7", "executable": "/usr/bin/python3", "packages": {}}
    bad, warn, _ = verdict(
        {"backend": "open-instruct", "version": "e6c3044a", "python": {"spec": "==3.12.*", "source": "s"}}, found, None
    )
    assert (bad, warn) == ([], ["python 3.11.7 (/usr/bin/python3); open-instruct e6c3044a asks for python==3.12.* (s)"])


def test_a_cuda_13_torch_on_a_cuda_12_7_driver_is_a_mismatch():
    """Isambard-AI's driver runs CUDA 12.7 at most; verl 1dda039b installs a cu130 torch (pyproject.toml:93)."""
    found = {
        "python": "3.12.3",
        "packages": {"torch": {"version": "2.11.0+cu130", "location": "/x/torch"}},
        "torch_cuda": "13.0",
    }
    bad, _, _ = verdict(dict(verl_expect(), packages=[], tables=[], hpcrl_packages=[]), found, "12.7")
    assert bad == [
        "torch 2.11.0+cu130 is built for CUDA 13.0; this node's driver runs CUDA 12.7 at most: install a "
        "torch built for CUDA 12.x; verl 0.10.0.dev (1dda039b) installs a CUDA 13.0 torch "
        "(pyproject.toml:93 at 1dda039b)"
    ]


@pytest.mark.parametrize(
    "version,spec,ok",
    [
        ("0.10.0.dev0", "==0.10.0.*", True),  # a prefix match takes the dev release
        ("0.8.0.dev0", "==0.10.0.*", False),
        ("2.11.0+cu130", "==2.11.0", True),  # == ignores the local label
        ("2.49.2", ">=2.52", False),
        ("2.10.0", ">=2.8.0,<2.9", False),
        ("2.8.1", ">=2.8.0,<2.9", True),
        ("1.0rc1", "<1.0", True),  # a pre-release sorts before its release
        ("0.12.0", ">=0.8.5,<=0.12.0", True),
    ],
)
def test_version_specifiers_as_pep_440_reads_them(version, spec, ok):
    assert satisfies(version, spec) is ok


@pytest.mark.parametrize(
    "backend,version", [(b, v.key) for b in ("open-instruct", "verl", "openrlhf") for v in versions.known(b)]
)
def test_every_known_version_has_install_facts(backend, version):
    """Each version's expectation is its own: the commit it was read at, or the release named (no commit)."""
    e = stack_expect.expectation(backend, version)
    assert (e["commit"] or e["version"]) == version


def test_a_custom_script_has_no_expectation():
    assert stack_expect.expectation("custom") is None


def test_preflight_runs_the_same_check_for_a_verl_run(tmp_path):
    """`hpcrl preflight --config` on a verl run: the probe runs stack.py as sent in its spec, with the
    driver's real overrides, in the training environment (here a stand-in without transfer_queue)."""
    from hpcrl.jobs.preflight import target
    from hpcrl.jobs.preflight_checks import stack_rows
    from hpcrl.runtime.preflight_probe import stack_check

    site = stand_in(tmp_path, {k: v for k, v in GOOD_VERL.items() if k != "TransferQueue"})
    spec = dict(
        target("local-dev", None, str(ROOT / "configs" / "verl-grpo-qwen2.5-7b.yaml")).spec,
        env_setup=[f"export PYTHONPATH={site}"],
        workdir=str(tmp_path),
        python=sys.executable,
    )
    assert stack_rows(stack_check(spec, 120))[0] == (
        "stack check",
        "fail",
        "transfer_queue not installed; verl 0.10.0.dev (1dda039b) runs trainer.use_v1=true, "
        "which imports it (verl/trainer/main_ppo.py:137)",
    )


def test_in_a_slurm_job_on_n1_the_line_lands_in_the_job_s_output(slurm, run_sbatch_and_wait, tmp_path):
    """The module as the job script runs it, on a node of the local Slurm, in an environment that lacks
    transfer_queue: the job's output holds the one line, and the job ends with the stack check's code."""
    env = {k: v for k, v in GOOD_VERL.items() if k != "TransferQueue"}
    site = stand_in(tmp_path, env)
    (tmp_path / "expect.json").write_text(json.dumps(verl_expect()))
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --nodelist={slurm.usable[0]} --time=2 --output={tmp_path}/job.out\n"
        f"export PYTHONPATH={site}{os.pathsep}{ROOT}\n"
        f"{sys.executable} -m hpcrl.runtime.stack --expect {tmp_path}/expect.json "
        f"--python {sys.executable} -- trainer.nnodes=1\n"
    )
    job = run_sbatch_and_wait(script, 120)
    assert (job.state, scontrol_job(job.job_id).get("ExitCode"), job.output) == (
        "FAILED",
        f"{STACK_MISMATCH_EXIT}:0",
        "stack: transfer_queue not installed; verl 0.10.0.dev (1dda039b) "
        "runs trainer.use_v1=true, which imports it (verl/trainer/main_ppo.py:137)\n",
    )


def test_open_instruct_s_parser_is_built_in_its_own_module_namespace(tmp_path):
    """open-instruct's __main__ block builds its parser from classes its file imports (grpo_fast.py:2389-2403
    at e6c3044a), so the dry parse imports the entry file first; a stand-in checkout with such a parser."""
    pkg = tmp_path / "open_instruct"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "args.py").write_text(
        textwrap.dedent("""\
        import argparse

        class ArgumentParserPlus(argparse.ArgumentParser):
            def parse_args_into_dataclasses(self):
                return self.parse_args()

        def make():
            p = ArgumentParserPlus(prog="grpo_fast.py")
            p.add_argument("--learning_rate", type=float)
            return p
    """)
    )
    (pkg / "grpo_fast.py").write_text(
        textwrap.dedent("""\
        from open_instruct.args import make

        if __name__ == "__main__":
            parser = make()
            args = parser.parse_args_into_dataclasses()
            raise SystemExit("the driver must not run")
    """)
    )
    parser = json.dumps(stack_expect.expectation("open-instruct")["parser"])
    script = ROOT / "hpcrl" / "runtime" / "stack_parse.py"

    def parse(*argv):
        return subprocess.run(
            [sys.executable, str(script), parser, "--", *argv], capture_output=True, text=True, cwd=tmp_path, timeout=60
        )

    good, bad = parse("--learning_rate", "1e-6"), parse("--lr", "1e-6")
    assert (good.returncode, bad.returncode, bad.stderr.splitlines()[-1]) == (
        0,
        PARSE_REJECTED,
        "grpo_fast.py: error: unrecognized arguments: --lr 1e-6",
    )
