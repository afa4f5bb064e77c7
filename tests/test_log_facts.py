"""A backend owns its log, diagnose and in-job facts (issue 22): the modules that read logs, run in
the job or render the script name no framework in their code, and what they need of one arrives
through the backend (hpcrl/planning/backends/log_facts.py) or on the rendered command line.

Expected values: the CPU asks are worked by hand from each framework's own constants (named
beside each case); the placements are what Ray's strategies give on a three-node Ray cluster
(ray.cluster_utils, GPUs declared: no GPU here), worked by hand from the layout.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import tokenize
from pathlib import Path

import pytest

from hpcrl.planning.backends import BACKENDS
from hpcrl.planning.run_plan import make_run_plan
from hpcrl.planning.describe import describe_job
from hpcrl.rendering.render import render_script

REPO = Path(__file__).resolve().parents[1]
# Layers that must reach a framework only through its backend (planning/ and cli/ are checked
# where their own moves land).
NO_NAMES = ("hpcrl/logs", "hpcrl/runtime", "hpcrl/rendering")
# Each name as code may spell it (open-instruct, open_instruct, OpenInstruct); "custom", an ordinary
# word, only as a string of its own.
SPELLINGS = re.compile(
    "(?<![A-Za-z])(?i:"
    + "|".join(re.escape(n).replace(r"\-", "[-_ ]?") for n in BACKENDS if n != "custom")
    + ")(?![a-z])"
)  # not in "overlap"
SMOKE_SETS = ["hpcrl.run_root=/tmp/hpcrl-e2e", 'hpcrl.time="00:05:00"']


def _code_tokens(path: Path) -> list[tuple[int, str]]:
    """Names and string literals of a module, without comments and docstrings (citations may name a framework)."""
    toks = [
        t
        for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if t.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)
    ]
    out = []
    for i, t in enumerate(toks):
        statement = (i == 0 or toks[i - 1].type == tokenize.NEWLINE or toks[i - 1].string == ":") and (
            i + 1 < len(toks) and toks[i + 1].type == tokenize.NEWLINE
        )
        if t.type == tokenize.NAME or (t.type == tokenize.STRING and not statement):
            out.append((t.start[0], t.string))
    return out


def _is_name(text: str) -> bool:
    return bool(SPELLINGS.search(text)) or text.strip("\"'") == "custom"


def _names_in_code() -> list[str]:
    hits = []
    for layer in NO_NAMES:
        for path in sorted((REPO / layer).rglob("*.py")):
            hits += [
                f"{path.relative_to(REPO)}:{line}: {text[:80]}" for line, text in _code_tokens(path) if _is_name(text)
            ]
    for path in sorted((REPO / "templates").glob("*.j2")):
        for line, text in enumerate(path.read_text().splitlines(), 1):
            hits += [
                f"{path.relative_to(REPO)}:{line}: {tag[:80]}"
                for tag in re.findall(r"{[{%].*?[}%]}", text)
                if re.search(r"['\"]custom['\"]", tag) or SPELLINGS.search(tag)
            ]
    return hits


def test_logs_runtime_rendering_and_templates_name_no_backend_in_code():
    assert _names_in_code() == []


def _smoke_words(config: str, pins: tuple[str, ...] = ()) -> list[str]:
    rp = make_run_plan(config, nodes=3, cluster="local-dev", sets=list(SMOKE_SETS), pins=list(pins))
    text = render_script(describe_job(rp, smoke=True))
    block = re.search(r"^ *DRIVER=\(\n(.*?)^ *\)$", text, re.S | re.M)
    assert block, "no smoke command in the script"
    words = shlex.split(block.group(1).replace('"$HPCRL_RAY_CPUS"', "4"))
    return words[words.index("hpcrl.runtime.smoke") + 1 :]


def _after(words: list[str], flag: str, n: int = 1) -> list[str]:
    i = words.index(flag)
    return words[i + 1 : i + 1 + n]


# The separate-engine layout pinned where the ranking (which moves with the step-time model) would choose it.
PINS = {"grpo-olmo3-32b": ("learners=4", "learner_nodes=2", "engines=4", "tp=1")}


def test_open_instruct_cpu_ask_is_grpo_fasts():
    # grpo_fast: 10 CPUs per learner GPU (LEARNER_PLACEMENT_GROUP_CPU_PER_GPU), tp per engine, and
    # 3 for DataPreparationActor (2) and ActorManager (1).
    # local-dev, 3 nodes, the layout pinned (the ranking moves with the step-time model): 2 learner nodes of 4,
    # one node of 4 engines.
    w = _smoke_words("grpo-olmo3-32b", PINS["grpo-olmo3-32b"])
    assert (_after(w, "--learners"), _after(w, "--engines"), _after(w, "--tp")) == (["4 4"], ["4"], ["1"])
    # 8 learner GPUs x 10 + 4 engines x 1 + 3 = 87; a learner node asks 4 x 10 = 40.
    assert _after(w, "--cpu-ask", 4) == ["grpo_fast.py", "87", "40", "learner node"]


def test_verl_cpu_ask_is_its_resource_pools():
    # verl b178a3cd ResourcePoolManager: max_colocate_count=3 CPUs in each one-GPU bundle, one more in all.
    w = _smoke_words("verl-grpo-qwen2.5-7b")
    # 3 x 4 GPUs = 12 a node; 12 x 3 nodes + 1 = 37.
    assert _after(w, "--cpu-ask", 4) == ["verl", "37", "12", "node"]


def test_openrlhf_cpu_ask_is_one_per_gpu_bundle():
    w = _smoke_words("openrlhf-grpo-qwen2.5-7b")
    assert (_after(w, "--learners"), _after(w, "--engines"), _after(w, "--tp")) == (["4"], ["8"], ["1"])
    # 4 actor bundles + 8 engines x tp 1 = 12 one-GPU bundles of one CPU; a node of 4 GPUs asks 4.
    assert _after(w, "--cpu-ask", 4) == ["OpenRLHF", "12", "4", "node"]


@pytest.fixture(scope="module")
def ray_cluster():
    """Three Ray nodes of 4 declared GPUs and 4 CPUs, as local-dev's job declares them."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster()
    for _ in range(3):
        cluster.add_node(num_gpus=4, num_cpus=4)
    cluster.wait_for_nodes()
    yield cluster.address
    cluster.shutdown()


