"""`hpcrl check-stack`: the job's stack check on the login node, against an environment made here.

What is stood in: the frameworks cannot be imported without torch, so an environment is a folder on the
training Python's path holding the release's own METADATA headers (tests/data/releases/, the wheel's
header lines; the long description is left out) and, for each other package its install asks for, a
metadata-only distribution and an empty package that raises if imported (the check imports nothing). The
frameworks' parsers are rebuilt from hpcrl's table of the same release: verl's Hydra config tree from
data/verl/0.9.1/args.json (every key at its default), OpenRLHF's argparse block from data/openrlhf/0.11.2/
args.json; Hydra and argparse themselves are real. The training Python is a shell wrapper that puts the folder
on PYTHONPATH. Where `pip download` reaches PyPI, the real wheels are installed and checked too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "hpcrl" / "planning" / "backends" / "data"
RELEASES = Path(__file__).with_name("data") / "releases"
STAND_INS = {
    "verl": {
        "TransferQueue": ("0.1.10", "transfer_queue"),
        "ray": ("2.55.0", "ray"),
        "vllm": ("0.24.0", "vllm"),
        "torch": ("2.11.0", "torch"),
        "transformers": ("5.9.0", "transformers"),
    },
    "openrlhf": {
        "ray": ("2.55.0", "ray"),
        "vllm": ("0.29.0", "vllm"),
        "deepspeed": ("0.19.6", "deepspeed"),
        "torch": ("2.11.0", "torch"),
        "transformers": ("5.15.0", "transformers"),
    },
}


def hpcrl(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
    )


def dist(site: Path, name: str, version: str, module: str, metadata: str | None = None) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(metadata or f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (site / module).mkdir(exist_ok=True)
    if not (site / module / "__init__.py").exists():
        (site / module / "__init__.py").write_text("raise ImportError('the stack check must not import me')\n")


def verl_config_tree(table: dict) -> dict:
    """verl's config as a nested mapping, every key of hpcrl's table at its default."""
    tree: dict = {}
    for key, facts in table.items():
        if key.startswith("_"):
            continue
        *parents, leaf = key.split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        try:
            node[leaf] = yaml.safe_load(facts["default"])
        except yaml.YAMLError:
            node[leaf] = facts["default"]
    return tree


def argparse_block(table: dict) -> str:
    """An entry file whose __main__ block builds OpenRLHF's parser from hpcrl's table of the release."""
    lines = ["import argparse", "", "if __name__ == '__main__':", "    parser = argparse.ArgumentParser()"]
    for flag, f in table.items():
        if flag.startswith("_"):
            continue
        if f.get("action") in ("store_true", "store_false"):
            lines.append(f"    parser.add_argument('--{flag}', action='{f['action']}')")
            continue
        kind = f.get("element_type", f["type"]) if f["type"] == "list" else f["type"]
        kw = [f"type={kind}"] if kind in ("int", "float") else []
        if f.get("nargs") is not None:
            kw.append(f"nargs={f['nargs']!r}")
        if f.get("choices"):
            kw.append(f"choices={f['choices']!r}")
        lines.append(
            f"    parser.add_argument('--{flag}', {', '.join(kw)})" if kw else f"    parser.add_argument('--{flag}')"
        )
    lines.append("    args = parser.parse_args()")
    return "\n".join(lines) + "\n"


def environment(tmp_path: Path, backend: str, version: str, drop: tuple[str, ...] = (), folder: str = "env") -> str:
    """A stand-in environment of `backend` at `version`; its training Python's path."""
    site = tmp_path / folder / "site"
    release = {"verl": "0.9.1", "openrlhf": "0.11.2"}[backend]
    meta = (
        (RELEASES / f"{backend}-{release}.METADATA")
        .read_text()
        .replace(f"Version: {release}\n", f"Version: {version}\n")
    )
    dist(site, backend, version, backend, meta)
    for name, (ver, module) in STAND_INS[backend].items():
        if name not in drop:
            dist(site, name, ver, module)
    if backend == "verl":
        conf = site / "verl" / "trainer" / "config"
        conf.mkdir(parents=True)
        table = json.loads((DATA / "verl" / release / "args.json").read_text())
        (conf / "ppo_trainer.yaml").write_text(yaml.safe_dump(verl_config_tree(table)))
    else:
        (site / "openrlhf" / "cli").mkdir(parents=True)
        (site / "openrlhf" / "__init__.py").write_text("")
        table = json.loads((DATA / "openrlhf" / release / "args.json").read_text())
        (site / "openrlhf" / "cli" / "train_ppo_ray.py").write_text(argparse_block(table))
    python = tmp_path / folder / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return str(python)


VERL = ["--config", "verl-grpo-qwen2.5-7b", "--set", "hpcrl.framework_version=0.9.1"]
ORL = ["--config", "openrlhf-grpo-qwen2.5-7b", "--set", "hpcrl.framework_version=0.11.2"]


def lines(out: subprocess.CompletedProcess, kind: str) -> list[str]:
    return [ln for ln in out.stdout.splitlines() if ln.startswith(f"stack: {kind}")]


def test_a_verl_0_9_1_environment_passes_with_its_real_overrides_composed(tmp_path):
    out = hpcrl("check-stack", *VERL, "--python", environment(tmp_path, "verl", "0.9.1"))
    assert (
        out.returncode,
        lines(out, "warning"),
        len(lines(out, "ok:")),
        any("Hydra composed ppo_trainer" in ln for ln in lines(out, "note")),
    ) == (0, [], 1, True), out.stdout


