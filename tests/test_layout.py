"""Layout planner: open-instruct's placement rules, memory fit, ranking, CLI contract."""

from __future__ import annotations

import json
from pathlib import Path
import re
import subprocess
import sys

import pytest

from helpers import assert_user_error, driver_words

from hpcrl.errors import HpcrlError, PlanError
from hpcrl.models import resolve_model
from hpcrl.planning.layout import Pins, Workload, enumerate_layouts
from hpcrl.planning.run_plan import make_run_plan
from hpcrl.profiles import load_profile


def hpcrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, timeout=120)


def plan_warnings(*args: str) -> str:
    """`hpcrl plan ARGS`'s stderr (it must succeed), with Rich's line wrapping undone."""
    out = hpcrl("plan", *args)
    assert out.returncode == 0, out.stderr
    return " ".join(out.stderr.split())


def test_plan_16_nodes_default_is_one_learner_per_node():
    out = hpcrl("plan", "--nodes", "16", "--json")
    assert out.returncode == 0, out.stderr
    first = json.loads(out.stdout)["layouts"][0]
    assert first["num_learners_per_node"] == [1] * 16
    assert first["idle_gpus"] == 0
    assert first["learner_gpus"] + first["engine_gpus"] == 64
    assert first["learner_peak_gib"] > 0 and first["engine_kv_cache_gib"] > 0


def test_plan_table_has_memory_and_reasons():
    out = hpcrl("plan", "--nodes", "16")
    assert out.returncode == 0, out.stderr
    assert "[1] x 16" in out.stdout
    assert "no idle GPU" in out.stdout
    assert "QOS" in out.stderr  # 64 GPUs exceed Isambard-AI's default 32-GPU project cap: a warning


def test_plan_berzelius_json_uses_open_instruct_names():
    out = hpcrl("plan", "--cluster", "berzelius", "--nodes", "2", "--model", "7b", "--json")
    assert out.returncode == 0, out.stderr
    lay = json.loads(out.stdout)["layouts"][0]
    for key in (
        "num_learners_per_node",
        "vllm_num_engines",
        "vllm_tensor_parallel_size",
        "vllm_gpu_memory_utilization",
        "deepspeed_stage",
    ):
        assert key in lay
    assert sum(lay["num_learners_per_node"]) + lay["vllm_num_engines"] * lay["vllm_tensor_parallel_size"] <= 16


def _documented_fields(section_start: str) -> set[str]:
    """Field names in the first column of the table that follows `section_start` in docs/plan.md."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "plan.md").read_text()
    rest = text[text.index(section_start) :]
    table = rest[rest.index("| field |") :]
    rows = table[: table.index("\n\n")].splitlines()[2:]
    return {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}


def test_plan_json_is_what_docs_plan_md_says():
    """Every key of `plan --json` is documented in docs/plan.md, and every documented key exists
    (the colocated and backend-only ones on a verl config)."""
    top = _documented_fields("## `--json`")
    per_layout = _documented_fields("Each layout:")
    seen_top, seen_layout = set(), set()
    for args in (
        ("--cluster", "berzelius", "--nodes", "2", "--model", "7b"),
        ("--config", "configs/verl-grpo-qwen2.5-7b.yaml", "--nodes", "4"),
    ):
        out = hpcrl("plan", *args, "--json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        seen_top |= set(doc)
        for lay in doc["layouts"]:
            seen_layout |= set(lay)
    assert seen_top == top
    assert seen_layout == per_layout


@pytest.mark.parametrize("command", ["plan", "render"])
def test_zero_nodes_is_an_error_not_the_default(command, tmp_path):
    """--nodes 0 once fell through to the config's 16 nodes and exited 0."""
    out_file = tmp_path / "job.sbatch"
    extra = ["-o", str(out_file)] if command == "render" else []
    out = hpcrl(command, "--nodes", "0", *extra)
    assert out.returncode == 2 and out.stderr == "hpcrl: error: --nodes must be at least 1, got 0\n"
    assert not out_file.exists()
    out = hpcrl(command, "--set", "hpcrl.nodes=0", *extra)
    assert out.returncode == 2 and out.stderr == "hpcrl: error: --set hpcrl.nodes: Input should be greater than 0\n"
    assert not out_file.exists()


