"""hpcrl render: golden scripts, shell lint, open-instruct flags, quoting, determinism, bad input.

One golden file, tests/golden/isambard-ai__grpo-olmo3-32b__16.sh (the default run); every other
profile x config is checked on its #SBATCH options and driver flags. After an intended change to
the templates (or to the planner's numbers in the header), regenerate it (never under CI=true) with

    HPCRL_UPDATE_GOLDEN=1 python -m pytest tests/test_render.py -k golden

and review the diff. The stub-run tests execute rendered scripts with stand-ins for Slurm,
Ray and the driver on PATH (tests/test_render_e2e.py runs them on the real local Slurm).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.planning.run_plan import make_run_plan
from hpcrl.planning.describe import describe_job
from hpcrl.rendering.render import render_script
from helpers import GOLDEN, assert_golden, driver_words, expected_sbatch, lint, sbatch_options
from stub_run import Stub, wait_for, yq

DATA = Path(__file__).with_name("data")
PROFILES = ["isambard-ai", "berzelius", "berzelius:fat", "berzelius-hopper", "local-dev"]
CONFIGS = ["grpo-olmo3-32b", "grpo-olmo3-7b"]
# 4 nodes, except where the model needs more (the 32B learner does not fit 4 thin Berzelius nodes,
# nor 4 Isambard-AI nodes at one learner per node: the default run's 16 nodes instead).
NODES = {
    ("berzelius", "grpo-olmo3-32b"): 16,
    ("isambard-ai", "grpo-olmo3-32b"): 16,
    ("local-dev", "grpo-olmo3-32b"): 3,
    ("local-dev", "grpo-olmo3-7b"): 3,
}
CASES = [(p, c, NODES.get((p, c), 4)) for p in PROFILES for c in CONFIGS]


@pytest.fixture(autouse=True)
def _shipped_profiles_only(monkeypatch, tmp_path):
    """Profiles from the package only: no user config dir, no ./clusters, no HPCRL_CLUSTERS_DIR."""
    monkeypatch.delenv("HPCRL_CLUSTERS_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)


def render(cluster: str, config: str, nodes: int, *, smoke: bool = False, sets=(), pins=(), cluster_file=None) -> str:
    rp = make_run_plan(
        config, nodes=nodes, cluster=cluster, cluster_file=cluster_file, sets=list(sets), pins=list(pins)
    )
    return render_script(describe_job(rp, smoke=smoke))


def golden_name(cluster: str, config: str, nodes: int) -> str:
    return f"{cluster.replace(':', '-')}__{config}__{nodes}.sh"


# --------------------------------------------------------------------------- goldens and lint


# One full golden: the default run (open-instruct, Isambard-AI, 16 nodes); the other backends
# keep one each (tests/test_backends.py, tests/test_custom.py). The other profile x config
# renders are checked below on what differs between them: the #SBATCH options and the driver.
DEFAULT_CASE = ("isambard-ai", "grpo-olmo3-32b", 16)


def test_golden():
    assert_golden(golden_name(*DEFAULT_CASE), render(*DEFAULT_CASE))


@pytest.mark.parametrize("cluster,config,nodes", CASES, ids=[golden_name(*c)[:-3] for c in CASES])
def test_sbatch_options_per_profile(cluster, config, nodes):
    # local-dev's run root is /tmp/hpcrl-runs (its storage.run_root); elsewhere the log goes beside the script.
    output = f"/tmp/hpcrl-runs/{config}/logs/slurm-%j.out" if cluster == "local-dev" else f"hpcrl-{config}-%j.out"
    assert sbatch_options(render(cluster, config, nodes))[0] == expected_sbatch(cluster, config, nodes, output)


# The end-to-end smoke render (tests/test_render_e2e.py): the default config on three
# local-dev nodes, with a private run root and no virtualenv to activate.
SMOKE3 = dict(smoke=True, sets=["hpcrl.run_root=/tmp/hpcrl-e2e", 'hpcrl.time="00:05:00"'])


def test_local_dev_smoke_render(tmp_path, shellcheck):
    text = render("local-dev", "grpo-olmo3-32b", 3, **SMOKE3)
    opts, signal = sbatch_options(text)
    want = expected_sbatch("local-dev", "grpo-olmo3-32b", 3, "/tmp/hpcrl-e2e/grpo-olmo3-32b/logs/slurm-%j.out")
    assert opts == [o.replace("--time=01:00:00", "--time=00:05:00") for o in want]
    assert re.search(r"^        python3 -m hpcrl\.runtime\.smoke --nodes 3 --gpus-per-node 4$", text, re.M)
    lint(text, tmp_path, shellcheck)


VARIANTS = [
    ("isambard-ai", "grpo-olmo3-32b", 16, {}),
    ("isambard-ai", "grpo-olmo3-7b", 3, {}),
    ("isambard-ai", "grpo-olmo3-7b", 3, {"smoke": True}),
    ("berzelius", "grpo-olmo3-7b", 3, {"sets": ["hpcrl.container=$HOME/images/oi x.sif"]}),
    ("berzelius:fat", "grpo-olmo3-7b", 2, {"sets": ["hpcrl.arg_layout=legacy", "hpcrl.account=berzelius-2025-35"]}),
    ("berzelius-hopper", "grpo-olmo3-32b", 2, {"smoke": True, "sets": ["hpcrl.container=/img.sif"]}),
]


@pytest.mark.parametrize("cluster,config,nodes", CASES, ids=[golden_name(*c)[:-3] for c in CASES])
def test_bash_n_and_shellcheck(cluster, config, nodes, tmp_path, shellcheck):
    lint(render(cluster, config, nodes), tmp_path, shellcheck)


@pytest.mark.parametrize(
    "cluster,config,nodes,kw", VARIANTS, ids=[f"{v[0]}-{v[1]}-{v[2]}-{i}" for i, v in enumerate(VARIANTS)]
)
def test_variants_lint(cluster, config, nodes, kw, tmp_path, shellcheck):
    lint(render(cluster, config, nodes, **kw), tmp_path, shellcheck)


def test_deterministic(tmp_path):
    """Same inputs, same bytes: in this process, and in a fresh one with another hash seed and cwd."""
    first = render("berzelius:fat", "grpo-olmo3-32b", 4, sets=["beta=0.0"])
    assert first == render("berzelius:fat", "grpo-olmo3-32b", 4, sets=["beta=0.0"])
    env = {k: v for k, v in os.environ.items() if k != "HPCRL_CLUSTERS_DIR"}
    env.update(PYTHONHASHSEED="12345", XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "render", "--cluster", "berzelius:fat", "--nodes", "4", "--set", "beta=0.0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == first


# --------------------------------------------------------------------------- the driver's flags


# grpo_fast.py's fields as open-instruct declares them (committed copies of
# shared/reference/open_instruct_grpo_fast_args*.json, read from open-instruct's dataclasses at the
# commit in their _meta): the check below does not go through hpcrl's own copy of the table.
OI_ARGS = {
    "current": DATA / "open_instruct_grpo_fast_args.json",
    "legacy": DATA / "open_instruct_grpo_fast_args_legacy.json",
}


def oi_fields(layout: str) -> dict[str, dict]:
    return {k: v for k, v in json.loads(OI_ARGS[layout].read_text()).items() if not k.startswith("_")}


def oi_parser(layout: str) -> argparse.ArgumentParser:
    """An argparse mirror of HfArgumentParser for grpo_fast.py's fields: list fields take several
    values, bools an optional True/False, int/float fields a number, Literal fields one of theirs."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for name, meta in oi_fields(layout).items():
        t = re.sub(r"\s", "", meta["type"])
        if t.startswith(("list[", "tuple[", "Optional[List")) or "|list[" in t:
            p.add_argument(f"--{name}", nargs="+")
        elif t in ("bool", "bool|None"):
            p.add_argument(f"--{name}", nargs="?", const="True", choices=["True", "False"])
        elif t.startswith("Literal["):
            p.add_argument(f"--{name}", choices=[v.strip('"') for v in t[len("Literal[") : t.index("]")].split(",")])
        else:
            number = {"int": int, "int|None": int, "Optional[int]": int, "float": float, "float|None": float}
            p.add_argument(f"--{name}", type=number.get(t, str))
    return p