def test_an_openrlhf_0_11_2_environment_passes_with_its_flags_parsed(tmp_path):
    out = hpcrl("check-stack", *ORL, "--python", environment(tmp_path, "openrlhf", "0.11.2"))
    assert (out.returncode, lines(out, "warning"), len(lines(out, "ok:"))) == (0, [], 1), out.stdout


def test_a_missing_package_is_what_the_job_would_stop_for(tmp_path):
    out = hpcrl("check-stack", *VERL, "--python", environment(tmp_path, "verl", "0.9.1", drop=("TransferQueue",)))
    assert (out.returncode, out.stdout.splitlines()[0]) == (
        98,
        (
            "stack: transfer_queue not installed; verl 0.9.1 runs trainer.use_v1=true, which imports it "
            "(verl/trainer/main_ppo.py:137)"
        ),
    )


def test_a_key_the_installed_release_rejects_stops_though_the_targeted_one_has_it(tmp_path):
    """router_replay.* exist at 1dda039b and not in 0.9.1 (the add-release diff): the plan targets 1dda039b,
    the environment holds 0.9.1, whose Hydra config rejects the override."""
    out = hpcrl(
        "check-stack",
        "--config",
        "verl-grpo-qwen2.5-7b",
        "--set",
        "hpcrl.framework_version=1dda039b",
        "--set",
        "actor_rollout_ref.actor.router_replay.mode=disabled",
        "--python",
        environment(tmp_path, "verl", "0.9.1"),
    )
    first = out.stdout.splitlines()[0]
    assert (
        out.returncode,
        first.startswith("stack: verl 0.9.1 rejects the driver's command line: "),
        "actor_rollout_ref.actor.router_replay" in first,
    ) == (98, True, True), out.stdout


def test_a_patch_release_is_a_warning_and_exit_0(tmp_path):
    out = hpcrl("check-stack", *VERL, "--python", environment(tmp_path, "verl", "0.9.2"))
    assert (out.returncode, lines(out, "warning")) == (
        0,
        [
            "stack: warning: verl 0.9.2 installed, a patch release hpcrl has not read: checked against 0.9.1, the "
            "nearest of the same minor release"
        ],
    )


def test_a_python_slower_than_the_probe_timeout_is_no_mismatch(tmp_path):
    """As a cold shared file system: it answers after 6 s; --probe-timeout 1 (default 60) stands for 70 s."""
    python = environment(tmp_path, "verl", "0.9.1")
    slow = tmp_path / "slow" / "python"
    slow.parent.mkdir()
    slow.write_text(f'#!/bin/sh\nsleep 6\nexec "{python}" "$@"\n')
    slow.chmod(0o755)
    out = hpcrl("check-stack", *VERL, "--python", str(slow), "--probe-timeout", "1")
    assert (out.returncode, out.stdout.splitlines()[0]) == (
        0,
        (
            f"stack: unchecked: the training Python {slow} could not be probed (no answer within 1 s); the check could "
            "not run, the job goes on without it"
        ),
    )


def test_a_python_under_a_path_with_a_space_is_checked(tmp_path):
    out = hpcrl("check-stack", *VERL, "--python", environment(tmp_path, "verl", "0.9.1", folder="my env"))
    assert (out.returncode, len(lines(out, "ok:"))) == (0, 1), out.stdout + out.stderr


def test_without_python_the_run_s_own_after_its_env_setup(tmp_path):
    """hpcrl.python names the interpreter; the run's env_setup puts the environment on its path."""
    environment(tmp_path, "verl", "0.9.1")
    site = tmp_path / "env" / "site"
    out = hpcrl(
        "check-stack",
        *VERL,
        "--set",
        f"hpcrl.python={sys.executable}",
        "--set",
        f'hpcrl.env_setup=["export PYTHONPATH={site}"]',
        "--cluster",
        "local-dev",
    )
    assert (out.returncode, len(lines(out, "ok:"))) == (0, 1), out.stdout + out.stderr


def test_an_unknown_python_path_is_one_line_and_exit_2(tmp_path):
    out = hpcrl("check-stack", *VERL, "--python", str(tmp_path / "nope" / "python"))
    assert (out.returncode, out.stderr.strip()) == (
        2,
        f"hpcrl: error: --python {tmp_path}/nope/python: no such file; "
        "give the training environment's python (e.g. ENV/bin/python)",
    )


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """The real release wheels, where PyPI is reachable (else the tests below are skipped)."""
    d = tmp_path_factory.mktemp("wheels")
    got = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(d), "verl==0.9.1", "openrlhf==0.11.2"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    if got.returncode != 0 or len(list(d.glob("*.whl"))) != 2:
        pytest.skip(f"pip download of the release wheels failed: {(got.stderr.strip().splitlines() or [''])[-1]}")
    return d


@pytest.mark.parametrize("backend,args", [("verl", VERL), ("openrlhf", ORL)])
def test_the_real_release_as_pip_installs_it_passes(tmp_path, wheels, backend, args):
    """The release's wheel unpacked as pip leaves it (its own config tree and parser), the packages its install
    would bring stood in; Hydra and the stdlib parser from this environment."""
    site = tmp_path / "site"
    wheel = next(wheels.glob(f"{backend}-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path / "w")
    purelib = next((tmp_path / "w").glob("*.data/purelib"), tmp_path / "w")
    shutil.copytree(purelib / backend, site / backend)
    shutil.copytree(next((tmp_path / "w").glob("*.dist-info")), site / next((tmp_path / "w").glob("*.dist-info")).name)
    for name, (ver, module) in STAND_INS[backend].items():
        dist(site, name, ver, module)
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    out = hpcrl("check-stack", *args, "--python", str(python))
    assert (out.returncode, lines(out, "warning"), len(lines(out, "ok:"))) == (0, [], 1), out.stdout + out.stderr
