"""The planner's work at the profile's node limit, and the progress line of a long search (issue 27, item 6).

Work is counted, never timed: benchmarks/plan_speed.py times every shipped config on every cluster.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading

import hpcrl.memory.plan as memory_plan
from hpcrl.planning.layout import Layout, enumerate_layouts
from hpcrl.planning.request import RunRequest, plan_request


def test_a_search_over_isambard_ais_1362_nodes_models_each_learner_at_most_twice(monkeypatch):
    """One learner per node (the profile's planning.max_learners_per_node) on 1 to 1,362 learner nodes
    gives 1,362 learner counts, each tried in at most the two weight-sync modes of "auto" (whole_model,
    then per_param: memory/learner.py sync_modes): at most 2 x 1,362 = 2,724 learner memory models,
    whatever the three TP sizes and five utilisations each count is paired with (hpcrl at f9257de
    modelled the learner once per memory plan: 4,091 times)."""
    calls = []
    real = memory_plan.learner_memory
    monkeypatch.setattr(memory_plan, "learner_memory", lambda s: calls.append(1) or real(s))
    plan_request(RunRequest(config="grpo-olmo3-7b", cluster="isambard-ai", nodes=1362))
    assert len(calls) <= 2 * 1362


def test_ranking_compares_no_two_layouts(monkeypatch):
    """Ranking sorts by numbers; at f9257de it tested each layout's membership in each tie group with
    Layout.__eq__ (8.3 million calls at 1,362 nodes, cProfile)."""
    layouts = enumerate_layouts(*_isambard_search())[0]
    calls = []
    monkeypatch.setattr(Layout, "__eq__", lambda a, b: calls.append(1) or a is b)
    from hpcrl.planning.layout_rank import rank

    rank(layouts)
    assert calls == []


def _isambard_search():
    from hpcrl.planning.node_share import job_profile
    from hpcrl.planning.run_plan import workload_from_config
    from hpcrl.planning.config import load_run_config
    from hpcrl.profiles import resolve_profile

    cfg = load_run_config("grpo-olmo3-7b", [])
    return job_profile(resolve_profile("isambard-ai"), None, 64), 64, workload_from_config(cfg)


def on_terminal(*args: str) -> tuple[str, str]:
    """Run hpcrl with stderr on a pseudo-terminal (as a person at a shell runs it): (stdout, stderr)."""
    master, slave = pty.openpty()
    seen: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: the child has exited
                return
            if not chunk:
                return
            seen.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", *args], stdout=subprocess.PIPE, stderr=slave, text=True, timeout=120
    )
    os.close(slave)
    reader.join(timeout=10)
    os.close(master)
    return out.stdout, b"".join(seen).decode().replace("\r\n", "\n")


# berzelius-hopper documents no node limit; 1,000 of its 8-GPU nodes with OLMo 3 7B's TP sizes 1, 2, 4
# and 8 are 8 x 1,000 x 4 = 32,000 candidate layouts, over the 30,000 of planning/layout_advice.py's
# SLOW_SEARCH. An engine count no layout has makes each candidate a quick rejection: the line comes first.
LONG = (
    "plan",
    "--config",
    "grpo-olmo3-7b",
    "--cluster",
    "berzelius-hopper",
    "--nodes",
    "1000",
    "--pin",
    "engines=1000000",
)


def test_a_long_search_says_so_first_on_a_terminal():
    _out, err = on_terminal(*LONG)
    assert err.splitlines()[0] == "hpcrl: planning 1,000 nodes: 32,000 candidate layouts..."


def test_the_progress_line_stays_off_a_pipe():
    err = subprocess.run([sys.executable, "-m", "hpcrl", *LONG], capture_output=True, text=True, timeout=120).stderr
    assert "candidate layouts" not in err


def test_the_progress_line_stays_off_json_output():
    _out, err = on_terminal(*LONG, "--json")
    assert "candidate layouts" not in err


def test_isambard_ais_whole_machine_plans_without_a_progress_line():
    """1 learner per node (the profile's cap) x 1,362 learner node counts x TP 1, 2, 4 = 4,086 candidates."""
    _out, err = on_terminal("plan", "--config", "grpo-olmo3-7b", "--cluster", "isambard-ai", "--nodes", "1362")
    assert "candidate layouts" not in err and "hpcrl: warning" in err