def grpo_args(text: str) -> list[str]:
    """The arguments after the watchdog's `--`, the python and the entry point."""
    words = driver_words(text)
    assert words[:3] == ["python3", "-m", "hpcrl.runtime.watchdog"]
    return words[words.index("--") + 3 :]


@pytest.mark.parametrize("cluster,config,nodes", CASES, ids=[golden_name(*c)[:-3] for c in CASES])
def test_every_flag_exists_in_open_instruct(cluster, config, nodes):
    args = grpo_args(render(cluster, config, nodes))
    table = oi_fields("current")
    flags = [w[2:] for w in args if w.startswith("--")]
    assert flags and not [f for f in flags if f not in table]
    ns = oi_parser("current").parse_args(args)  # raises on an unknown flag or a bad value
    assert ns.output_dir == "$RUN_DIR/output" and ns.checkpoint_state_dir == "$RUN_DIR/checkpoints"
    assert ns.num_nodes == nodes and ns.deepspeed_stage == 3
    assert len(ns.num_learners_per_node) <= nodes


def test_legacy_layout_has_no_num_nodes():
    text = render("berzelius:fat", "grpo-olmo3-7b", 2, sets=["hpcrl.arg_layout=legacy"])
    args = grpo_args(text)
    ns = oi_parser("legacy").parse_args(args)
    assert "--num_nodes" not in args and ns.vllm_num_engines >= 1


def test_default_render_16_nodes(tmp_path, shellcheck):
    """`hpcrl render --nodes 16` alone: the 32B default on Isambard-AI, one learner per node."""
    env = {k: v for k, v in os.environ.items() if k != "HPCRL_CLUSTERS_DIR"}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "render", "--nodes", "16"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --nodes=16\n" in out.stdout and "#SBATCH --gpus-per-node=4\n" in out.stdout
    ns = oi_parser("current").parse_args(grpo_args(out.stdout))
    assert ns.num_learners_per_node == ["1"] * 16
    assert ns.model_name_or_path == "allenai/Olmo-3-1125-32B"
    assert "QOS" in out.stderr  # 64 GPUs over the default 32-GPU QOS: a warning, not an error
    lint(out.stdout, tmp_path, shellcheck)


def test_pins_are_kept():
    """Pinned values reach the driver unchanged; the rest is the planner's choice."""
    rp = make_run_plan(
        "grpo-olmo3-32b",
        nodes=16,
        cluster="isambard-ai",
        pins=["tp=2", "learners=1"],
        sets=["vllm_gpu_memory_utilization=0.8"],
    )
    ns = oi_parser("current").parse_args(grpo_args(render_script(describe_job(rp))))
    assert (ns.vllm_tensor_parallel_size, ns.vllm_gpu_memory_utilization) == (2, 0.8)
    assert ns.num_learners_per_node == ["1"] * rp.layout.learner_nodes
    assert ns.vllm_num_engines == rp.layout.engines


