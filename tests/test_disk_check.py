"""render/submit refuse checkpoints that overflow the run root's quota, naming what fits."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def hpcrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, timeout=120)


# Berzelius' project quota is 2,000 GiB; OLMo 3 7B's ZeRO-3 state is 12 B x 7.3e9 = 88 GB.
OVERFLOW = ["--cluster", "berzelius:fat", "--nodes", "4", "--config", "grpo-olmo3-7b",
            "--set", "keep_last_n_checkpoints=-1", "--set", "checkpoint_state_freq=1"]


def test_render_refuses_overflowing_checkpoints_and_writes_nothing(tmp_path):
    out_file = tmp_path / "job.sh"
    out = hpcrl("render", *OVERFLOW, "-o", str(out_file))
    assert out.returncode == 2
    assert "quota is 2,000 GiB" in out.stderr and "would fit: --set keep_last_n_checkpoints=" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not out_file.exists()


def test_each_suggested_setting_renders(tmp_path):
    err = hpcrl("render", *OVERFLOW).stderr
    suggestions = re.findall(r"--set (\w+=\d+)", err)
    assert suggestions
    for setting in suggestions:
        # A later --set of the same key wins, so the suggestion replaces the overflowing value.
        out = hpcrl("render", *OVERFLOW, "--set", setting)
        assert out.returncode == 0, (setting, out.stderr)


def test_force_disk_renders_anyway():
    out = hpcrl("render", *OVERFLOW, "--set", "hpcrl.force_disk=true")
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --nodes=4" in out.stdout


def test_smoke_writes_no_checkpoints_so_is_not_refused():
    assert hpcrl("render", *OVERFLOW, "--smoke").returncode == 0


# The users' OpenRLHF LoRA run (seed 000) on a 1 TB (931 GiB) quota: ZeRO-3, LoRA r=64 on the 101.6B model
# their figures imply (tests/data/models/seed000-100b), --ckpt.save_hf (was --save_hf_ckpt), ckpt.max_num 3.
GIB = 1024**3
MIB = 1024**2
SEED_P, SEED_LORA64 = 101_613_905_920, 985_661_440  # by hand in tests/test_disk.py
USERS = ["--config", "openrlhf-grpo-qwen2.5-7b", "--nodes", "8",
         "--set", "actor.model_name_or_path=" + str(Path(__file__).parent / "data" / "models" / "seed000-100b"),
         "--set", "ds.lora.rank=64", "--set", "ckpt.save_hf=true"]


def one_tb_profile(tmp_path: Path) -> list[str]:
    text = (Path(__file__).parents[1] / "clusters" / "isambard-ai.yaml").read_text()
    path = tmp_path / "isambard-1tb.yaml"
    path.write_text(text.replace("quota_gib: 204800", "quota_gib: 931"))
    return ["--cluster-file", str(path)]


def test_users_openrlhf_lora_run_with_full_hf_saves_is_refused_with_what_fits(tmp_path):
    """With the full-model HF saves the users saw (hpcrl.lora_hf_save full) and no known step count, the run
    reaches its retention limit: three DeepSpeed states (frozen base in bf16 + 12 B per LoRA parameter), the three
    203 GB HF saves made with them (never deleted), the final one and the 203 GB model cache do not fit 931 GiB;
    ckpt.max_num 1 (one state, one HF save) or adapter-only saves would."""
    prof = one_tb_profile(tmp_path)
    out = hpcrl("render", *USERS, *prof, "--set", "hpcrl.lora_hf_save=full")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    state = 2 * SEED_P + 12 * SEED_LORA64  # plus under 0.1% of small per-rank files
    full = 2 * SEED_P + 20 * MIB
    peak = float(re.search(r"need ([\d,]+) GiB at peak", out.stderr).group(1).replace(",", ""))
    assert abs(peak - (3 * state + 4 * full + 2 * SEED_P) / GIB) < 2
    assert "quota is 931 GiB" in out.stderr and "the HF model cache" in out.stderr
    fixes = re.findall(r"--set (\S+=\S+)", out.stderr)
    assert fixes[:2] == ["ckpt.max_num=1", "hpcrl.lora_hf_save=adapter"]
    for setting in fixes[:2]:
        ok = hpcrl("render", *USERS, *prof, "--set", "hpcrl.lora_hf_save=full", "--set", setting)
        assert ok.returncode == 0, (setting, ok.stderr)


def test_users_openrlhf_lora_run_fits_with_the_pinned_adapter_saves(tmp_path):
    """At OpenRLHF 3c3be623 the HF saves under LoRA are the adapter (2 GB): 3 x 215 GB + the cache fit."""
    state, adapter = 2 * SEED_P + 12 * SEED_LORA64, 2 * SEED_LORA64 + 20 * MIB
    assert (3 * state * 1.001 + 2 * adapter + 2 * SEED_P) / GIB < 931
    out = hpcrl("render", *USERS, *one_tb_profile(tmp_path))
    assert out.returncode == 0, out.stderr


def test_lora_hf_save_is_openrlhfs():
    out = hpcrl("render", *OVERFLOW, "--set", "hpcrl.lora_hf_save=full")
    assert out.returncode == 2 and "hpcrl.lora_hf_save is OpenRLHF's" in out.stderr


# Seed 000 as the users ran it: Qwen2.5-72B by name. Its parameters by hand from its config.json (hidden 8192,
# intermediate 29568, 80 layers, vocab 152064, 64/8 heads, q/k/v biases, untied embeddings): 72,706,203,648; LoRA
# r=64 on every linear: 64 x (2x16384 + 2x9216 + 3x37760) x 80 = 842,137,600.
P72, LORA72 = 72_706_203_648, 842_137_600
SEED000 = ["--config", "openrlhf-grpo-qwen2.5-7b", "--nodes", "8", "--set", "actor.model_name_or_path=Qwen/Qwen2.5-72B",
           "--set", "ds.lora.rank=64", "--set", "ckpt.save_hf=true", "--set", "hpcrl.lora_hf_save=full"]
# Step count unknown (no data.max_samples): ckpt.max_num 3 states, the 3 HF saves made with them (never deleted),
# the final save, the model cache.
SEED000_PEAK_GIB = (3 * (2 * P72 + 12 * LORA72) + 4 * (2 * P72 + 20 * MIB) + 2 * P72) / GIB  # 1,111.6


def _peak(err: str) -> float:
    return float(re.search(r"need ([\d,]+) GiB at peak", err).group(1).replace(",", ""))


def test_seed000_render_with_unknown_step_count_is_refused_naming_need_and_fixes(tmp_path):
    out = hpcrl("render", *SEED000, *one_tb_profile(tmp_path))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert "step count unknown: counted to the retention limit" in out.stderr
    assert abs(_peak(out.stderr) - SEED000_PEAK_GIB) < 2
    fixes = [f.split("=")[0] for f in re.findall(r"--set (\S+=\S+) \(", out.stderr)]
    assert fixes == ["ckpt.max_num", "ckpt.disable_ds", "ckpt.save_hf", "hpcrl.lora_hf_save"]


def test_seed000_each_named_fix_renders(tmp_path):
    prof = one_tb_profile(tmp_path)
    settings = re.findall(r"--set (\S+=\S+) \(", hpcrl("render", *SEED000, *prof).stderr)
    assert [s.split("=")[0] for s in settings] == ["ckpt.max_num", "ckpt.disable_ds", "ckpt.save_hf",
                                                   "hpcrl.lora_hf_save"]  # every fix is tried, none skipped
    for setting in settings:
        assert hpcrl("render", *SEED000, *prof, "--set", setting).returncode == 0, setting


def test_quota_gib_flag_and_config_key_refuse_as_the_profile_file_does():
    """isambard-ai's own quota (200 TiB) holds the run; --quota-gib 931 or hpcrl.quota_gib 931 does not."""
    assert hpcrl("render", *SEED000).returncode == 0
    for quota in (["--quota-gib", "931"], ["--set", "hpcrl.quota_gib=931"]):
        out = hpcrl("render", *SEED000, *quota)
        assert out.returncode == 2 and "quota is 931 GiB" in out.stderr, (quota, out.stderr)


def test_quota_gib_must_be_positive():
    out = hpcrl("plan", *SEED000, "--quota-gib", "0")
    assert out.returncode == 2 and out.stderr.strip() == "hpcrl: error: --quota-gib 0: valid: a positive number of GiB"


def test_plan_disk_takes_the_cluster_file(tmp_path):
    out = hpcrl("plan-disk", *SEED000, *one_tb_profile(tmp_path), "--json")
    data = json.loads(out.stdout)
    assert (data["quota_gib"], data["fits"]) == (931.0, False)
    assert abs(data["peak_gib"] - SEED000_PEAK_GIB) < 2
