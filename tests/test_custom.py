"""The custom backend and jobs smaller than a node (`--gpus N`): goldens and lint of
`berzelius:fat --gpus 1/2`, the one-line refusals, plan-memory of the shipped example against
terms computed here by hand from Qwen2.5-3B's published config, and the custom backend's job on
the real local Slurm with a stand-in for the users' script (tests/data/custom_ppo_standin.py).

Regenerate the goldens after an intended change with

    HPCRL_UPDATE_GOLDEN=1 python -m pytest tests/test_custom.py -k golden
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from helpers import assert_golden, lint
from helpers import shipped_hpcrl as hpcrl

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).with_name("data")
CONFIG = "configs/custom-ppo-qwen2.5-3b-qlora.yaml"
GIB = 1024**3


@pytest.fixture(autouse=True)
def _shipped_profiles_only(monkeypatch, tmp_path):
    monkeypatch.delenv("HPCRL_CLUSTERS_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


RENDERS = {
    "berzelius-fat__custom-ppo-qwen2.5-3b-qlora__gpus1": ["--gpus", "1"],
    "berzelius-fat__custom-ppo-qwen2.5-3b-qlora__gpus2": ["--gpus", "2", "--set", "launcher=torchrun"],
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    out = {}
    for name, extra in RENDERS.items():
        res = hpcrl("render", "--config", CONFIG, "--cluster", "berzelius:fat", *extra)
        assert res.returncode == 0, res.stderr
        out[name] = res.stdout
    return out


def test_golden(rendered):
    """One full golden for the custom backend; --gpus 2 is checked on what differs (test_partial_node_request)."""
    name = "berzelius-fat__custom-ppo-qwen2.5-3b-qlora__gpus1"
    assert_golden(f"{name}.sh", rendered[name])


@pytest.mark.parametrize("name", list(RENDERS))
def test_bash_n_and_shellcheck(name, rendered, tmp_path, shellcheck):
    lint(rendered[name], tmp_path, shellcheck)


def sbatch_lines(text: str) -> list[str]:
    return re.findall(r"^#SBATCH (\S+)$", text, re.M)


@pytest.mark.parametrize("gpus", [1, 2])
def test_partial_node_request(rendered, gpus):
    """One node, the GPU request in Berzelius' style (--gpus=N), 16 cores per GPU, memory left to the site
    (it gives 254 GB per fat GPU), no --exclusive, no Ray."""
    text = rendered[f"berzelius-fat__custom-ppo-qwen2.5-3b-qlora__gpus{gpus}"]
    opts = sbatch_lines(text)
    assert "--nodes=1" in opts and f"--gpus={gpus}" in opts and "--cpus-per-gpu=16" in opts
    assert "--exclusive" not in opts and not any(o.startswith(("--mem", "--gpus-per-node", "--gres")) for o in opts)
    assert "--constraint=fat" in opts
    assert (
        not re.search(r"^[^#\n]*\bray start\b", text, re.M)
        and "RAY_AUTH_MODE" not in text
        and not re.search(r"^\s*srun ", text, re.M)
    )
    launch = re.search(r'^ +"\$PYTHON" (.*)"\$ENTRY_POINT"$', text, re.M)
    assert launch, "no launch line"
    if gpus == 2:
        assert launch.group(1) == "-m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2 "
    else:
        assert launch.group(1) == ""
    assert '--output_dir "$RUN_DIR/checkpoints"' in text
    assert "--reward-key avg_reward --loss-key loss --loss-key policy_loss --loss-key value_loss --" in text


def test_isambard_partial_node_is_one_superchip_per_gpu():
    """Isambard-AI hands out a superchip per GPU (72 cores, ~115 GiB): cores asked, memory left to
    the site, no --mem=0 (the whole-node setting) and no --exclusive; host RAM planned as 115 GiB."""
    res = hpcrl(
        "render", "--config", CONFIG, "--cluster", "isambard-ai", "--gpus", "1", "--set", 'hpcrl.time="24:00:00"'
    )
    assert res.returncode == 0, res.stderr
    opts = sbatch_lines(res.stdout)
    assert "--nodes=1" in opts and "--gpus-per-node=1" in opts and "--cpus-per-gpu=72" in opts
    assert not [o for o in opts if o.startswith(("--mem", "--exclusive"))], opts
    res = hpcrl(
        "plan-memory", "--config", CONFIG, "--cluster", "isambard-ai", "--gpus", "1", "--learner-gpus", "1", "--json"
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["host"]["ram_gib"] == 115


def test_submit_takes_gpus_too(tmp_path, monkeypatch):
    """`hpcrl submit --gpus 1 --dry-run` records the run and writes the same partial-node request
    render gives (nothing goes to Slurm)."""
    monkeypatch.setenv("HPCRL_REGISTRY", str(tmp_path / "reg.db"))
    res = hpcrl(
        "submit",
        "--config",
        str(REPO / CONFIG),
        "--cluster",
        "local-dev",
        "--gpus",
        "1",
        "--set",
        f"hpcrl.run_root={tmp_path / 'runs'}",
        "--set",
        'hpcrl.time="00:10:00"',
        "--dry-run",
        "--json",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    opts = sbatch_lines(Path(json.loads(res.stdout)["script"]).read_text())
    assert "--nodes=1" in opts and "--gpus-per-node=1" in opts and "--cpus-per-gpu=1" in opts
    assert "--exclusive" not in opts, opts


def test_ray_backend_on_part_of_a_node_still_brings_up_ray(tmp_path, shellcheck):
    res = hpcrl(
        "render", "--config", "verl-grpo-qwen2.5-7b", "--cluster", "berzelius:fat", "--gpus", "4", "--nodes", "1"
    )
    assert res.returncode == 0, res.stderr
    opts = sbatch_lines(res.stdout)
    assert "--gpus=4" in opts and "--exclusive" not in opts and "--cpus-per-gpu=16" in opts
    assert "trainer.n_gpus_per_node=4" in res.stdout and "ray start --head" in res.stdout
    assert "--num-gpus=4" in res.stdout and "HPCRL_RAY_CPUS=64" in res.stdout  # 4 GPUs x 16 cores
    lint(res.stdout, tmp_path, shellcheck)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--gpus", "0"], "hpcrl: error: --gpus 0: a berzelius:fat node has 8 GPUs; valid: 1 to 8"),
        (["--gpus", "9"], "hpcrl: error: --gpus 9: a berzelius:fat node has 8 GPUs; valid: 1 to 8"),
        (["--gpus", "2", "--nodes", "2"], "hpcrl: error: --gpus 2 asks for part of one node, but the job has 2 nodes"),
    ],
)
def test_bad_gpus_is_one_line(args, message):
    for command in ("render", "plan"):
        res = hpcrl(command, "--config", CONFIG, "--cluster", "berzelius:fat", *args)
        assert res.returncode == 2 and res.stdout == ""
        assert res.stderr.startswith(message) and res.stderr.count("\n") == 1, res.stderr


def test_custom_backend_refuses_more_than_one_node():
    res = hpcrl("render", "--config", CONFIG, "--cluster", "berzelius:fat", "--set", "hpcrl.gpus=null", "--nodes", "2")
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "the custom backend runs one node" in res.stderr


def test_unknown_custom_key_names_the_closest():
    res = hpcrl("render", "--config", CONFIG, "--set", "lora_rnak=8")
    assert res.returncode == 2 and "unknown custom key 'lora_rnak'" in res.stderr and "lora_rank" in res.stderr


# --------------------------------------------------------------------------- plan-memory by hand

# Qwen/Qwen2.5-3B's published config.json: hidden 2048, intermediate 11008, 36 layers, 16 query
# heads and 2 KV heads of 128, vocabulary 151936, tied embeddings; 3,085,938,688 parameters.
H, FF, LAYERS, QD, KVD, VOCAB, PARAMS = 2048, 11008, 36, 16 * 128, 2 * 128, 151936, 3_085_938_688


def test_plan_memory_of_the_example_by_hand():
    res = hpcrl("plan-memory", "--config", CONFIG, "--cluster", "berzelius:fat", "--learner-gpus", "1", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    lr = d["learner"]
    assert d["fits"] is True and lr["weights"] == "4-bit NF4" and lr["lora_rank"] == 8 and d["backend"] == "custom"
    # The decoder's linear weights go to 4 bits (0.5 byte) with one fp32 absmax per 64 (bitsandbytes);
    # the rest (embeddings, norms, biases) stays bf16.
    linear = LAYERS * (H * QD + H * KVD * 2 + QD * H + 3 * H * FF)
    assert linear == 2_774_532_096
    base = 0.5 * linear + 2 * (PARAMS - linear)
    consts = linear * 4 / 64
    # LoRA r8 on all seven linears: r x (in + out) each.
    lora = LAYERS * 8 * ((H + QD) + (H + KVD) * 2 + (QD + H) + (H + FF) * 2 + (FF + H))
    assert d["model"]["trainable_params"] == lora + H + 1  # + TRL's value head Linear(hidden, 1)
    kv = 4 * 384 * (2 * LAYERS * KVD * 2)  # 4 sequences x 384 tokens x K and V, bf16
    logits = 1536 * VOCAB * (2 + 10)  # bf16 logits + the eager fp32 path (constants, fitted)
    res_terms, train = lr["resident"], lr["phases"]["training"]["transient"]
    expect = {
        "policy base weights, 4-bit NF4 linears + bf16 embeddings and norms (derived)": base,
        "policy 4-bit quantization constants, fp32 absmax per 64 weights (derived)": consts,
        "LoRA adapters, fp32 (derived)": 4 * lora,
        "adapter gradients, fp32 (derived)": 4 * lora,
        "AdamW moments, fp32, trainable parameters only (derived)": 8 * lora,
        "reference: the policy's base with the adapters off (no copy) (derived)": 0,
    }
    for term, value in expect.items():
        assert res_terms[term] == pytest.approx(value / GIB, abs=6e-4), term
    assert lr["phases"]["generation"]["transient"][
        "HF generate KV cache, bf16, every sequence at full length (derived)"
    ] == pytest.approx(kv / GIB, abs=6e-4)
    assert train["log-prob path logits, bf16 + eager fp32 log_softmax (fitted)"] == pytest.approx(
        logits / GIB, abs=6e-4
    )
    assert train["stored activations, bf16 layer inputs (gradient checkpointing) (derived)"] == pytest.approx(
        LAYERS * 1536 * 2 * H / GIB, abs=6e-4
    )
    assert d["gpu"]["cluster"] == "berzelius:fat" and d["gpu"]["job_gpus"] == 1
    assert d["host"]["ram_gib"] == 250.0  # one fat GPU's share (the profile's node_sharing)
    # No term is unlabelled.
    for term in [*res_terms, *(t for p in lr["phases"].values() for t in p["transient"])]:
        assert term.endswith(("(derived)", "(fitted)", "(measured)")), term


def test_plan_memory_of_full_fine_tuning_by_hand():
    """lora_rank 0 on a bf16 base: every weight trains; gradients bf16 and torch AdamW's two moments like the
    weights (bf16); the reference is a second bf16 copy; the checkpoint is the weights and the moments."""
    res = hpcrl(
        "plan-memory",
        "--config",
        CONFIG,
        "--cluster",
        "berzelius",
        "--learner-gpus",
        "1",
        "--json",
        "--set",
        "lora_rank=0",
        "--set",
        "load_in_4bit=false",
        "--set",
        "reference=copy",
    )
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)["learner"]["resident"]
    got = [
        r[k]
        for k in (
            "policy base weights, bf16 (derived)",
            "policy gradients, bf16 (full fine-tuning) (derived)",
            "policy AdamW moments, bf16 like the weights (full fine-tuning) (derived)",
            "reference copy: base weights, bf16 (derived)",
        )
    ]
    assert got == pytest.approx([2 * PARAMS / GIB, 2 * PARAMS / GIB, 4 * PARAMS / GIB, 2 * PARAMS / GIB], abs=6e-4)


@pytest.mark.parametrize(
    "sets, message",
    [
        (("lora_rank=0",), "lora_rank 0 (full fine-tuning) trains the base weights, which a 4-bit base cannot"),
        (("lora_rank=0", "load_in_4bit=false"), "reference shared is the base with the adapters off"),
        (("lora_rank=-1",), "lora_rank -1: valid: a positive LoRA rank, or 0 for full fine-tuning"),
    ],
)
def test_full_fine_tuning_mistakes_are_one_line(sets, message):
    res = hpcrl("plan-memory", "--config", CONFIG, *(w for s in sets for w in ("--set", s)))
    assert res.returncode == 2 and message in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_plan_memory_refuses_the_users_first_attempts():
    """The notes' first settings (batch 64, 512 tokens) ran out of memory on an 80 GB GPU: so does the plan."""
    res = hpcrl(
        "plan-memory",
        "--config",
        CONFIG,
        "--cluster",
        "berzelius:fat",
        "--json",
        "--set",
        "rollout_batch_size=64",
        "--set",
        "mini_batch_size=64",
        "--set",
        "max_prompt_length=256",
    )
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["fits"] is False and "does NOT fit" in d["verdict"]
    res = hpcrl(
        "render",
        "--config",
        CONFIG,
        "--cluster",
        "berzelius:fat",
        "--set",
        "rollout_batch_size=64",
        "--set",
        "mini_batch_size=64",
        "--set",
        "max_prompt_length=256",
    )
    assert res.returncode == 2 and "does NOT fit" in res.stderr and res.stdout == ""