# --------------------------------------------------------------------------- the script's header


def sbatch_lines(text: str) -> list[str]:
    return [ln[len("#SBATCH ") :] for ln in text.splitlines() if ln.startswith("#SBATCH ")]


def test_unconfirmed_profile_facts_in_the_header_are_named():
    """berzelius-hopper's partition and time limit are inferred: the script's header warns and
    says what to set; setting them ends the warning."""
    text = render("berzelius-hopper", "grpo-olmo3-32b", 2)
    warning = next(ln for ln in text.splitlines() if ln.startswith("# Warning: berzelius-hopper: "))
    assert warning == (
        "# Warning: berzelius-hopper: the script uses unconfirmed profile facts: "
        "--partition=berzelius-hopper (hpcrl.partition); --time from the partition's limit (hpcrl.time); "
        "the GPU request style gpus (a user profile's slurm.gpu_request); the run root "
        "/proj/$SLURM_JOB_ACCOUNT/users/$USER/hpcrl-runs (hpcrl.run_root); check them "
        "(hpcrl clusters show berzelius-hopper) or set what is in brackets"
    )
    pinned = render(
        "berzelius-hopper",
        "grpo-olmo3-32b",
        2,
        sets=["hpcrl.partition=berzelius-hopper", 'hpcrl.time="1-00:00:00"', "hpcrl.run_root=/proj/x/runs"],
    )
    line = next(ln for ln in pinned.splitlines() if ln.startswith("# Warning: berzelius-hopper: "))
    assert "--partition" not in line and "--time" not in line and "run root" not in line
    assert "unconfirmed" not in "".join(
        ln for ln in render("isambard-ai", "grpo-olmo3-7b", 3).splitlines() if ln.startswith("# Warning")
    )


def test_sbatch_header_per_gpu_request_style():
    isam = sbatch_lines(render("isambard-ai", "grpo-olmo3-7b", 4))
    assert "--gpus-per-node=4" in isam and "--mem=0" in isam and "--time=24:00:00" in isam
    # The warning covers one step at the upper estimate (~743 s for 7B on 4 nodes, generation-bound) + one
    # checkpoint write (~41 s) + 60 s to stop, in whole minutes: 844 s -> 900 s, the profile's floor too.
    assert "--signal=B:USR1@900" in isam and "--partition=workq" in isam and "--exclusive" in isam
    berz = sbatch_lines(render("berzelius", "grpo-olmo3-7b", 4, sets=['hpcrl.exclude_nodes=["node017"]']))
    assert "--gpus=32" in berz and "--constraint=thin" in berz and "--exclude=node017" in berz
    assert "--time=3-00:00:00" in berz
    # Run root with $VARs: Slurm cannot expand them, so the output goes to the submit dir.
    assert "--output=hpcrl-grpo-olmo3-7b-%j.out" in berz
    fixed = sbatch_lines(
        render(
            "isambard-ai",
            "grpo-olmo3-7b",
            3,
            sets=["hpcrl.run_root=/srv/runs", 'hpcrl.time="2:00:00"', "hpcrl.qos=high", "hpcrl.account=brics.a5k"],
        )
    )
    assert "--output=/srv/runs/grpo-olmo3-7b/logs/slurm-%j.out" in fixed
    assert {"--time=2:00:00", "--qos=high", "--account=brics.a5k"} <= set(fixed)