def test_planner_sets_gather_whole_model_where_the_whole_model_does_not_fit(tmp_path):
    """32B: 60 GiB of bf16 weights gathered plus rank 0's 60 GiB copy cannot sit beside the
    learner's state on a 95.6 GiB GH200, so the plan and the script say gather_whole_model False;
    a 7B learner on 80 GB A100s has room, and keeps open-instruct's default True."""
    big = json.loads(hpcrl("plan", "--nodes", "16", "--json").stdout)["layouts"][0]
    assert big["gather_whole_model"] is False
    script = tmp_path / "job.sbatch"
    assert hpcrl("render", "--nodes", "16", "-o", str(script)).returncode == 0
    words = driver_words(script.read_text())
    assert words[words.index("--gather_whole_model") + 1] == "False"
    small = json.loads(
        hpcrl("plan", "--nodes", "4", "--config", "grpo-olmo3-7b", "--cluster", "berzelius:fat", "--json").stdout
    )["layouts"][0]
    assert small["gather_whole_model"] is True


def test_a_pinned_whole_model_gather_that_cannot_fit_names_the_fix():
    out = hpcrl("plan", "--nodes", "16", "--set", "gather_whole_model=true")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.strip().endswith(
        "would fit: --set gather_whole_model=false (weight sync one parameter at a time)"
    )
    fixed = hpcrl("plan", "--nodes", "16", "--set", "gather_whole_model=false", "--json")
    assert fixed.returncode == 0 and json.loads(fixed.stdout)["layouts"][0]["gather_whole_model"] is False


def test_a_tp_vllm_cannot_shard_is_never_planned_and_refused_when_pinned():
    """8-GPU nodes allowed TP 5 for OLMo 3 32B (5 divides its 40 heads but not its 8 KV heads:
    vLLM's engine would fail to start)."""
    out = hpcrl("plan", "--cluster", "berzelius-hopper", "--nodes", "2", "--top", "50", "--json")
    assert out.returncode == 0, out.stderr
    assert {lay["vllm_tensor_parallel_size"] for lay in json.loads(out.stdout)["layouts"]} <= {1, 2, 4, 8}
    pinned = hpcrl("plan", "--cluster", "berzelius-hopper", "--nodes", "2", "--pin", "tp=5")
    assert pinned.returncode == 2 and pinned.stderr == (
        "hpcrl: error: vllm_tensor_parallel_size 5 cannot work: it neither divides the 8 KV heads nor is a "
        "multiple of them; valid: [1, 2, 4, 8]\n"
    )


