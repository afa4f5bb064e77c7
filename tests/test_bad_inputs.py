"""Inputs hpcrl once took silently (issue 27): each is one line on stderr and exit 2, or a bare group's help."""

from __future__ import annotations

import subprocess
import sys

import pytest


def hpcrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, timeout=120)


def refused(*args: str) -> str:
    """The one-line error of a command that must exit 2."""
    out = hpcrl(*args)
    lines = out.stderr.strip().splitlines()
    assert (out.returncode, len(lines), out.stdout) == (2, 1, ""), out.stderr
    assert lines[0].startswith("hpcrl: error: ")
    return lines[0]


def test_an_unclosed_yaml_list_in_set_is_refused_not_taken_as_a_string():
    err = refused("plan", "--set", "dataset_mixer_list=[unclosed")
    assert "--set dataset_mixer_list: '[unclosed' is not a YAML value" in err


def test_a_key_given_twice_in_a_config_is_refused_with_its_line(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("hpcrl:\n  nodes: 2\n  nodes: 4\nmodel_name_or_path: allenai/Olmo-3-1025-7B\n")
    assert "run.yaml: line 3: key 'nodes' given twice" in refused("plan", "--config", str(cfg))


def test_a_top_level_key_given_twice_is_refused(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("beta: 0.0\nhpcrl:\n  nodes: 2\nbeta: 0.1\n")
    assert "line 4: key 'beta' given twice" in refused("plan", "--config", str(cfg))


@pytest.mark.parametrize("pin", ["learners=0", "engines=0", "tp=-1", "util=0", "util=1.5"])
def test_a_pin_outside_its_range_is_refused(pin):
    assert f"--pin '{pin}': valid: " in refused("plan", "--pin", pin)


def test_a_pin_given_twice_is_refused():
    assert "--pin learners given twice (2, 3)" in refused("plan", "--pin", "learners=2", "--pin", "learners=3")


@pytest.mark.parametrize("value", ['"0"', "0", "0:00:00"])
def test_a_zero_wall_time_is_refused_as_slurm_reads_it_as_no_limit(value):
    assert "Slurm reads a zero time as no limit" in refused("render", "--set", f"hpcrl.time={value}")


@pytest.mark.parametrize("path", ["/dev/null", "/tmp"])
def test_a_config_path_that_is_no_file_says_what_it_is(path):
    err = refused("plan", "--config", path)
    assert "no such" not in err and "a run config is a YAML file" in err


def test_a_negative_lora_rank_names_the_value_not_a_framework():
    err = refused("plan-memory", "--lora-rank", "-1")
    assert "'--lora-rank'" in err and "open-instruct" not in err


@pytest.mark.parametrize(
    "group, command", [((), "plan-disk"), (("clusters",), "validate"), (("checkpoints",), "prune")]
)
def test_a_bare_group_prints_its_help(group, command):
    out = hpcrl(*group)
    assert out.returncode == 2 and "Usage: hpcrl" in out.stderr and f"  {command}" in out.stderr