def test_header_comment_cannot_break_out(tmp_path):
    """A newline in a value shown in a comment (the model name) must not start a command line."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        'hpcrl: {cluster: isambard-ai, model: "Qwen/Qwen2.5-0.5B", run_name: "a\\nb"}\n'
        'model_name_or_path: "x\\ntouch /tmp/pwned"\n'
    )
    text = render("isambard-ai", str(cfg), 1)
    head = text.split("\nset -euo pipefail\n")[0]
    assert all(ln.startswith("#") or not ln for ln in head.splitlines())
    assert "--job-name=hpcrl-a_b" in sbatch_lines(text)


# --------------------------------------------------------------------------- bad input: one line, exit 2, no file


BAD = [
    (["--config", "/no/such/run.yaml"], "no such config file"),
    (["--set", "hpcrl.bogus=1"], "hpcrl.bogus: unknown key"),
    (["--set", "not_a_flag=1"], "not_a_flag"),
    (["--pin", "tp=3"], "vllm_tensor_parallel_size 3 cannot work: it does not divide the 40 attention heads"),
    (["--set", "vllm_tensor_parallel_size=8"], "vllm_tensor_parallel_size 8"),
    (["--cluster", "berzelius", "--config", "grpo-olmo3-7b", "--nodes", "61"], "exceed partition berzelius's limit"),
    (["--set", 'hpcrl.exclude_nodes=["nid1;touch x"]'], "not a valid Slurm value"),
    (["--set", "hpcrl.time=1h"], "hpcrl.time '1h'"),
    (["--set", "hpcrl.account=foo"], "account pattern"),
    (["--set", "hpcrl.run_name=a/b"], "must be a directory name"),
    (["--set", "output_dir=/x"], "output_dir is set by hpcrl"),
    (["--cluster", "no-such-cluster"], "unknown cluster"),
    (["--set", "num_learners_per_node=[a]"], "num_learners_per_node: expected list[int], got ['a']"),
    (["--set", "hpcrl.run_root=/x/$(id)"], "'$' may only start a variable"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_one_line_exit_2_no_file(args, message, tmp_path):
    out_file = tmp_path / "job.sbatch"
    env = {k: v for k, v in os.environ.items() if k != "HPCRL_CLUSTERS_DIR"}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    args = args if "--nodes" in args else ["--nodes", "16", *args]
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "render", *args, "-o", str(out_file)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcrl: error: ") and message in lines[0], out.stderr
    assert out.stdout == "" and not out_file.exists() and list(tmp_path.glob(".job.sbatch.*")) == []


def test_output_file_mode_0755_and_atomic(tmp_path):
    out_file = tmp_path / "job.sbatch"
    out_file.write_text("old")
    env = {k: v for k, v in os.environ.items() if k != "HPCRL_CLUSTERS_DIR"}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "render", "--nodes", "4", "--config", "grpo-olmo3-7b", "-o", str(out_file)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out_file.stat().st_mode & 0o777 == 0o755 and out_file.read_text().startswith("#!/bin/bash\n")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "xdg") == ["job.sbatch"]


# --------------------------------------------------------------------------- stub runs

# The job's phases in order, as issue 22 names them; a script without Ray has no workers or readiness.
PHASES = ["environment", "stack_check", "head", "workers", "readiness", "services", "driver", "stop"]


def main_phases(text: str) -> list[str]:
    main = re.search(r"^main\(\) \{\n(.*?)^\}", text, re.S | re.M)
    assert main, "no main() in the script"
    return re.findall(r"^    phase_(\w+)", main.group(1), re.M)


def test_main_lists_the_phases():
    assert main_phases(render("local-dev", "grpo-olmo3-7b", 3)) == PHASES
    no_ray = (GOLDEN / "berzelius-fat__custom-ppo-qwen2.5-3b-qlora__gpus1.sh").read_text()  # test_custom renders it
    assert main_phases(no_ray) == [p for p in PHASES if p not in ("workers", "readiness")]


def test_stub_run_completes_and_records(tmp_path):
    stub = Stub(tmp_path, nodes=3)
    stub.job = str(random.randint(10_000, 1_000_000))  # random: runs in parallel differ
    rc, out = stub.run(stub.render())
    run_dir = tmp_path / "runs" / "grpo-olmo3-7b"
    assert rc == 0, out
    assert re.findall(r"^hpcrl: phase (\w+)$", out, re.M) == PHASES
    events = stub.events(run_dir)
    assert [e[1] for e in events] == ["start", "end"] and events[0][3] == "n1" and events[1][3] == "completed:0"
    assert all(e[0] == stub.job and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", e[2]) for e in events)
    assert (run_dir / "hpcrl" / "job.sbatch").read_text() == (tmp_path / "job.sh").read_text()
    assert '"nodes": 3' in (run_dir / "hpcrl" / "plan.json").read_text()
    token = run_dir / "hpcrl" / f"ray-token-{stub.job}"
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text()) == 64
    assert out in (run_dir / "logs" / f"job-{stub.job}.log").read_text() or "completed:0" in out
    # Ray: one head and two workers, Slurm's node addresses, per-node slots on one host, ports drawn
    # per node (docs/render.md): local-dev's ray.ports 10000-32767 cut in 18 blocks of 1264 ports, a
    # node's ports in its slot's block (head slot 0: 10000-11263, workers 11264-12527 and 12528-13791),
    # none twice; the workers join the head's GCS port.
    head = stub.argv("ray-n1.argv")
    assert {"--head", "--block", "--node-ip-address=127.0.0.1", "--num-gpus=4", "--num-cpus=8"} <= set(head)
    flags = (
        "--port",
        "--dashboard-port",
        "--ray-client-server-port",
        "--node-manager-port",
        "--object-manager-port",
        "--metrics-export-port",
        "--dashboard-agent-grpc-port",
        "--dashboard-agent-listen-port",
        "--runtime-env-agent-port",
    )
    ports = {1: [int(a.split("=")[1]) for a in head if a.split("=")[0] in flags]}
    gcs = next(a.split("=")[1] for a in head if a.startswith("--port="))
    for i, n in ((2, "n2"), (3, "n3")):
        w = stub.argv(f"ray-{n}.argv")
        assert {f"--address=127.0.0.1:{gcs}", f"--node-ip-address=127.0.0.{i}", "--block"} <= set(w)
        ports[i] = [int(a.split("=")[1]) for a in w if a.split("=")[0] in flags]
    assert [len(p) for p in ports.values()] == [9, 6, 6]
    blocks = {1: (10000, 11263), 2: (11264, 12527), 3: (12528, 13791)}
    assert all(blocks[i][0] <= p <= blocks[i][1] for i, ps in ports.items() for p in ps), ports
    assert len({p for ps in ports.values() for p in ps}) == 21
    srun = stub.argv("srun.argv")
    assert {"--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--exclude=n1", "--gpus-per-node=4"} <= set(srun)
    assert stub.argv("srun-last.argv") == srun  # a clean end runs no sweep step
    env = stub.env("driver.env")
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == str(token)
    assert env["RAY_ADDRESS"] == f"127.0.0.1:{gcs}" and env["HF_HUB_OFFLINE"] == "1"
    assert (tmp_path / "stub-out" / "driver.cwd").read_text().strip() == str(tmp_path)
    assert not list((tmp_path / "nl").glob(f"hpcrl-{stub.job}*")) and not list(Path("/tmp").glob(f"hpcrl-{stub.job}.*"))


NASTY = "$(touch {p}/PWNED_{k}) `touch {p}/PWNED_{k}2` 'single' \"double\" $HOME ;|& * \\ end"
# Paths may name $VARS but no other `$` (a `$(...)` is refused with one line: see
# test_dollar_paren_in_a_path_is_refused); backticks, quotes and the rest stay literal.
PATH_NASTY = NASTY.split(") ", 1)[1]


def test_quoting_nothing_is_executed_values_arrive_verbatim(tmp_path):
    """Config and profile values with $(...), backticks, quotes, spaces and newlines reach the
    driver byte for byte, and nothing in them runs."""
    nasty = {k: NASTY.format(p=tmp_path, k=k) for k in ("model", "run", "ds", "wandb", "env", "mod")}
    nasty.update({k: PATH_NASTY.format(p=tmp_path, k=k) for k in ("hf", "root")})
    nasty["model"] += "\nsecond line"
    nasty["run"] += "\nnext line"
    workdir = tmp_path / PATH_NASTY.format(p="x", k="wd").replace("/", "_")
    stub = Stub(
        tmp_path,
        nodes=2,
        profile_env={"NASTY_ENV": nasty["env"] + "\nnl"},
        modules=[nasty["mod"]],
        hf_home=f"{tmp_path}/{nasty['hf']}",
    )
    cfg = tmp_path / "nasty.yaml"
    cfg.write_text(
        f"hpcrl: {{model: Qwen/Qwen2.5-0.5B, run_name: {yq(nasty['run'].replace('/', '_'))}, "
        f"run_root: {yq(str(tmp_path / nasty['root'].replace('/', '_')))}}}\n"
        f"model_name_or_path: {yq(nasty['model'])}\n"
        f"dataset_mixer_list: [{yq(nasty['ds'])}, '1.0']\n"
        f"wandb_project: {yq(nasty['wandb'])}\n"
        "response_length: 256\npack_length: 1024\nmax_prompt_token_length: 256\n"
    )
    rc, out = stub.run(stub.render(cfg, workdir=workdir))
    assert rc == 0, out
    assert not list(tmp_path.rglob("PWNED*")) and not list(Path.cwd().rglob("PWNED*")), out
    assert (tmp_path / "stub-out" / "driver.cwd").read_text().strip() == str(workdir).replace("$HOME", str(tmp_path))
    argv = stub.argv("driver.argv")
    args = argv[argv.index("--") + 3 :]
    assert args[args.index("--model_name_or_path") + 1] == nasty["model"]
    assert args[args.index("--dataset_mixer_list") + 1 : args.index("--dataset_mixer_list") + 3] == [nasty["ds"], "1.0"]
    assert args[args.index("--wandb_project") + 1] == nasty["wandb"]
    # Paths expand $VARS (HOME is tmp_path here) and nothing else; literals stay literal.
    home = str(tmp_path)
    run_dir = tmp_path / nasty["root"].replace("/", "_").replace("$HOME", home) / nasty["run"].replace("/", "_")
    assert args[args.index("--output_dir") + 1] == f"{run_dir}/output" and (run_dir / "hpcrl" / "jobs.tsv").exists()
    env = stub.env("driver.env")
    assert env["NASTY_ENV"] == nasty["env"] + "\nnl"
    assert env["HF_HOME"] == f"{tmp_path}/{nasty['hf']}".replace("$HOME", home)
    assert nasty["mod"] in out  # shown in the "no module command" warning, not run
    assert oi_parser("current").parse_args(args).model_name_or_path == nasty["model"]


@pytest.mark.parametrize("setting", ["hpcrl.run_root", "hpcrl.workdir"])
def test_dollar_paren_in_a_path_is_refused(setting, tmp_path):
    """render and submit agree: a `$(` in a path is one line and exit 2 (submit refused it, render
    wrote it as a literal directory)."""
    value = f"{tmp_path}/a$(touch {tmp_path}/PWNED)b"
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "render", "--nodes", "16", "--set", f"{setting}={value}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and f"{setting}: '{value}': '$' may only start a variable" in out.stderr
    assert not list(tmp_path.rglob("PWNED*"))


def test_env_setup_runs_verbatim(tmp_path):
    stub = Stub(tmp_path)
    script = stub.render(sets=['hpcrl.env_setup=["export FROM_SETUP=$((6 * 7))", "cd /"]'])
    rc, out = stub.run(script)
    assert rc == 0, out
    assert stub.env("driver.env")["FROM_SETUP"] == "42"


@pytest.mark.parametrize(
    "signal_name,marker,reason,continued",
    [("USR1", False, "timeout", True), ("TERM", False, "preempted", True), ("TERM", True, "cancelled", False)],
)
def test_signals_chain_per_run_dir_contract(tmp_path, signal_name, marker, reason, continued):
    import signal as sig

    stub = Stub(tmp_path)
    script = stub.render(sets=["hpcrl.max_restarts=2"])
    run_dir = tmp_path / "runs" / "grpo-olmo3-7b"
    proc = stub.start(script, STUB_DRIVER_SLEEP="120")
    wait_for(stub.out / "driver.argv")
    if marker:
        (run_dir / "hpcrl" / "cancel").write_text("")
    os.kill(proc.pid, getattr(sig, f"SIG{signal_name}"))
    out, _ = proc.communicate(timeout=60)
    events = stub.events(run_dir)
    assert events[0][1] == "start" and events[-1][1:] != []
    assert [e[3] for e in events if e[1] == "end"] == [f"{reason}:0"], out
    assert "stub driver: stopping" in out
    if continued:
        assert [e[3] for e in events if e[1] == "continue"] == ["4242"]
        assert (run_dir / "hpcrl" / "restarts").read_text().strip() == "1"
        assert stub.argv("sbatch.argv") == [
            "--parsable",
            f"--dependency=afterany:{stub.job}",
            str(run_dir / "hpcrl" / "job.sbatch"),
        ]
        env = stub.env("sbatch.env")
        assert not [k for k in env if k.startswith(("SLURM_JOB", "RAY_", "HPCRL_"))]
    else:
        assert not (stub.out / "sbatch.argv").exists() and all(e[1] != "continue" for e in events)


def test_a_term_with_a_node_slurm_counts_down_is_a_lost_node_not_a_preemption(tmp_path):
    """TERM while `sinfo -t down` lists n2 (as when slurmctld ends a job NODE_FAIL): the end is
    worker-died, n2 is blamed (slurm-node-down) and the failure continuation excludes it."""
    import signal as sig

    stub = Stub(tmp_path)
    script = stub.render()
    run_dir = tmp_path / "runs" / "grpo-olmo3-7b"
    proc = stub.start(script, STUB_DRIVER_SLEEP="120", STUB_DOWN_NODES="n2")
    wait_for(stub.out / "driver.argv")
    os.kill(proc.pid, sig.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    events = stub.events(run_dir)
    assert [e[3] for e in events if e[1] == "end"] == ["worker-died:95"], out  # the code docs/safety.md gives
    assert (run_dir / "hpcrl" / f"blame-{stub.job}").read_text().split() == ["n2", "slurm-node-down"]
    assert [a for a in stub.argv("sbatch.argv") if a.startswith("--exclude")] == ["--exclude=n2"]


def test_no_continuation_past_max_restarts(tmp_path):
    import signal as sig

    stub = Stub(tmp_path)
    script = stub.render(sets=["hpcrl.max_restarts=1"])
    run_dir = tmp_path / "runs" / "grpo-olmo3-7b"
    (run_dir / "hpcrl").mkdir(parents=True)
    (run_dir / "hpcrl" / "restarts").write_text("1\n")
    proc = stub.start(script, STUB_DRIVER_SLEEP="120")
    wait_for(stub.out / "driver.argv")
    os.kill(proc.pid, sig.SIGUSR1)
    out, _ = proc.communicate(timeout=60)
    assert "not continuing" in out and not (stub.out / "sbatch.argv").exists()
    assert [e[3] for e in stub.events(run_dir) if e[1] == "end"] == ["timeout:0"]


@pytest.mark.parametrize(
    "code,reason",
    [
        (3, "crashed"),
        (90, "breaker-zero-reward"),
        (93, "breaker-dead-worker"),
        (96, "breaker-grad-norm"),
        (97, "breaker-zero-variance"),
    ],
)
def test_driver_exit_codes_end_the_run(tmp_path, code, reason):
    stub = Stub(tmp_path)
    rc, out = stub.run(stub.render(), STUB_DRIVER_EXIT=str(code))
    assert rc == code, out
    events = stub.events(tmp_path / "runs" / "grpo-olmo3-7b")
    assert [e[1] for e in events] == ["start", "end"] and events[-1][3] == f"{reason}:{code}"
    assert not (stub.out / "sbatch.argv").exists()


def failure_continuation(stub: Stub, run_dir: Path, reason: str, blamed: str) -> None:
    """The job continued once, as a failure continuation: recorded, the blamed nodes excluded, after a back-off."""
    events = stub.events(run_dir)
    kinds = [e[1] for e in events]
    assert kinds[:2] == ["start", "end"] and events[1][3].startswith(f"{reason}:"), events
    assert kinds[2:] == ["failure", "continue"] and events[2][3] == f"{reason} {blamed}" and events[3][3] == "4242"
    argv = stub.argv("sbatch.argv")
    assert (
        f"--exclude={blamed}" in argv and "--begin=now+60" in argv and argv[-1] == str(run_dir / "hpcrl" / "job.sbatch")
    )
    assert (run_dir / "hpcrl" / "failure-restarts").read_text().strip() == "1"
    assert not (run_dir / "hpcrl" / "restarts").exists() or (run_dir / "hpcrl" / "restarts").read_text().strip() == "0"
    assert (run_dir / "hpcrl" / "excluded-nodes").read_text().split() == blamed.split(",")


def test_worker_that_cannot_start_is_retried_then_blamed(tmp_path):
    """`ray start` fails on both workers every time: each is retried (clean temp dir, back-off),
    then the job ends ray-start-failed and continues once without both nodes."""
    stub = Stub(tmp_path, nodes=3)
    # What a SIGKILLed worker leaves (srun --kill-on-bad-exit): its node-local dir with a Ray session.
    left = tmp_path / "nl" / f"hpcrl-{stub.job}.7"
    (left / "ray" / "session_1" / "logs").mkdir(parents=True, mode=0o700)
    (left / "ray" / "session_1" / "logs" / "raylet.out").write_text("raylet of a killed worker\n")
    (left / "ray" / "session_latest").symlink_to(left / "ray" / "session_1")
    rc, out = stub.run(stub.render(), timeout=60, STUB_RAY_WORKER_FAIL="1")
    assert rc == 1, out
    assert "the worker step (srun ... ray start on the other nodes) exited with code 1" in out
    sweep = stub.argv("srun-last.argv")  # the worker step failed: one more step sweeps the worker nodes
    assert {"--overlap", "--nodes=2", "--exclude=n1"} <= set(sweep), sweep
    assert f"[sweep] hpcrl: removed {left}, left by a worker that could not clean up" in out
    assert not left.exists()
    kept = list((tmp_path / "runs" / "grpo-olmo3-7b" / "logs" / "ray" / stub.job).glob("*/raylet.out"))
    # (the stub's pretend nodes share one node-local dir: one or both of them kept the log)
    assert kept and {k.read_text() for k in kept} == {"raylet of a killed worker\n"}, kept
    assert "ray start on n2 exited with code 1 (attempt 1 of 3); retrying in 2 s with a clean temp dir" in out
    assert "ray start on n2 failed 3 times" in out
    failure_continuation(stub, tmp_path / "runs" / "grpo-olmo3-7b", "ray-start-failed", "n2,n3")
    assert not (stub.out / "driver.argv").exists()


def test_worker_death_during_training_stops_the_driver(tmp_path):
    stub = Stub(tmp_path, nodes=2)
    rc, out = stub.run(stub.render(), timeout=60, STUB_DRIVER_SLEEP="120", STUB_RAY_WORKER_DIES_AFTER="3")
    assert rc == 95, out
    assert "the worker step exited while the driver was running" in out and "stub driver: stopping" in out
    assert "ray on n2 exited with code 1 while the driver was running (its raylet died)" in out
    assert "retrying" not in out  # no retry once the driver runs: its actors died with the raylet
    failure_continuation(stub, tmp_path / "runs" / "grpo-olmo3-7b", "worker-died", "n2")
    assert "No record of process" not in out


def test_head_death_during_training_stops_the_driver(tmp_path):
    stub = Stub(tmp_path, nodes=2)
    rc, out = stub.run(stub.render(), timeout=60, STUB_DRIVER_SLEEP="120", STUB_RAY_HEAD_DIES_AFTER="3")
    assert rc == 94, out
    assert "Ray's head on n1 (its GCS or raylet) exited while the driver was running" in out
    assert "stub driver: stopping" in out
    failure_continuation(stub, tmp_path / "runs" / "grpo-olmo3-7b", "ray-head-died", "n1")


def test_network_failure_in_the_driver_log_continues_without_blame(tmp_path):
    """The driver crashes with a libfabric error in its log: network-error, one failure continuation."""
    stub = Stub(tmp_path, nodes=2)
    run_dir = tmp_path / "runs" / "grpo-olmo3-7b"
    (run_dir / "hpcrl").mkdir(parents=True)
    (run_dir / "hpcrl" / "driver.log").write_text(
        "step 3\nNCCL WARN NET/OFI Request 0x1 completed with error. RC: -5. Error: Input/output error\n"
    )
    rc, out = stub.run(stub.render(), STUB_DRIVER_EXIT="1")
    assert rc == 1, out
    assert "the driver's log shows a network failure, not the run's own: libfabric:" in out
    events = stub.events(run_dir)
    assert [e[1] for e in events] == ["start", "end", "failure", "continue"] and events[1][3] == "network-error:1"
    assert events[2][3] == "network-error -" and "--begin=now+60" in stub.argv("sbatch.argv")


def test_oom_in_the_driver_log_is_the_runs_own_crash(tmp_path):
    stub = Stub(tmp_path, nodes=2)
    run_dir = tmp_path / "runs" / "grpo-olmo3-7b"
    (run_dir / "hpcrl").mkdir(parents=True)
    (run_dir / "hpcrl" / "driver.log").write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n"
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600000 milliseconds\n"
    )
    rc, out = stub.run(stub.render(), STUB_DRIVER_EXIT="1")
    assert rc == 1 and [e[3] for e in stub.events(run_dir) if e[1] == "end"] == ["crashed:1"]
    assert not (stub.out / "sbatch.argv").exists()


def test_failure_continuations_are_bounded_apart_from_time_limit_ones(tmp_path):
    stub = Stub(tmp_path, nodes=2)
    run_dir = tmp_path / "runs" / "grpo-olmo3-7b"
    (run_dir / "hpcrl").mkdir(parents=True)
    (run_dir / "hpcrl" / "failure-restarts").write_text("3\n")  # hpcrl.max_failure_restarts is 3
    rc, out = stub.run(stub.render(), timeout=60, STUB_DRIVER_SLEEP="120", STUB_RAY_HEAD_DIES_AFTER="3")
    assert rc == 94 and "not continuing after ray-head-died: 3 continuations of this kind submitted already" in out
    assert not (stub.out / "sbatch.argv").exists()


@pytest.mark.parametrize(
    "time_left,ckpt_after,stops",
    [("10:00", "2", "a checkpoint is complete"), ("0:40", None, "no checkpoint since the time-limit warning")],
)
def test_time_limit_warning_waits_for_the_next_checkpoint(tmp_path, time_left, ckpt_after, stops):
    """After USR1 the driver (which cannot save on a signal) runs on until the framework rewrites
    checkpoints/latest, then is stopped; with no checkpoint it is stopped while there is time to stop."""
    import signal as sig

    stub = Stub(tmp_path)
    run_dir = tmp_path / "runs" / "grpo-olmo3-7b"
    env = {"STUB_DRIVER_SLEEP": "120", "STUB_TIME_LEFT": time_left}
    if ckpt_after:
        env["STUB_CKPT_AFTER"] = ckpt_after
    proc = stub.start(stub.render(), **env)
    wait_for(stub.out / "driver.argv")
    os.kill(proc.pid, sig.SIGUSR1)
    out, _ = proc.communicate(timeout=60)
    assert f"stopping the driver: {stops}" in out, out
    assert "stub driver: stopping" in out
    assert [e[3] for e in stub.events(run_dir) if e[1] == "end"] == ["timeout:0"]
    if ckpt_after:
        assert "the driver goes on until its next checkpoint is complete" in out
        assert (run_dir / "checkpoints" / "latest").read_text().strip() == "global_step7"


@pytest.mark.parametrize(
    "version,ok", [("2.49.2", False), ("2.51.9", False), ("1.13.0", False), ("2.52.0", True), ("3.0.1", True)]
)
def test_ray_below_2_52_never_starts(tmp_path, version, ok):
    """The version gate on the head and on every worker: below 2.52 no `ray start` runs anywhere."""
    stub = Stub(tmp_path, nodes=2)
    rc, out = stub.run(stub.render(smoke=True), timeout=60, STUB_RAY_VERSION=version)
    started = sorted(p.name for p in stub.out.glob("ray-*.argv"))
    if ok:
        assert rc == 0 and started == ["ray-n1.argv", "ray-n2.argv"], out
        return
    assert rc == 1 and started == [], out
    assert f"Ray {version} on n1 ignores token authentication (needs Ray >= 2.52)" in out
    events = stub.events(tmp_path / "runs" / "grpo-olmo3-7b")
    assert events[-1][3] == "setup-failed:1"  # the environment's fault: no continuation
    assert not (stub.out / "sbatch.argv").exists()


def test_node_local_path_others_may_write_is_refused_without_blame(tmp_path):
    """The node-local path is world-writable without the sticky bit (anyone could rename the
    job's directory away): the job ends node-local-unsafe naming it, before Ray starts, with no
    node blamed and no continuation."""
    stub = Stub(tmp_path, nodes=2)
    script = stub.render(smoke=True)
    (tmp_path / "nl").mkdir()
    (tmp_path / "nl").chmod(0o777)
    rc, out = stub.run(script, timeout=60)
    assert rc == 1 and f"{tmp_path / 'nl'} (in the node-local path" in out and "is mode 777" in out, out
    events = stub.events(tmp_path / "runs" / "grpo-olmo3-7b")
    assert [(e[1], e[3]) for e in events[1:]] == [("end", "node-local-unsafe:1")], events
    assert not (stub.out / "ray-n1.argv").exists() and not list((tmp_path / "nl").iterdir())


def test_smoke_in_container(tmp_path):
    stub = Stub(tmp_path, nodes=2)
    rc, out = stub.run(stub.render(smoke=True, sets=["hpcrl.container=$HOME/oi image.sif"]))
    assert rc == 0, out
    assert "hpcrl-smoke: ok nodes=stub" in out
    argv = stub.argv("driver.argv")
    assert argv[:2] == ["-m", "hpcrl.runtime.smoke"] and "--learners" in argv
    images = set((stub.out / "apptainer.images").read_text().splitlines())
    assert images == {f"{tmp_path}/oi image.sif"}


@pytest.mark.parametrize(
    "sets,started",
    [
        ([], False),
        (['dataset_mixer_list=["my-org/rlvr_code_stdio", "1.0"]'], True),
        (['dataset_mixer_list=["my-org/rlvr_code_stdio", "1.0"]', "hpcrl.code_server=off"], False),
        (["code_api_url=http://localhost:1234/test_program"], True),
        (["code_api_url=http://codebox.example:8070/test_program", 'dataset_mixer_list=["x/code", "1.0"]'], False),
        (["hpcrl.code_server=on"], True),
    ],
)
def test_code_server_follows_the_config(sets, started):
    """open-instruct posts code/code_stdio samples to code_api_url (data_loader.py:467): hpcrl starts
    the server when the datasets look like code verifiers or the URL is on localhost, never when
    the URL points elsewhere or hpcrl.code_server is off."""
    rp = make_run_plan("grpo-olmo3-7b", nodes=4, sets=sets)
    text = render_script(describe_job(rp))
    assert ("start_code_server" in text) == started
    if started:
        fixed = any("code_api_url=" in s for s in sets)
        assert ("export HPCRL_CODE_SERVER_PORT=1234" in text) == fixed
        assert ("export CODE_API_URL=" in text) == (not fixed)
        assert "--host 127.0.0.1" in text


def test_code_server_on_with_a_remote_url_is_refused():
    with pytest.raises(Exception, match="not on localhost"):
        make_run_plan(
            "grpo-olmo3-7b",
            nodes=4,
            sets=["hpcrl.code_server=on", "code_api_url=http://codebox.example:8070/test_program"],
        )


def test_code_server_on_for_verl_is_refused():
    with pytest.raises(Exception, match="calls no code-execution server"):
        make_run_plan("verl-grpo-qwen2.5-7b", nodes=2, sets=["hpcrl.code_server=on"])


def test_watchdog_settings_reach_the_driver_command():
    """hpcrl.reward_keys and the stalled-learning breakers' step counts are the watchdog's flags."""
    text = render(
        "isambard-ai",
        "grpo-olmo3-7b",
        4,
        sets=(
            "hpcrl.reward_keys=[grpo_actor/task_reward/avg, my reward]",
            "hpcrl.grad_norm_steps=0",
            "hpcrl.zero_variance_steps=7",
        ),
    )
    words = driver_words(text)
    head = words[: words.index("--", words.index("hpcrl.runtime.watchdog"))]
    assert head[head.index("--grad-norm-steps") + 1] == "0" and head[head.index("--zero-variance-steps") + 1] == "7"
    assert [head[i + 1] for i, w in enumerate(head) if w == "--reward-key"] == [
        "grpo_actor/task_reward/avg",
        "my reward",
    ]
