"""Backends: verl and OpenRLHF renders (goldens, shell lint, only real keys and flags), the
colocated memory model against hand-computed terms, stub runs, step lines, bad input.

open-instruct's own goldens live in tests/test_render.py and must not change with the
backend interface. Regenerate the goldens here, after an intended change, with

    HPCRL_UPDATE_GOLDEN=1 python -m pytest tests/test_backends.py -k golden

The flag tables are read here straight from the JSON files (not through hpcrl), and the
rendered driver line is parsed back independently: Hydra-style `key=value` words for verl,
an argparse parser built from the table for OpenRLHF.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import yaml

from helpers import assert_golden, driver_words, expected_sbatch, lint, sbatch_options
from helpers import shipped_hpcrl as hpcrl
from stub_run import Stub

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "hpcrl" / "planning" / "backends" / "data"
VERL = "verl-grpo-qwen2.5-7b"
ORL = "openrlhf-grpo-qwen2.5-7b"
GIB = 1024**3


@pytest.fixture(autouse=True)
def _shipped_profiles_only(monkeypatch, tmp_path):
    monkeypatch.delenv("HPCRL_CLUSTERS_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)


def table(name: str) -> dict:
    return {k: v for k, v in json.loads((DATA / name).read_text()).items() if not k.startswith("_")}


def framework_args(text: str) -> list[str]:
    """The words after `"$PYTHON" -m "$ENTRY_POINT"` in the DRIVER array."""
    words = driver_words(text)
    i = words.index("--")
    assert words[i + 1 : i + 4] == ["$PYTHON", "-m", "$ENTRY_POINT"], words[i : i + 4]
    return words[i + 4 :]


# --------------------------------------------------------------------------- renders, goldens, lint

RENDERS = {
    f"isambard-ai__{VERL}__4": ["--config", f"configs/{VERL}.yaml", "--nodes", "4"],
    f"isambard-ai__{ORL}__4": ["--config", f"configs/{ORL}.yaml", "--nodes", "4"],
    "local-dev__verl-smoke__3": [
        "--config",
        VERL,
        "--cluster",
        "local-dev",
        "--nodes",
        "3",
        "--smoke",
        "--set",
        "hpcrl.run_root=/tmp/hpcrl-e2e",
        "--set",
        'hpcrl.time="00:05:00"',
    ],
    "local-dev__openrlhf-smoke__3": [
        "--config",
        ORL,
        "--cluster",
        "local-dev",
        "--nodes",
        "3",
        "--smoke",
        "--set",
        "hpcrl.run_root=/tmp/hpcrl-e2e",
        "--set",
        'hpcrl.time="00:05:00"',
    ],
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    out = {}
    for name, args in RENDERS.items():
        res = hpcrl("render", *args)
        assert res.returncode == 0, f"{name}: {res.stderr}"
        out[name] = res.stdout
    return out


# One full golden per backend; the smoke renders are checked on what differs (#SBATCH, driver line).
@pytest.mark.parametrize("name", [f"isambard-ai__{VERL}__4", f"isambard-ai__{ORL}__4"])
def test_golden(name, rendered):
    assert_golden(f"{name}.sh", rendered[name])


@pytest.mark.parametrize("name", list(RENDERS))
def test_bash_n_and_shellcheck(name, rendered, tmp_path, shellcheck):
    lint(rendered[name], tmp_path, shellcheck)


# --------------------------------------------------------------------------- verl: only real keys


def hydra_words(text: str) -> dict[str, str]:
    """key -> raw value of every `key=value` override (each key once: Hydra refuses duplicates)."""
    out: dict[str, str] = {}
    for word in framework_args(text):
        key, sep, value = word.partition("=")
        assert sep, f"not a key=value override: {word!r}"
        assert key not in out, f"{key} given twice"
        out[key] = value
    return out


def test_verl_uses_only_keys_of_its_config(rendered):
    keys = table("verl_args.json")
    words = hydra_words(rendered[f"isambard-ai__{VERL}__4"])
    unknown = [k for k in words if k.lstrip("+") not in keys]
    assert words and unknown == []
    assert words["trainer.nnodes"] == "4" and words["trainer.n_gpus_per_node"] == "4"
    assert words["trainer.default_local_dir"] == "$RUN_DIR/checkpoints" and words["trainer.resume_mode"] == "auto"
    assert words["actor_rollout_ref.rollout.name"] == "vllm"
    tp = int(words["actor_rollout_ref.rollout.tensor_model_parallel_size"])
    assert 4 % tp == 0 and 28 % tp == 0  # divides a node's GPUs and Qwen2.5-7B's 28 heads
    assert 0 < float(words["actor_rollout_ref.rollout.gpu_memory_utilization"]) <= 0.9
    micro = int(words["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"])
    assert (48 * 8 // 16) % micro == 0  # divides the per-GPU mini-batch (ppo_mini_batch_size x n / GPUs)
    assert words["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] == str(micro)
    assert words["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] == str(micro)  # use_kl_loss: a reference
    assert int(words["trainer.save_freq"]) >= 1 and words["trainer.max_actor_ckpt_to_keep"] == "2"
    assert words["data.train_files"] == "'${oc.env:HOME}/data/gsm8k/train.parquet'"  # Hydra-quoted
    assert words["trainer.logger"] == "[console]"


def test_verl_plan_is_one_colocated_layout_per_tp():
    out = hpcrl("plan", "--config", f"configs/{VERL}.yaml", "--nodes", "4", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["backend"] == "verl" and data["layouts"]
    tps = [lay["vllm_tensor_parallel_size"] for lay in data["layouts"]]
    # one layout per TP choice that fits beside the learner (1, 2 or 4 divide a node's GPUs); the placement is the same
    assert tps and len(set(tps)) == len(tps) and set(tps) <= {1, 2, 4}
    for lay in data["layouts"]:
        assert lay["colocated"] is True and lay["idle_gpus"] == 0
        assert lay["learner_gpus"] == lay["engine_gpus"] == 16  # every GPU does both
        assert lay["step_time_s"] == pytest.approx(lay["generation_time_s"] + lay["training_time_s"], abs=0.11)
        assert lay["rollout_peak_gib"] <= lay["gpu_usable_gib"] * 0.97
    assert data["backend_args"]["actor_rollout_ref.rollout.tensor_model_parallel_size"] == tps[0]


def test_verl_pins_are_kept_and_mismatches_refused():
    out = hpcrl(
        "plan",
        "--config",
        VERL,
        "--nodes",
        "4",
        "--json",
        "--pin",
        "tp=4",
        "--set",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
    )
    assert out.returncode == 0, out.stderr
    first = json.loads(out.stdout)["layouts"][0]
    assert (first["vllm_tensor_parallel_size"], first["vllm_gpu_memory_utilization"]) == (4, 0.5)
    out = hpcrl("render", "--config", VERL, "--nodes", "4", "--set", "trainer.nnodes=2")
    assert out.returncode == 2 and "trainer.nnodes 2 is pinned" in out.stderr


def test_verl_offloads_only_when_nothing_fits_without():
    """verl's offload moves training state to host RAM between phases, so it only ever helps
    the rollout. Pinned at 0.9 x 95.58 GiB, vLLM does not fit next to the resident 7B state
    (14 bytes/param over 16 GPUs: 6.2 GiB, plus 1 GiB of context) within the 3% headroom;
    with the optimizer state offloaded (8 of those 14 bytes) it does."""
    gpu, p = 95.58 * GIB, 7_615_616_512
    assert 14 * p / 16 + GIB + 0.9 * gpu > 0.97 * gpu >= 6 * p / 16 + GIB + 0.9 * gpu
    pinned = hpcrl("plan", "--config", VERL, "--nodes", "4", "--json", "--pin", "util=0.9")
    free = hpcrl("plan", "--config", VERL, "--nodes", "4", "--json")
    assert pinned.returncode == 0 and free.returncode == 0, pinned.stderr + free.stderr
    a_pinned, a_free = json.loads(pinned.stdout)["backend_args"], json.loads(free.stdout)["backend_args"]
    assert a_free["actor_rollout_ref.actor.fsdp_config.param_offload"] is False
    assert a_free["actor_rollout_ref.actor.fsdp_config.optimizer_offload"] is False
    assert a_pinned["actor_rollout_ref.actor.fsdp_config.param_offload"] is False
    assert a_pinned["actor_rollout_ref.actor.fsdp_config.optimizer_offload"] is True
    assert a_pinned["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.9


# --------------------------------------------------------------------------- OpenRLHF: only real flags


def openrlhf_parser() -> argparse.ArgumentParser:
    """train_ppo_ray's parser rebuilt from the table (names, actions, nargs, types, choices)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    types = {"int": int, "float": float, "str": str}
    for name, meta in table("openrlhf_args.json").items():
        kw: dict = {"dest": meta.get("dest", name)}
        if meta["action"] in ("store_true", "store_false"):
            kw["action"] = meta["action"]
        else:
            elem = meta.get("element_type", meta["type"])
            kw["type"] = types.get(elem, str)
            if meta["type"] == "list":
                kw["nargs"] = meta.get("nargs")
            if meta.get("choices"):
                kw["choices"] = meta["choices"]
        p.add_argument(f"--{name}", **kw)
    return p