# --------------------------------------------------------------------------- the real local Slurm


def render_local(tmp_path: Path, *sets: str, gpus: int = 1, smoke: bool = False) -> tuple[Path, Path]:
    script = tmp_path / "custom.sbatch"
    given = dict(
        s.split("=", 1)
        for s in (
            f"hpcrl.run_root={tmp_path / 'runs'}",
            "hpcrl.run_name=custom1",
            'hpcrl.time="00:05:00"',
            "hpcrl.env_setup=[]",
            f"hpcrl.workdir={DATA}",
            "hpcrl.entry_point=custom_ppo_standin.py",
            f"hpcrl.python={sys.executable}",
            "save_steps=2",
            *sets,
        )
    )  # a test's own value replaces the default's
    args = [
        "render",
        "--config",
        str(REPO / CONFIG),
        "--cluster",
        "local-dev",
        "--gpus",
        str(gpus),
        *(a for k, v in given.items() for a in ("--set", f"{k}={v}")),
        "-o",
        str(script),
    ]
    if smoke:
        args.append("--smoke")
    res = hpcrl(*args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run_dir = tmp_path / "runs" / "custom1"
    (run_dir / "logs").mkdir(parents=True)  # as hpcrl submit does
    return script, run_dir


def events(run_dir: Path) -> list[list[str]]:
    return [ln.split("\t") for ln in (run_dir / "hpcrl" / "jobs.tsv").read_text().splitlines()]


ARGS = 'script_args=["--steps","5","--output_dir","{run_dir}/checkpoints"]'


def test_custom_job_runs_the_script_under_the_watchdog(tmp_path, run_sbatch_and_wait, leftovers):
    """One GPU of a local-dev node: Slurm gives the job one GPU, the script runs in the run directory
    under the watchdog without Ray, writes its checkpoints, and the report reads its reward."""
    script, run_dir = render_local(tmp_path, ARGS)
    job = run_sbatch_and_wait(script, 300)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "COMPLETED", log
    m = re.search(r"standin: CUDA_VISIBLE_DEVICES=(\S+) HPCRL_SAVE_STEPS=2", log)
    assert m and len(m.group(1).split(",")) == 1, log
    assert "standin: done" in log and "Ray" not in log.replace("no Ray", "")
    assert [e[1] for e in events(run_dir)] == ["start", "end"] and events(run_dir)[-1][3] == "completed:0"
    assert (run_dir / "checkpoints" / "latest").read_text() == "4\n"
    driver = (run_dir / "hpcrl" / "driver.log").read_text()
    assert driver.count('"avg_reward"') == 5
    report = hpcrl("report", str(run_dir), "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "avg_reward" in report.stdout
    assert leftovers(job.job_id) == []


def test_custom_job_nan_in_a_config_loss_key_trips_the_breaker(tmp_path, run_sbatch_and_wait, leftovers):
    """value_loss is not a loss key hpcrl knows; hpcrl.loss_keys names it, so its NaN stops the run (91)."""
    script, run_dir = render_local(
        tmp_path, 'script_args=["--steps","8","--output_dir","{run_dir}/checkpoints","--nan-at","3","--sleep","1"]'
    )
    job = run_sbatch_and_wait(script, 300)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert events(run_dir)[-1][3] == "breaker-nan-loss:91", log
    assert json.loads((run_dir / "hpcrl" / "breaker.json").read_text())["reason"] == "nan_loss"
    assert "standin: done" not in log
    assert leftovers(job.job_id) == []


def test_custom_smoke_sees_the_gpus_it_asked_for(tmp_path, run_sbatch_and_wait, leftovers):
    script, run_dir = render_local(tmp_path, ARGS, gpus=2, smoke=True)
    job = run_sbatch_and_wait(script, 300)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "COMPLETED", log
    assert re.search(r"hpcrl-smoke: ok nodes=1 gpus=2 cpus=2 framework=custom ray=none visible_gpus=\d,\d", log), log
    assert leftovers(job.job_id) == []


def test_custom_job_runs_a_module_entry_point(tmp_path, run_sbatch_and_wait, leftovers):
    """`hpcrl.entry_point: custom_ppo_standin` (no .py): the job runs `python -m custom_ppo_standin` in the
    workdir, as the user would, and it completes with its checkpoints."""
    script, run_dir = render_local(tmp_path, ARGS, "hpcrl.entry_point=custom_ppo_standin", "resume=marker")
    job = run_sbatch_and_wait(script, 300)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "COMPLETED" and "standin: done" in log, log
    assert (run_dir / "checkpoints" / "latest").read_text() == "4\n"
    assert leftovers(job.job_id) == []


def test_an_entry_point_neither_script_nor_module_is_one_line():
    res = hpcrl("render", "--config", CONFIG, "--set", "hpcrl.entry_point=finellama/ppo", cwd=REPO)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "'finellama/ppo'" in res.stderr, res.stderr
