"""Values hpcrl once took without a word, and messages that pointed the wrong way (issue 39): each is now one line
naming the flag or key and what is valid, exit 2."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from helpers import ROOT, assert_user_error, ok_json, run_hpcrl


def refused(*args: str) -> str:
    return assert_user_error(run_hpcrl(*args), "")


@pytest.mark.parametrize(
    "setting, words",
    [
        ("temperature=-1.0", "--set temperature -1.0: valid: a positive temperature"),
        ("save_freq=-5", "--set save_freq -5: valid: -1 or 0 (never save the model) or a positive number of steps"),
        ('dataset_mixer_list=["ai2-adapt-dev/rlvr_gsm8k_zs"]', "1 items; valid: pairs of a dataset and its amount"),
        ('dataset_mixer_list=["a", "all"]', "'a' has the amount 'all'; valid: a number of samples"),
        ("hpcrl.time=12:61:00", "hpcrl.time '12:61:00': minutes and seconds run 0 to 59"),
        ("hpcrl.nodes=true", "--set hpcrl.nodes: true is not a number"),
    ],
)
def test_a_value_the_framework_or_slurm_would_refuse_is_refused_here(setting, words):
    assert words in refused("plan", "--set", setting)


def test_an_infinite_beta_in_a_file_names_the_key_and_the_file(tmp_path):
    cfg = tmp_path / "run.yaml"
    text = (ROOT / "configs" / "grpo-olmo3-32b.yaml").read_text()
    assert "\nbeta: 0.0\n" in text
    cfg.write_text(text.replace("\nbeta: 0.0\n", "\nbeta: .inf\n"))
    assert f"{cfg}: beta inf: not a number a run can use" in refused("plan", "--config", str(cfg))


@pytest.mark.parametrize(
    "args, words",
    [
        (("plan", "--set", "beta=0.0", "--set", "beta=0.5"), "--set beta given twice (0.0, 0.5); give it once"),
        (
            ("runs", "--registry", "/tmp/a.db", "--registry", "/tmp/b.db"),
            "--registry given twice (/tmp/a.db, /tmp/b.db)",
        ),
        (("plan", "-N", "4", "--nodes", "8"), "-N / --nodes given twice (4, 8)"),
        (("plan-memory", "--ref-policy", "--no-ref-policy"), "--ref-policy / --no-ref-policy given twice (on, off)"),
    ],
)
def test_a_single_valued_option_given_twice_is_refused_as_a_repeated_pin_is(args, words):
    assert words in refused(*args)


@pytest.mark.parametrize(
    "args, words",
    [
        (("plan-memory", "--zpg", "0"), "--zpg must be a positive integer (1: no ZeRO++ secondary copy), got 0"),
        (("plan-memory", "--learner-gpus", "100000"), "--learner-gpus 100,000: isambard-ai has 5,448 GPUs in all"),
        (("diagnose", "README.md", "--learner-gpus", "0"), "--learner-gpus must be a positive integer, got 0"),
        (("plan", "--cluster", "berzelius:"), "cluster 'berzelius:': no variant after ':'"),
    ],
)
def test_a_count_outside_what_can_be_is_refused(args, words):
    assert words in refused(*args)


def test_clusters_validate_checks_the_time_limit_render_would_refuse(tmp_path):
    profile = tmp_path / "mine.yaml"
    text = (ROOT / "clusters" / "local-dev.yaml").read_text()
    assert "max_time:" in text
    profile.write_text(text.replace("max_time:", "max_time: banana #", 1))
    err = refused("clusters", "validate", str(profile))
    assert "max_time: 'banana'" in err and "hpcrl.time" not in err


def test_plan_memory_can_turn_gradient_checkpointing_on_for_a_framework_whose_default_is_off():
    """OpenRLHF's default is off: a 32B LoRA learner on 4 GPUs keeps every activation (~167 GiB) unless the flag
    turns checkpointing on, when only each layer's input stays: 8,192 tokens x 5,120 x 64 layers x 2 bytes = 5 GiB."""
    base = ("plan-memory", "--backend", "openrlhf", "-m", "32b", "--lora-rank", "16", "--learner-gpus", "4", "--json")
    off, on = ok_json(run_hpcrl(*base)), ok_json(run_hpcrl(*base, "--gradient-checkpointing"))
    stored = on["learner"]["breakdown"]["activations (stored)"]
    assert 8192 * 5120 * 64 * 2 / 2**30 <= stored < off["learner"]["breakdown"]["activations (stored)"] / 10
    assert on["fits"] and not off["fits"]
    assert any(
        "gradient checkpointing on: --gradient-checkpointing on the command line" in a for a in on["assumptions"]
    )


def test_a_registry_row_that_cannot_be_shown_is_shown_as_damaged(tmp_path):
    db = tmp_path / "runs.db"
    env = {**os.environ, "HPCRL_REGISTRY": str(db), "PROJECTDIR": str(tmp_path)}
    made = subprocess.run(
        [sys.executable, "-m", "hpcrl", "submit", "--dry-run", "--cluster", "local-dev", "--nodes", "3", "--smoke"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert made.returncode == 0, made.stderr
    with sqlite3.connect(db) as c:  # a run dir with a NUL byte: no path can be opened from it
        c.execute(
            "INSERT INTO runs SELECT 'bad-1', name, cluster, config_hash, script_path, run_dir || char(0), "
            "created, 'pending', '', max_restarts, updated FROM runs"
        )
        c.execute("INSERT INTO jobs VALUES ('bad-1', 1, '123', 'PENDING', '', NULL, 'now', NULL)")
    for args in (("runs", "--json"), ("status", "--all", "--json")):
        out = subprocess.run(
            [sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, timeout=120, env=env
        )
        assert out.returncode == 0, out.stderr
        bad = [r for r in json.loads(out.stdout)["runs"] if r["run_id"] == "bad-1"]
        assert bad and "embedded null byte" in bad[0]["damaged"], out.stdout


def test_every_setting_a_flag_turns_on_a_flag_turns_off():
    """An on/off option whose default is the config's or the framework's (None) has both spellings:
    plan-memory had --no-gradient-checkpointing but no --gradient-checkpointing, so OpenRLHF's usual run
    (checkpointing on, its default off) could not be said without a config file."""
    from typer.main import get_command

    from hpcrl.cli import app
    from hpcrl.cli.commands import load

    load([])  # every command module registers itself

    def commands(cmd, path: str):  # typer vendors its own click: its classes are not click's
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from commands(sub, f"{path} {name}")

    one_sided = [
        f"{path} {p.opts[0]}"
        for path, cmd in commands(get_command(app), "hpcrl")
        for p in cmd.params
        if getattr(p, "is_flag", False) and p.default is None and not p.secondary_opts
    ]
    assert one_sided == []