def test_openrlhf_uses_only_its_flags(rendered):
    args = framework_args(rendered[f"isambard-ai__{ORL}__4"])
    flags = [w[2:] for w in args if w.startswith("--")]
    assert len(flags) == len(set(flags))
    ns = vars(openrlhf_parser().parse_args(args))  # raises on an unknown flag or a bad value
    assert ns["ds.zero_stage"] == 3 and ns["ckpt.load_enable"] is True
    assert ns["ckpt.path"] == "$RUN_DIR/checkpoints" and ns["ckpt.output_dir"] == "$RUN_DIR/output"
    assert ns["actor.num_gpus_per_node"] == 4  # whole nodes: OpenRLHF packs the actor's bundles
    actor = ns["actor.num_nodes"] * ns["actor.num_gpus_per_node"]
    assert actor + ns["vllm.num_engines"] * ns["vllm.tensor_parallel_size"] == 16
    # algo.kl.init_coef > 0: a reference model, on the actor's GPUs
    assert ns["train.colocate_actor_ref"] is True
    assert (ns["ref.num_nodes"], ns["ref.num_gpus_per_node"]) == (ns["actor.num_nodes"], ns["actor.num_gpus_per_node"])
    assert ns["ckpt.max_num"] == 3 and ns["ckpt.disable_ds"] is False  # 200 TiB quota: DeepSpeed state fits
    assert ns["ckpt.save_steps"] >= 1
    old = set(json.loads((DATA / "openrlhf_args.json").read_text())["_meta"]["renamed_from"])
    assert not {f for f in flags if f in old}