# The rendered placement on 3 nodes x 4 GPUs, by hand: open-instruct's 2 learner entries of 4 GPUs
# STRICT_SPREAD land on 2 nodes, its 4 engines of TP 1 in a PACK group on the third; verl's one
# STRICT_PACK pool of 4 one-GPU bundles per node makes 3 pools of 12 workers; OpenRLHF's 8 one-GPU
# engine bundles PACK onto two nodes, then its 4 actor bundles onto the third.
PLACED = {
    "grpo-olmo3-32b": "learners=[4, 4] learner_nodes=2 engines=4 tp=1 engine_nodes=1",
    "verl-grpo-qwen2.5-7b": "framework=verl colocated=true workers=12 pools=3 engines=12 tp=1",
    "openrlhf-grpo-qwen2.5-7b": "framework=openrlhf actor_gpus=4 actor_nodes=1 engines=8 tp=1 engine_nodes=2",
}


@pytest.mark.ray
@pytest.mark.parametrize("config", list(PLACED))
def test_smoke_places_bundles_as_its_rendered_line_says(ray_cluster, config):
    from hpcrl.runtime import smoke

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = smoke.main([*_smoke_words(config, PINS.get(config, ())), "--address", ray_cluster])
    assert (rc, PLACED[config] in out.getvalue()) == (0, True), out.getvalue()


def test_preflight_imports_the_runs_own_framework():
    from hpcrl.jobs.preflight import target

    # verl's driver is verl.trainer.main_ppo: the package the training Python must import is verl.
    spec = target(cluster="local-dev", config=str(REPO / "configs" / "verl-grpo-qwen2.5-7b.yaml")).spec
    # (with the stack check's expectation for verl's newest version: its install's packages, no open_instruct)
    assert spec["modules"] == ["torch", "verl", "transfer_queue", "ray", "vllm", "transformers"]


def test_a_users_own_script_is_not_read_as_a_framework_command():
    from hpcrl.logs.driver_cmdline import from_script

    # The custom backend's driver is the user's script: its words (--config, --output_dir) are its own.
    script = render_script(describe_job(make_run_plan("custom-ppo-qwen2.5-3b-qlora", nodes=1, cluster="berzelius:fat")))
    assert "--output_dir" in script  # the script's own flags are there to be misread
    assert from_script(script, "custom") is None


LOGS = REPO / "tests" / "data" / "logs"


def _diagnose(text: str):
    from hpcrl.logs.diagnose import Context, diagnose
    from hpcrl.profiles import load_profile

    return diagnose(text, Context(load_profile("isambard-ai"), {}))


def test_an_openrlhf_timeout_that_is_no_weight_sync_gets_no_sync_switch():
    # The same run timing out in an all-reduce of the actor's own group: OpenRLHF hard-codes the
    # limit (3c3be623 utils/deepspeed/deepspeed.py:82), and --vllm.sync_with_ray only changes the
    # broadcast to the engines.
    text = (LOGS / "openrlhf_nccl_timeout.log").read_text()
    text = "\n".join(
        line
        for line in text.replace("OpType=BROADCAST", "OpType=ALLREDUCE").splitlines()
        if "broadcast_to_vllm" not in line
    )
    f = _diagnose(text).findings[0]
    assert (f.kind, "sync_with_ray" in f.fix, "no flag for the limit (60 min" in f.fix) == ("nccl_timeout", False, True)


def test_a_dead_verl_worker_is_said_to_hold_every_role_of_its_gpu():
    # The log's dead actor is verl's WorkerDict (create_colocated_worker_cls): actor, rollout and reference in one.
    f = _diagnose((LOGS / "verl_worker_died.log").read_text()).findings[0]
    assert f.kind == "ray_actor_died" and "WorkerDict holds the actor, rollout and reference" in f.cause
