"""The trl backend: its key tables against the TRL 1.16.0 release, config checking, the server/colocate plans and
the job's processes as plain data (no rendering), the DeepSpeed JSON, the checkpoint disk budget.

Expected values are read by hand from the release (file:line beside each) or worked by hand from the plan's
settings; none is computed with the code under test.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import lint

from hpcrl.errors import ConfigError, PlanError
from hpcrl.models import resolve_model
from hpcrl.planning.backends.trl_disk import budget
from hpcrl.planning.backends.trl_launch import deepspeed_config
from hpcrl.planning.config import load_run_config
from hpcrl.planning.disk_budget import DiskInputs
from hpcrl.planning.run_plan import make_run_plan

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "hpcrl/planning/backends/data/trl/1.16.0"
CONFIG = "trl-grpo-qwen2.5-7b"


def _table(name: str) -> dict:
    return {k: v for k, v in json.loads((DATA / name).read_text()).items() if not k.startswith("_")}


@pytest.mark.parametrize(
    "key,default,source",
    [
        ("vllm_mode", '"colocate"', "trl/trainer/grpo_config.py:594"),  # not server: the release's default
        ("use_vllm", "false", "trl/trainer/grpo_config.py:587"),
        ("num_generations", "8", "trl/trainer/grpo_config.py:480"),
        ("max_completion_length", "512", "trl/trainer/grpo_config.py:494"),
        ("beta", "0.0", "trl/trainer/grpo_config.py:681"),
        ("vllm_gpu_memory_utilization", "0.3", "trl/trainer/grpo_config.py:656"),
        ("logging_steps", "10", "trl/trainer/base_config.py:55"),
        ("gradient_checkpointing", "true", "trl/trainer/base_config.py:62"),
        ("save_total_limit", "null", "transformers/training_args.py:1183"),
        ("reward_funcs", "null", "trl/scripts/grpo.py:58"),
        ("use_peft", "false", "trl/trainer/model_config.py:103"),
    ],
)
def test_grpo_key_table_holds_the_release_facts(key, default, source):
    row = _table("grpo_args.json")[key]
    assert (row["default"], row["source"]) == (default, source)


@pytest.mark.parametrize(
    "key,default,source",
    [
        ("port", "8000", "trl/scripts/vllm_serve.py:107"),
        ("tensor_parallel_size", "1", "trl/scripts/vllm_serve.py:92"),
        ("gpu_memory_utilization", "0.9", "trl/scripts/vllm_serve.py:111"),
    ],
)
def test_vllm_serve_key_table_holds_the_release_facts(key, default, source):
    row = _table("vllm_serve_args.json")[key]
    assert (row["default"], row["source"]) == (default, source)


@pytest.mark.skipif(
    importlib.util.find_spec("trl") is None,
    reason="TRL is not installed here (the table was read from it by scripts/trl-table)",
)
def test_grpo_key_table_is_the_installed_releases_parser():
    import trl
    from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig
    from trl.scripts.grpo import GRPOScriptArguments

    if trl.__version__ != "1.16.0":
        pytest.skip(f"installed TRL is {trl.__version__}, the table is 1.16.0's")
    names = {
        f.name
        for c in (GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig)
        for f in dataclasses.fields(c)
        if f.init
    }
    assert names == set(_table("grpo_args.json"))


def test_the_shipped_config_loads_and_plans_server_mode_on_5_isambard_nodes():
    rp = make_run_plan(CONFIG, nodes=5)
    job = rp.backend.job(rp)
    # One node for trl vllm-serve, four for the learners; Isambard-AI plans one learner per node (its profile).
    assert dict(job.roles) == {0: "vllm-server", 1: "trainer", 2: "trainer", 3: "trainer", 4: "trainer"}
    server, trainer = job.processes
    assert server.argv[1:4] == ("-m", "trl.cli.main", "vllm-serve") and server.health.path == "/health"
    assert trainer.waits_for == ("vllm-server",) and "ray" not in " ".join(server.argv + trainer.argv).lower()
    assert any(
        "each learner node runs 1 of its 4 GPUs because isambard-ai plans at most 1 learner per node" in w
        for w in rp.warnings
    )


def test_the_server_gets_the_planned_tp_and_the_models_length():
    rp = make_run_plan(CONFIG, nodes=5)
    argv = rp.backend.job(rp).processes[0].argv
    words = dict(zip(argv[4::2], argv[5::2]))
    # TP 4 fills the server node's 4 GPUs (Qwen2.5-7B's 28 heads / 4 KV heads divide by 4); 5120 is the config's
    # vllm_serve.max_model_len; the port is one drawn for the job on the server node, not trl vllm-serve's fixed
    # default 8000 (vllm_serve.py:107), which another job of a shared node may hold.
    assert (
        words["--tensor_parallel_size"],
        words["--data_parallel_size"],
        words["--port"],
        words["--max_model_len"],
        words["--model"],
    ) == ("4", "1", "{port:server}", "5120", "Qwen/Qwen2.5-7B")


def test_the_trainer_is_an_accelerate_launch_over_the_learner_nodes():
    rp = make_run_plan(CONFIG, nodes=5)
    trainer = rp.backend.job(rp).processes[1]
    a = trainer.argv
    assert a[1:3] == ("-m", "accelerate.commands.launch")
    opts = dict(zip(a[3:15:2], a[4:16:2]))
    assert opts == {
        "--config_file": "$RUN_DIR/trl/accelerate.yaml",
        "--num_machines": "4",
        "--num_processes": "4",
        "--machine_rank": "{node_rank}",
        "--main_process_ip": "{host:trainer}",
        "--main_process_port": "{port:main}",
    }
    assert a[15:17] == ("--module", "trl.scripts.grpo")
    i = a.index("--vllm_server_host")
    assert a[i + 1] == "{host:vllm-server}" and a[a.index("--use_vllm") + 1] == "true"
    assert (
        a[a.index("--vllm_server_port") + 1] == "{port:server}"
        and a[a.index("--vllm_group_port") + 1] == "{port:group}"
    )
    assert trainer.nodes == (1, 2, 3, 4)


def test_colocate_on_4_nodes_has_no_server():
    rp = make_run_plan(CONFIG, nodes=4, sets=["vllm_mode=colocate"])
    job = rp.backend.job(rp)
    assert [p.role for p in job.processes] == ["trainer"] and dict(job.roles) == {i: "trainer" for i in range(4)}
    a = job.processes[0].argv
    # every GPU of the 4 nodes trains: 16 processes
    assert a[a.index("--num_processes") + 1] == "16" and "--vllm_tensor_parallel_size" in a
    assert "vllm-serve" not in a


def test_one_node_server_mode_splits_the_gpus():
    rp = make_run_plan(CONFIG, nodes=1, cluster="berzelius", sets=["vllm_serve.tensor_parallel_size=2"])
    server, trainer = rp.backend.job(rp).processes
    # Berzelius thin nodes have 8 A100s: the server takes GPUs 0-1 (TP 2), the learners some of the other six.
    assert dict(server.env)["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert dict(trainer.env)["CUDA_VISIBLE_DEVICES"].split(",")[0] == "2"


def test_deepspeed_json_offload_sections():
    zero = deepspeed_config("none")["zero_optimization"]
    assert zero == {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}
    opt = deepspeed_config("optimizer")
    assert opt["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "offload_param" not in opt["zero_optimization"] and opt["optimizer"]["type"] == "AdamW"
    assert "optimizer" not in deepspeed_config("none")


def test_resume_rule_names_the_complete_checkpoint():
    rp = make_run_plan(CONFIG, nodes=5)
    r = rp.backend.job(rp).processes[1].resume
    assert (r.flag, r.directory, r.pattern, r.complete_file) == (
        "--resume_from_checkpoint",
        "checkpoints",
        "checkpoint-*",
        "trainer_state.json",
    )


@pytest.mark.parametrize(
    "sets,needle",
    [
        (["vllm_modes=server"], "unknown trl grpo key (TRL 1.16.0) 'vllm_modes'; closest: vllm_mode"),
        (["vllm_mode=servers"], "vllm_mode 'servers': valid: server, colocate"),
        (["output_dir=/tmp/x"], "output_dir is set by hpcrl from the run directory"),
        (["vllm_server_host=n1"], "vllm_server_host is set by hpcrl"),
        (["vllm_serve.tensor_parallel_sizes=2"], "vllm_serve.tensor_parallel_sizes"),
        (["vllm_serve.port=9000"], "vllm_serve.port is set by hpcrl"),
        (["per_device_train_batch_size=two"], "per_device_train_batch_size: expected int"),
        (["reward_model_name_or_path=org/rm"], "a reward model runs on every learner GPU"),
        (["num_generations=1"], "num_generations 1: valid: 2 or more"),
    ],
)
def test_bad_config_values_are_one_line_errors(sets, needle):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcrl",
            "plan",
            "--config",
            CONFIG,
            "--nodes",
            "5",
            *[w for s in sets for w in ("--set", s)],
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr


def test_a_batch_trl_would_refuse_is_refused_with_its_numbers():
    # 3 per device x 4 learners x 4 steps per generation = 48 completions, not a multiple of 5 generations
    with pytest.raises(PlanError, match=r"= 48 completions per step, not divisible by num_generations 5"):
        make_run_plan(CONFIG, nodes=5, sets=["per_device_train_batch_size=3", "num_generations=5"])


@pytest.mark.parametrize(
    "nodes,sets,cluster",
    [
        (5, [], "isambard-ai"),
        (3, [], "isambard-ai"),
        (4, ["vllm_mode=colocate"], "isambard-ai"),
        (1, [], "berzelius"),
        (2, ["vllm_mode=colocate"], "berzelius"),
    ],
)
def test_both_modes_render_clean_scripts_without_ray(tmp_path, shellcheck, nodes, sets, cluster):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcrl",
            "render",
            "--config",
            CONFIG,
            "--nodes",
            str(nodes),
            "--cluster",
            cluster,
            *(a for s in sets for a in ("--set", s)),
            "-o",
            str(tmp_path / "s.sh"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "s.sh").read_text()
    lint(text, tmp_path, shellcheck)
    assert not re.search(r"^[^#\n]*\bray start\b", text, re.M) and "phase_readiness" not in text
    main = text[text.index("\nmain() {") :]
    server = "vllm_mode=colocate" not in sets
    assert ("phase_vllm_server" in main) == server and ("trl.cli.main" in text) == server
    assert "accelerate.commands.launch" in text and "trl.scripts.grpo" in text
    # No Ray, so a start that fails on the job's nodes is not named after it (start-failed, continued alike).
    assert 'ray-start-failed "' not in text and 'fail start-failed "' in text
    assert re.search(r"^ +[^\n]*\| start-failed \|[^\n]*\) kind=failure ", text, re.M)


def test_deepspeed_offload_is_refused_for_a_backend_with_its_own_key():
    with pytest.raises(ConfigError, match="hpcrl.deepspeed_offload is for a DeepSpeed config hpcrl writes"):
        load_run_config("openrlhf-grpo-qwen2.5-7b", ["hpcrl.deepspeed_offload=optimizer"])


def test_32b_on_isambard_plans_one_learner_per_node():
    # Qwen2.5-32B (untied, 32.8e9 params): 16 bytes/param of ZeRO-3 state over 15 learners = 35 GiB each
    rp = make_run_plan(CONFIG, nodes=16, sets=["model_name_or_path=Qwen/Qwen2.5-32B"])
    lay = rp.layout
    assert (lay.learners_per_node, lay.learner_nodes, lay.tp) == (1, 15, 4)
    assert {x.learners_per_node for x in rp.layouts} == {1}  # the profile's cap, not only the ranking's choice


def test_checkpoint_budget_by_hand():
    m = resolve_model("Qwen/Qwen2.5-7B")
    b = budget(DiskInputs(model=m, learners=4, lora_rank=0, total_steps=100, ckpt_every=25, keep=2))
    item = b.items[0]
    p = m.total_params
    # bf16 model 2P + DeepSpeed state 12P (fp32 master + Adam) + small per-rank files; 4 written, 3 at peak
    assert item.written == 4 and item.at_peak == 3
    assert 14 * p < item.one_bytes < 14 * p + 64 * 2**20
    only = budget(DiskInputs(model=m, learners=4, total_steps=100, ckpt_every=25, keep=2, disable_ds=True))
    assert 2 * p < only.items[0].one_bytes < 2 * p + 64 * 2**20


def test_stack_check_expects_the_releases_pins():
    from hpcrl.planning.backends.stack_expect import expectation

    e = expectation("trl")
    specs = {p["name"]: p["spec"] for p in e["packages"]}
    # trl-1.16.0.dist-info/METADATA:19, 22, 23, 32 and 35, 34 (the deepspeed extra), 61 (the vllm extra)
    assert e["python"]["spec"] == ">=3.11" and specs == {
        "trl": "",
        "accelerate": ">=1.10.1",
        "transformers": ">=4.56.2,!=5.1.0",
        "deepspeed": ">=0.18.6",
        "datasets": ">=4.7.0",
        "vllm": ">=0.22.0,<=0.31.0",
    }
    assert e["parser"]["entry"] == "trl.scripts.grpo"


def test_init_writes_the_trl_starter_and_plan_memory_answers_without_a_config(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "init", "--backend", "trl", "-o", str(tmp_path / "r.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and load_run_config(str(tmp_path / "r.yaml")).hpcrl.backend == "trl"
    mem = subprocess.run(
        [sys.executable, "-m", "hpcrl", "plan-memory", "--backend", "trl", "--model", "32b", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    learner = json.loads(mem.stdout)["learner"]
    assert mem.returncode == 0 and learner["logprob_impl"] == "fused_head" and learner["grad_accum_dtype"] == "bf16"