def tight_quota_profile(tmp_path: Path, quota_gib: int) -> Path:
    text = (REPO / "clusters" / "isambard-ai.yaml").read_text()
    assert "quota_gib: 204800" in text
    path = tmp_path / "isambard-small.yaml"
    path.write_text(text.replace("quota_gib: 204800", f"quota_gib: {quota_gib}"))
    return path


def test_openrlhf_checkpoints_follow_the_disk_plan(tmp_path):
    """Three ZeRO-3 states of the 7B actor (12 B/param) do not fit 200 GiB. HF saves instead would be 14 GiB each,
    never deleted, one every planned interval for 11 jobs of 24 h: hpcrl does not switch to them (its own disk
    check would refuse that); the run is refused naming what fits. The HF model cache ($PROJECTDIR/hf, beside the
    run root) counts against the same quota."""
    p = 7_615_616_512  # Qwen2.5-7B parameters
    state = 12 * p  # fp32 master + Adam moments, all ranks (plus small per-rank files)
    hf = 2 * p + 20 * 1024**2
    cache = 2 * p  # bf16 safetensors in the HF cache
    assert 3 * state + hf + cache > 200 * GIB > 2 * hf + cache
    out = hpcrl("render", "--config", ORL, "--nodes", "4", "--cluster-file", str(tight_quota_profile(tmp_path, 200)))
    assert out.returncode == 2 and "quota is 200 GiB" in out.stderr and "--set ckpt.disable_ds=true" in out.stderr
    assert "rendering --ckpt.disable_ds" not in out.stderr
    roomy = hpcrl(
        "render",
        "--config",
        ORL,
        "--nodes",
        "4",
        "--cluster-file",
        str(tight_quota_profile(tmp_path, int((3 * state + hf + cache) / GIB) + 1)),
    )
    ns = vars(openrlhf_parser().parse_args(framework_args(roomy.stdout)))
    assert ns["ckpt.disable_ds"] is False and ns["ckpt.max_num"] == 3


