"""Files a user points hpcrl at (issue 39): a config or model config that is the wrong shape, encoding or kind of
file, or holds a number nothing can be sized from, is one line and exit 2 (each was a traceback, or a read until
memory ran out); a checkpoint tree that cannot be deleted likewise."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, assert_user_error

SHIPPED = ROOT / "configs" / "grpo-olmo3-32b.yaml"


def hpcrl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m hpcrl` held to 2 GiB of address space and 60 s: a command that reads a device until memory
    runs out fails here instead of taking the machine with it."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    try:
        return subprocess.run(
            [sys.executable, "-m", "hpcrl", *args],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=limit,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hpcrl {' '.join(args)} still ran after 60 s")


def _config(tmp_path: Path, text: str | bytes, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


@pytest.mark.parametrize("section, kind", [("\n  - a\n  - b\n", "a list"), (" just-a-name\n", "a string")])
def test_an_hpcrl_section_that_is_no_mapping_is_one_line(tmp_path, section, kind):
    cfg = _config(tmp_path, f"hpcrl:{section}model_name_or_path: allenai/Olmo-3-1025-7B\n")
    assert_user_error(hpcrl("plan", "--config", cfg), f"{cfg}: hpcrl: {kind}")


def test_a_utf16_config_is_one_line_saying_so(tmp_path):
    cfg = _config(tmp_path, "hpcrl:\n  nodes: 2\n".encode("utf-16"))
    assert_user_error(hpcrl("plan", "--config", cfg), "not UTF-8 text (UTF-16: save it as UTF-8)")


def test_a_binary_config_is_one_line(tmp_path):
    cfg = _config(tmp_path, bytes(range(128, 256)) * 4)
    assert_user_error(hpcrl("render", "--config", cfg), f"{cfg}: byte 0: not UTF-8 text")


def test_a_config_that_cannot_be_read_is_one_line(tmp_path):
    if os.geteuid() == 0:  # root reads a mode-000 file: a file whose read fails (EIO) stands in
        cfg, why = "/proc/self/mem", "cannot read it: Input/output error"
    else:
        cfg, why = _config(tmp_path, "hpcrl:\n  nodes: 2\n"), "cannot read it: Permission denied"
        os.chmod(cfg, 0)
    assert_user_error(hpcrl("plan", "--config", cfg), f"{cfg}: {why}")


def test_a_step_count_of_1e20_is_refused_where_it_is_written(tmp_path):
    text = SHIPPED.read_text()
    cfg = _config(tmp_path, text.replace("\ntotal_episodes:", "\ntotal_episodes: 100000000000000000000\n#", 1))
    assert "total_episodes: 100000000000000000000" in Path(cfg).read_text()
    assert_user_error(hpcrl("plan", "--config", cfg), f"{cfg}: total_episodes 100000000000000000000: ")


def test_a_model_config_with_no_attention_heads_is_one_line(tmp_path):
    model = _config(
        tmp_path,
        '{"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, '
        '"num_attention_heads": 0, "vocab_size": 32000}',
        "config.json",
    )
    assert_user_error(hpcrl("plan-memory", "--model", model), "num_attention_heads 0: valid: a whole number from 1")


def test_a_model_config_with_a_text_count_is_one_line(tmp_path):
    model = _config(
        tmp_path,
        '{"hidden_size": "4k", "intermediate_size": 11008, "num_hidden_layers": 32, '
        '"num_attention_heads": 32, "vocab_size": 32000}',
        "config.json",
    )
    assert_user_error(hpcrl("plan-memory", "--model", model), "hidden_size '4k': valid: a whole number")


def test_a_model_that_is_a_fifo_or_a_device_is_not_read(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    assert_user_error(hpcrl("plan-memory", "--model", str(fifo)), "not a regular file")
    assert_user_error(hpcrl("plan-memory", "--model", "/dev/zero"), "/dev/zero: not a regular file")


def test_a_shipped_config_named_with_its_suffix_is_pointed_to_by_name(tmp_path):
    err = assert_user_error(hpcrl("plan", "--config", "grpo-olmo3-7b.yaml", cwd=tmp_path), "no such config file")
    assert err.endswith("the shipped config of that name is --config grpo-olmo3-7b")


def test_set_hpcrl_itself_says_the_section_is_set_key_by_key():
    err = assert_user_error(hpcrl("plan", "--set", "hpcrl=3"), "--set hpcrl: ")
    assert "open-instruct argument" not in err and "--set hpcrl.KEY=VALUE" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only file system needs root")
def test_prune_on_a_read_only_tree_is_one_line_and_deletes_nothing(tmp_path):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        old = time.time() - 3 * 3600
        for step in (200, 400, 600):
            d = mnt / "output_checkpoints" / f"step_{step}"
            d.mkdir(parents=True)
            (d / "model.safetensors").write_bytes(b"\0" * 1000)
            (d / ".checkpoint_complete").write_bytes(b"")
            for p in (d / "model.safetensors", d / ".checkpoint_complete", d):
                os.utime(p, (old, old))
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        out = hpcrl("checkpoints", "prune", str(mnt), "--keep", "1", "--yes")
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        first = out.stderr.strip().removeprefix(f"hpcrl: error: cannot delete {mnt / 'output_checkpoints'}/step_")
        assert first in (
            "200: Read-only file system; nothing was deleted",
            "400: Read-only file system; nothing was deleted",
        ), out.stderr
        assert sorted(p.name for p in (mnt / "output_checkpoints").iterdir()) == ["step_200", "step_400", "step_600"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