def test_engines_past_the_prompts_in_flight_are_not_planned_and_a_pinned_count_is_warned():
    """grpo_fast.py sends each prompt with all its samples to one engine and keeps async_steps steps of prompts in
    flight (data_loader.py:1390 at e6c3044; its own warning says the engines then serve several batches): the
    default run's 32 prompts x async_steps 8 keep its 48 engines busy, so nothing is said. With 8 prompts and
    async_steps 1 the planner plans at most 8 engines; 40 pinned are the user's, and warned about."""
    assert "engines" not in plan_warnings("--nodes", "16").split("QOS")[-1]
    few = ("--nodes", "16", "--set", "num_unique_prompts_rollout=8", "--set", "async_steps=1")
    out = hpcrl("plan", *few, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert max(lay["vllm_num_engines"] for lay in data["layouts"]) <= 8
    assert not any("vllm_num_engines" in w for w in data["warnings"])
    assert (
        "vllm_num_engines 40 is more than the 8 prompts in flight (num_unique_prompts_rollout 8 x async_steps 1)"
        in plan_warnings(*few, "--pin", "engines=40")
    )


def test_berzelius_idle_gpu_rule_risk_is_a_warning():
    """7B on one thin node: generation (KV pool of a 40 GB A100) dwarfs training, so the learners'
    share of a step is far under the quarter that keeps an A100 above Berzelius's 100 W rule; the
    warning's share is its own training / step figures. 32B on 16 nodes does not warn."""
    out = plan_warnings("--cluster", "berzelius", "--nodes", "1", "--model", "7b")
    m = re.search(
        r"warning: berzelius cancels jobs whose GPUs average under 100 W after 60 min: by the step "
        r"estimate the learner GPUs work (\d+)% of each step \(training (\d+) s of (\d+) s\)",
        out,
    )
    assert m, out
    share, training, step = (int(g) for g in m.groups())
    assert share == round(100 * training / step) and share < 25
    assert "cancels jobs" not in plan_warnings("--cluster", "berzelius", "--nodes", "16")


def test_a_container_across_isambard_nodes_names_what_it_needs():
    assert (
        "warning: isambard-ai: a container across nodes must use the host's NCCL and libfabric: load "
        "brics/apptainer-multi-node"
    ) in plan_warnings("--nodes", "16", "--set", "hpcrl.container=/images/oi.sif")
    assert "libfabric" not in plan_warnings("--nodes", "16")


def test_72b_on_one_thin_node_fails_with_computed_suggestion():
    out = hpcrl("plan", "--cluster", "berzelius", "--nodes", "1", "--model", "72b")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "would fit:" in out.stderr and "--nodes" in out.stderr


def test_every_suggestion_really_fits():
    out = hpcrl("plan", "--cluster", "berzelius", "--nodes", "1", "--model", "72b")
    assert out.returncode == 2
    suggestions = out.stderr.split("would fit: ")[1].strip().split(" | ")
    assert suggestions
    for sug in suggestions:
        args = sug.split(" (")[0].split()
        if "--nodes" not in args:
            args += ["--nodes", "1"]
        if "--cluster" not in args:
            args += ["--cluster", "berzelius"]
        ok = hpcrl("plan", "--model", "72b", "--allow-over-limit", *args)
        assert ok.returncode == 0, (sug, ok.stderr)


def test_engine_tp_stays_inside_a_node_and_divides_heads():
    prof = load_profile("isambard-ai")
    layouts, _ = enumerate_layouts(prof, 16, Workload(model=resolve_model("32b")))
    assert layouts
    for lay in layouts:
        assert lay.tp <= 4 and 40 % lay.tp == 0  # OLMo 3 32B has 40 heads, 4 GPUs per node
        free_per_learner_node = 4 - lay.learners_per_node
        capacity = lay.learner_nodes * (free_per_learner_node // lay.tp) + (16 - lay.learner_nodes) * (4 // lay.tp)
        assert lay.engines <= capacity
        assert len(lay.to_dict()["num_learners_per_node"]) <= 16  # one bundle per node


def test_isambard_plans_one_learner_per_node_unless_pinned():
    """The profile's cap (two learners per GH200 node failed with NCCL "Duplicate GPU detected"
    in the users' runs): never planned above it; a pin goes above it with a warning that says why."""
    prof = load_profile("isambard-ai")
    assert prof.planning.max_learners_per_node == 1
    layouts, _ = enumerate_layouts(prof, 16, Workload(model=resolve_model("32b")))
    assert layouts and {lay.learners_per_node for lay in layouts} == {1}
    out = hpcrl("plan", "--nodes", "16", "--pin", "learners=2")
    assert out.returncode == 0, out.stderr
    assert (
        "warning: 2 learners per node on isambard-ai, where the profile plans at most 1: more than one "
        'learner per GH200 node failed with NCCL "Duplicate GPU detected"'
    ) in " ".join(out.stderr.split())
    assert "[2] x" in out.stdout


def test_a_much_faster_layout_is_not_ranked_below_one_with_fewer_learners_per_node():
    """4 Berzelius fat nodes, 32B: 3 learners per node leave five GPUs for TP-1 engines holding
    3 sequences each, several times slower than a layout with TP-4/8 engines. Fewer learners per
    node or idle GPUs only break near-ties (10%): the first layout is within 10% of the fastest."""
    out = hpcrl("plan", "--cluster", "berzelius:fat", "--nodes", "4", "--top", "100", "--json")
    lays = json.loads(out.stdout)["layouts"]
    fastest = min(lay["step_time_s"] for lay in lays)
    assert lays[0]["step_time_s"] <= 1.10 * fastest and lays[0]["vllm_tensor_parallel_size"] >= 4


def test_pinned_tp_that_does_not_divide_heads_is_refused():
    prof = load_profile("isambard-ai")
    with pytest.raises(PlanError, match="divide the 40 attention heads"):
        enumerate_layouts(prof, 4, Workload(model=resolve_model("32b")), Pins(tp=3))


def test_pin_fixes_choices():
    prof = load_profile("isambard-ai")
    layouts, _ = enumerate_layouts(prof, 8, Workload(model=resolve_model("32b")), Pins(tp=2, learners_per_node=2))
    assert layouts and all(lay.tp == 2 and lay.learners_per_node == 2 for lay in layouts)


def test_pack_length_must_hold_prompt_and_response():
    w = Workload(model=resolve_model("7b"), pack_length=4096, response_length=4096, max_prompt_token_length=1024)
    with pytest.raises(HpcrlError, match="pack_length 4096 is shorter than .* 5120"):
        w.check()


def test_beta_needs_reference_policy():
    w = Workload(model=resolve_model("7b"), beta=0.05, load_ref_policy=False)
    with pytest.raises(HpcrlError, match="beta 0.05 needs a reference policy"):
        w.check()


def test_reference_policy_costs_learner_memory():
    prof = load_profile("isambard-ai")
    base = Workload(model=resolve_model("32b"))
    with_ref = Workload(model=resolve_model("32b"), beta=0.05, load_ref_policy=True)
    a = enumerate_layouts(prof, 16, base, Pins(learners_per_node=1, learner_nodes=16))[0][0]
    b = enumerate_layouts(prof, 16, with_ref, Pins(learners_per_node=1, learner_nodes=16))[0][0]
    # 2 bytes per parameter, sharded over 16 learners (ZeRO-3), plus allocator reserve
    extra = b.memory.learner.peak_allocated - a.memory.learner.peak_allocated
    assert extra == pytest.approx(2 * 32_233_522_176 / 16, rel=1e-6)


def test_nodes_over_partition_limit_is_an_error():
    out = hpcrl("plan", "--cluster", "berzelius", "--nodes", "61")
    assert_user_error(out, "61 nodes exceed partition berzelius's limit of 60 nodes (pass --allow-over-limit")
    assert (
        hpcrl("plan", "--cluster", "berzelius", "--nodes", "61", "--allow-over-limit", "--model", "7b").returncode == 0
    )


def test_unknown_cluster_and_model_name_closest():
    assert_user_error(
        hpcrl("plan", "--cluster", "isambard", "--nodes", "2"), "unknown cluster 'isambard'; closest: isambard-ai"
    )
    line = assert_user_error(hpcrl("plan", "--nodes", "2", "--model", "qwen2.5-70b"), "unknown model 'qwen2.5-70b'")
    closest = line.split("closest: ")[1].split(", ")
    assert {"qwen2.5-7b", "Qwen/Qwen2.5-72B"} <= set(closest)


def test_idle_gpus_of_the_chosen_layout_are_named():
    """The users' 32B utilisation (0.55) on 16 GH200 nodes: the TP-2 engines of the fastest layout
    leave one of each learner node's three spare GPUs idle. The warning counts them, says why, and
    names the layout that idles fewest."""
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "render", "--nodes", "16", "--pin", "util=0.55"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stderr.splitlines() if "GPUs idle" in ln]
    m = re.search(
        r"leaves (\d+) of 64 GPUs idle: on each of its (\d+) learner nodes the 3 GPUs beside the learners "
        r"hold (\d+) TP-(\d+) engines? and leave (\d+) idle",
        line,
    )
    assert m and int(m.group(1)) == int(m.group(2)) * int(m.group(5)), line
    assert "the layout with the fewest, " in line
    rp = make_run_plan(None, nodes=16, pins=["util=0.55"])
    # idle GPUs only break ties: the chosen layout is the fastest within the rank's 10% band
    assert rp.layouts[0].step_time_s <= 1.1 * min(x.step_time_s for x in rp.layouts)


# What only the planner chooses, worded as its warnings word it: engines past the prompts in flight, GPUs it left
# idle, learners past the profile's cap where it could have kept it.
PLANNER_CHOICES = ("vllm_num_engines", "the chosen layout leaves")


@pytest.mark.parametrize("config", sorted(p.stem for p in (Path(__file__).parents[1] / "configs").glob("*.yaml")))
def test_every_shipped_config_plans_at_its_defaults_without_a_warning_about_a_planner_choice(config):
    """A shipped config at its own node count on its own cluster plans (grpo-olmo3-7b did not: 2 Isambard-AI nodes
    hold one learner each, ~0.4 GiB short since the memory refit), and no warning is about what hpcrl chose;
    a learner count past the profile's cap is only where the framework's own placement leaves no other."""
    out = hpcrl("plan", "--config", config, "--json")
    assert out.returncode == 0, out.stderr
    for w in json.loads(out.stdout)["warnings"]:
        assert not any(c in w for c in PLANNER_CHOICES), w
        if "where the profile plans at most" in w:
            assert "hpcrl cannot plan fewer" in w or "none fits" in w, w