def test_openrlhf_switches_to_hf_saves_only_when_every_one_fits(tmp_path):
    """A LoRA actor's adapter saves are small: with a save every 50 steps the whole run's adapters fit 40 GiB where
    three DeepSpeed states (the frozen 7B base in each) do not, so hpcrl renders HF saves and says how many."""
    # Qwen2.5-7B; LoRA r=16 on every linear of its 28 layers: 16 x (2 x 7168 + 2 x 4096 + 3 x 22528) x 28
    p, lora16 = 7_615_616_512, 40_370_176
    assert 3 * 2 * p > 40 * GIB
    out = hpcrl(
        "render",
        "--config",
        ORL,
        "--nodes",
        "4",
        "--cluster-file",
        str(tight_quota_profile(tmp_path, 40)),
        "--set",
        "ds.lora.rank=16",
        "--set",
        "ckpt.save_steps=50",
    )
    assert out.returncode == 0, out.stderr
    ns = vars(openrlhf_parser().parse_args(framework_args(out.stdout)))
    assert ns["ckpt.disable_ds"] is True and ns["ckpt.save_hf"] is True
    saves, peak = re.search(
        r"never deletes HF saves \([\d.]+ GiB each, ([\d,]+) over its time limits: ([\d,]+) GiB "
        r"at peak, inside the quota\)",
        out.stderr,
    ).groups()
    adapter_gib = (2 * lora16 + 20 * 1024**2) / GIB
    assert int(peak.replace(",", "")) <= 40 and (int(saves) + 1) * adapter_gib + 2 * p / GIB <= 40


def test_openrlhf_colocate_all_is_planned_colocated():
    out = hpcrl(
        "render",
        "--config",
        ORL,
        "--nodes",
        "4",
        "--set",
        "train.colocate_all=true",
        "--set",
        "ds.enable_sleep=true",
        "--set",
        "vllm.enable_sleep=true",
    )
    assert out.returncode == 0, out.stderr
    ns = vars(openrlhf_parser().parse_args(framework_args(out.stdout)))
    assert ns["train.colocate_all"] and ns["actor.num_nodes"] * ns["actor.num_gpus_per_node"] == 16
    assert ns["vllm.num_engines"] * ns["vllm.tensor_parallel_size"] == 16  # OpenRLHF asserts this equality
    assert "all 16 GPUs train and generate (colocated)" in out.stdout


# --------------------------------------------------------------------------- colocated memory by hand


def test_colocated_plan_memory_equals_hand_computed_terms():
    """verl b178a3cd on Isambard-AI: 16 GPUs each train and generate, Qwen2.5-7B, TP 2, utilisation 0.6."""
    out = hpcrl(
        "plan-memory",
        "--backend",
        "verl",
        "--model",
        "qwen2.5-7b",
        "--cluster",
        "isambard-ai",
        "--learner-gpus",
        "16",
        "--tokens-per-gpu",
        "8192",
        "--vllm-tp",
        "2",
        "--vllm-gpu-memory-utilization",
        "0.6",
        "--max-seq-len",
        "5120",
        "--framework-version",
        "b178a3cd",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    p, n = 7_615_616_512, 16  # Qwen2.5-7B parameters (config.json shapes), GPUs
    gpu = yaml.safe_load((REPO / "clusters" / "isambard-ai.yaml").read_text())["gpu"]["memory_gib"] * GIB
    learner = d["learner"]["breakdown"]
    # verl's FSDP1 actor over all 16 GPUs (hpcrl/memory/fsdp_learner.py), peak at the logits moment with
    # the assumed 2 micro-batches: fp32 flat shards, Adam, the first micro-batch's fp32 gradients,
    # 8 B per T x V logits element, the root unit (embedding + lm_head, 152,064 x 3,584 each) gathered in bf16.
    v, h, t = 152_064, 3_584, 8_192
    expect = {
        "fp32 parameter shards": 4 * p / n,
        "Adam moments (fp32)": 8 * p / n,
        "gradients of earlier micro-batches": 4 * p / n,
        "log-prob path (8 B x T x V)": 8 * t * v,
        "gathered root unit (bf16)": 2 * 2 * v * h,
    }
    for term, value in expect.items():
        assert learner[term] == pytest.approx(value / GIB, abs=0.002), term
    c = d["colocated"]
    # Rollout: the training side's fp32 shards and optimizer stay (verl frees gradients), its CUDA
    # context (0.6 GiB) and NCCL buffers (0.4 GiB), and vLLM's 0.6 x GPU.
    rollout = {
        "training parameters": 4 * p / n,
        "optimizer state": 8 * p / n,
        "gradients": 0.0,
        "reference policy": 0.0,
        "learner CUDA context + NCCL": 1.0 * GIB,
        "vLLM (gpu_memory_utilization x GPU)": 0.6 * gpu,
    }
    for term, value in rollout.items():
        assert c["rollout_breakdown"][term] == pytest.approx(value / GIB, abs=0.002), term
    assert c["rollout_gib"] == pytest.approx(sum(rollout.values()) / GIB, abs=0.005)
    # Training: the learner's whole peak, and vLLM asleep: CUDA context 0.6 + NCCL 0.4 (TP 2) + graphs 1.0 GiB.
    assert c["training_breakdown"]["vLLM asleep (CUDA context, CUDA graphs)"] == pytest.approx(2.0, abs=0.001)
    assert c["training_gib"] == pytest.approx(d["learner"]["device_total_gib"] + 2.0, abs=0.002)
    assert c["rollout_fits"] is (sum(rollout.values()) <= 0.97 * gpu)
    # Host: verl's hybrid vLLM sleeps at level 2 (vllm_async_server.py:569 at b178a3cd): its weights are
    # discarded, not kept in host RAM.
    assert not any("vLLM weights" in term for term in d["host"]["breakdown"]) and c["vllm_sleep_level"] == 2
    assert d["fits"] is (c["training_fits"] and c["rollout_fits"] and d["engine"]["fits"] and d["host"]["fits"])


def test_rollout_offload_moves_state_to_host():
    base = [
        "plan-memory",
        "--backend",
        "verl",
        "--model",
        "qwen2.5-7b",
        "--cluster",
        "isambard-ai",
        "--learner-gpus",
        "16",
        "--vllm-tp",
        "2",
        "--json",
    ]
    plain = json.loads(hpcrl(*base).stdout)["colocated"]
    off = json.loads(hpcrl(*base, "--rollout-offload", "all").stdout)
    assert off["colocated"]["rollout_breakdown"]["training parameters"] == 0.0
    assert off["colocated"]["rollout_breakdown"]["optimizer state"] == 0.0
    assert off["colocated"]["rollout_gib"] < plain["rollout_gib"]
    moved = plain["rollout_breakdown"]["training parameters"] + plain["rollout_breakdown"]["optimizer state"]
    assert off["host"]["breakdown"]["training state offloaded during rollout"] == pytest.approx(4 * moved, abs=0.05)


# --------------------------------------------------------------------------- stub runs


def test_verl_stub_run_passes_the_overrides(tmp_path):
    stub = Stub(tmp_path, nodes=2)
    rc, out = stub.run(stub.render(REPO / "configs" / f"{VERL}.yaml", sets=["hpcrl.run_name=v1"]))
    assert rc == 0, out
    argv = stub.argv("driver.argv")
    args = argv[argv.index("--") + 1 :]
    assert args[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    assert f"trainer.default_local_dir={tmp_path}/runs/v1/checkpoints" in args
    assert "trainer.nnodes=2" in args and "trainer.n_gpus_per_node=4" in args
    assert "data.train_files='${oc.env:HOME}/data/gsm8k/train.parquet'" in args
    assert stub.env("driver.env")["HYDRA_FULL_ERROR"] == "1"


def test_verl_refuses_a_run_dir_hydra_cannot_carry(tmp_path):
    stub = Stub(tmp_path, nodes=2)
    rc, out = stub.run(stub.render(REPO / "configs" / f"{VERL}.yaml", sets=['hpcrl.run_name="a b"']))
    assert rc == 1 and "has characters a Hydra override cannot carry" in out
    assert not (stub.out / "driver.argv").exists()


def test_openrlhf_stub_run_passes_the_flags(tmp_path):
    stub = Stub(tmp_path, nodes=2)
    rc, out = stub.run(stub.render(REPO / "configs" / f"{ORL}.yaml", sets=["hpcrl.run_name=o1"]))
    assert rc == 0, out
    argv = stub.argv("driver.argv")
    args = argv[argv.index("--") + 1 :]
    assert args[:3] == ["python3", "-m", "openrlhf.cli.train_ppo_ray"]
    ns = vars(openrlhf_parser().parse_args(args[3:]))
    assert ns["ckpt.path"] == f"{tmp_path}/runs/o1/checkpoints" and ns["actor.num_gpus_per_node"] == 4


@pytest.mark.parametrize("name,config", [("local-dev__verl-smoke__3", VERL), ("local-dev__openrlhf-smoke__3", ORL)])
def test_smoke_sbatch_options(name, config, rendered):
    want = expected_sbatch("local-dev", config, 3, f"/tmp/hpcrl-e2e/{config}/logs/slurm-%j.out")
    assert sbatch_options(rendered[name])[0] == [o.replace("--time=01:00:00", "--time=00:05:00") for o in want]


def test_smoke_lines_name_the_framework(rendered):
    verl = driver_words(rendered["local-dev__verl-smoke__3"])
    orl = driver_words(rendered["local-dev__openrlhf-smoke__3"])
    assert verl[verl.index("--framework") + 1] == "verl" and "--colocated" in verl
    assert verl[verl.index("--learners") + 1] == "4 4 4"
    assert orl[orl.index("--framework") + 1] == "openrlhf" and "--colocated" not in orl


# --------------------------------------------------------------------------- the watchdog reads their steps


def test_step_lines_of_verl_and_openrlhf():
    from hpcrl.logs.driver_log import StepParser
    from hpcrl.logs.log_format import union_format

    p = StepParser(union_format())  # one parser reads both (a log whose framework is not known)
    verl = p.feed("(TaskRunner pid=7) step:12 - actor/pg_loss:0.25 - critic/score/mean:0.0 - timing_s/gen:3.5")
    assert (verl.number, verl.reward_key, verl.reward_is_exactly_zero()) == (12, "critic/score/mean", True)
    orl = p.feed("✨ Global step 3: {'policy_loss': nan, 'reward': 0.5, 'kl': 0.001}")
    assert (orl.number, orl.reward_key, orl.bad_losses()) == (
        3,
        "reward",
        {"policy_loss": pytest.approx(float("nan"), nan_ok=True)},
    )
    assert p.feed("step:1 - unrelated:1") is None


# --------------------------------------------------------------------------- bad input: one line, exit 2

BAD = [
    (["--config", VERL, "--set", "hpcrl.backend=verll"], "unknown backend 'verll'; closest: verl"),
    (
        ["--config", VERL, "--set", "actor_rollout_ref.rollout.tensor_model_parallel_sizes=2"],
        "unknown verl key 'actor_rollout_ref.rollout.tensor_model_parallel_sizes'; closest: "
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
    ),
    (
        ["--config", ORL, "--set", "vllm.num_engine=2"],
        "unknown OpenRLHF flag 'vllm.num_engine'; closest: vllm.num_engines",
    ),
    # The layout planner's refusal names OpenRLHF's key (Qwen2.5-7B's 28 heads), not open-instruct's.
    (["--config", ORL, "--pin", "tp=3"], "vllm.tensor_parallel_size 3 cannot work: it does not divide the 28"),
    (["--config", ORL, "--set", "zero_stage=3"], "unknown OpenRLHF flag 'zero_stage': renamed to ds.zero_stage"),
    (["--config", ORL, "--set", "disable_ds_ckpt=true"], "renamed to ckpt.disable_ds"),
    (["--config", VERL, "--set", "trainer.default_local_dir=/x"], "trainer.default_local_dir is set by hpcrl"),
    (["--config", ORL, "--set", "ckpt.path=/x"], "ckpt.path is set by hpcrl"),
    (["--config", ORL, "--set", "algo.advantage.estimator=gae"], "needs a critic model"),
    (["--config", ORL, "--set", "algo.advantage.estimator=bogus"], "'bogus' is not one of"),
    (["--config", ORL, "--set", "actor.adam.lr=fast"], "actor.adam.lr: expected float, got 'fast'"),
    (["--config", ORL, "--set", "reward.clip_range=[-1]"], "reward.clip_range takes 2 values"),
    (["--config", VERL, "--set", "actor_rollout_ref.rollout.name=sglang"], "hpcrl plans vLLM rollouts"),
    (["--config", VERL, "--set", "trainer.nnodes=x"], "trainer.nnodes: expected int"),
    (["--config", VERL, "--set", "data.max_response_length=${data.max_prompt_length}"], "give a literal here"),
    (["--config", VERL, "--pin", "learners=2"], "not a choice of this backend's layout"),
    (["--config", VERL, "--set", "data.train_batch_size=101"], "must divide over the job's 16 GPUs"),
    (["--config", VERL, "--set", "hpcrl.arg_layout=legacy"], "hpcrl.arg_layout is open-instruct's"),
    (["--config", VERL, "--set", "hpcrl.entry_point=main_ppo.py"], "backend verl runs a module (python -m)"),
    (["--config", ORL, "--set", "reward.remote_url=null"], "hpcrl plans no reward-model GPUs"),
    (["--config", VERL, "--set", "algorithm.adv_estimator=gae"], "trains a critic, which hpcrl does not plan"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_input_one_line_exit_2(args, message, tmp_path):
    out_file = tmp_path / "job.sbatch"
    out = hpcrl("render", "--nodes", "4", *args, "-o", str(out_file))
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcrl: error: ") and message in lines[0], out.stderr
    assert out.stdout == "" and not out_file.exists()


def test_nested_yaml_is_flattened_and_checked(tmp_path):
    cfg = yaml.safe_load((REPO / "configs" / f"{VERL}.yaml").read_text())
    flat = {k: v for k, v in cfg.items() if not k.startswith("trainer.")}
    flat["trainer"] = {k.split(".", 1)[1]: v for k, v in cfg.items() if k.startswith("trainer.")}
    path = tmp_path / "nested.yaml"
    path.write_text(yaml.safe_dump(flat, sort_keys=False))
    nested = hpcrl("render", "--config", str(path), "--nodes", "4")
    plain = hpcrl("render", "--config", f"configs/{VERL}.yaml", "--nodes", "4")
    assert nested.returncode == 0, nested.stderr

    def strip(text: str) -> str:
        return re.sub(r'(config: |"config": ).*\n', "", text)

    assert strip(nested.stdout) == strip(plain.stdout)
    flat["trainer"]["n_gpus_per_nod"] = 4
    path.write_text(yaml.safe_dump(flat, sort_keys=False))
    bad = hpcrl("render", "--config", str(path), "--nodes", "4")
    assert bad.returncode == 2 and "closest: trainer.n_gpus_per_node" in bad.stderr
