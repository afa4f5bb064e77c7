"""Cluster profiles: the shipped facts, validation errors, `extends`, variants and discovery."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from hpcrl.errors import ProfileError, UnknownNameError
from hpcrl.profiles import load_profile, load_profile_file, profile_files, resolve_profile
from hpcrl.resources import data_dir

SHIPPED = ["isambard-ai", "berzelius", "berzelius-hopper"]
NOT_FACTS = {"name", "description", "extends", "variants", "default_variant", "variant", "unconfirmed", "sources"}


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Profiles only from the shipped dir and tmp_path/clusters; no user config leaks in."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("HPCRL_CLUSTERS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "clusters").mkdir()
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _leaves(data: dict, prefix: str = ""):
    for key, value in data.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


# --------------------------------------------------------------------------- shipped profiles


@pytest.mark.parametrize("name", SHIPPED + ["berzelius:thin", "berzelius:fat"])
def test_shipped_profile_validates(name):
    profile = load_profile(name)
    assert profile.name == name.split(":")[0]


@pytest.mark.parametrize("stem", SHIPPED)
def test_shipped_file_validates_with_every_variant(stem):
    path = data_dir("clusters") / f"{stem}.yaml"
    profile = load_profile_file(path)
    for variant in profile.variants:
        assert load_profile_file(path, variant).variant == variant


@pytest.mark.parametrize("stem", SHIPPED)
def test_every_stated_fact_has_a_source(stem):
    """Each fact a shipped file states (variants included) resolves to a source."""
    raw = yaml.safe_load((data_dir("clusters") / f"{stem}.yaml").read_text())
    checks = [(stem, {k: v for k, v in raw.items() if k not in NOT_FACTS})]
    for variant, spec in raw.get("variants", {}).items():
        overrides = {k: v for k, v in spec["overrides"].items() if k not in NOT_FACTS}
        checks.append((f"{stem}:{variant}", overrides))
    for name, facts in checks:
        profile = load_profile(name)
        missing = [p for p in _leaves(facts) if not p.endswith("description") and not profile.source_of(p)]
        assert missing == [], f"{name}: facts without a source: {missing}"


def test_isambard_ai_facts():
    p = load_profile("isambard-ai")
    assert (p.gpu.model, p.gpu.count_per_node, p.gpu.memory_gib) == ("GH200", 4, 95.58)
    assert (p.gpu.hbm_bandwidth_tbs, p.gpu.bf16_tflops, p.gpu.compute_capability) == (4.0, 989, "9.0")
    assert (p.node.cpu_cores, p.node.ram_gib, p.node.arch) == (288, 460, "aarch64")
    assert "Slingshot 11" in p.node.interconnect
    assert p.slurm.gpu_request == "gpus-per-node"
    assert p.slurm.exclusive is True
    assert p.slurm.default_partition == "workq"
    assert p.default_partition.max_time == "24:00:00"
    assert (p.slurm.qos.name, p.slurm.qos.max_gpus) == ("32gpu_qos", 32)
    assert p.max_nodes == 8
    assert p.slurm.account_required is False
    assert re.match(p.slurm.account_pattern, "brics.a5k")
    assert not re.match(p.slurm.account_pattern, "a5k")
    assert not re.match(p.slurm.account_pattern, "berzelius-2025-35")
    assert p.slurm.exclude_nodes == []
    assert p.slurm.signal_before_end_s == 900
    assert p.slurm.min_poll_interval_s == 60
    assert p.modules[:3] == ["brics/default", "brics/userenv", "brics/nccl"]
    assert p.container.runtime == "apptainer"
    assert (p.ray.num_cpus_per_node, p.ray.join_timeout_s) == (64, 900)
    assert (p.storage.node_local.path, p.storage.node_local.quota_gib) == ("$LOCALDIR", 48)
    assert (p.storage.run_root.path, p.storage.run_root.quota_gib) == ("$PROJECTDIR/hpcrl-runs", 204800)
    assert p.storage.hf_home == "$PROJECTDIR/hf"
    assert p.idle_gpu_policy is None


def test_isambard_ai_nccl_environment_is_the_documented_one():
    env = load_profile("isambard-ai").env
    documented = {
        "NCCL_NET": "AWS Libfabric",
        "NCCL_SOCKET_IFNAME": "hsn",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_CROSS_NIC": "1",
        "NCCL_MIN_NCHANNELS": "4",
        "NCCL_GDRCOPY_ENABLE": "1",
        "NCCL_NET_FORCE_FLUSH": "0",
        "FI_CXI_DEFAULT_CQ_SIZE": "131072",
        "FI_CXI_DEFAULT_TX_SIZE": "2048",
        "FI_CXI_DISABLE_NON_INJECT_MSG_IDC": "1",
        "FI_HMEM_CUDA_USE_GDRCOPY": "1",
        "FI_CXI_DISABLE_HOST_REGISTER": "1",
        "FI_MR_CACHE_MONITOR": "userfaultfd",
        "FI_CXI_RDZV_PROTO": "alt_read",
        "FI_CXI_RDZV_THRESHOLD": "0",
        "FI_CXI_RDZV_GET_MIN": "0",
        "FI_CXI_RDZV_EAGER_SIZE": "0",
        "FI_CXI_RX_MATCH_MODE": "hybrid",
    }
    assert {k: env[k] for k in documented} == documented
    assert env["VLLM_SKIP_CUSTOM_ALL_REDUCE"] == "1"


def test_isambard_ai_sources_and_unconfirmed():
    p = load_profile("isambard-ai")
    assert p.source_of("gpu.count_per_node") == "https://docs.isambard.ac.uk/user-documentation/guides/accounting/"
    assert p.source_of("env.NCCL_NET").startswith("https://docs.isambard.ac.uk/user-documentation/guides/nccl/")
    assert p.source_of("env.VLLM_SKIP_CUSTOM_ALL_REDUCE") == (
        "https://github.com/ai4ci/isambard-vllm/blob/main/docs/multinode-ray.md"
    )
    assert "datasheet" in p.source_of("gpu.hbm_bandwidth_tbs")
    for community in ["gpu.memory_gib", "slurm.account_pattern", "storage.hf_home", "env.VLLM_SKIP_CUSTOM_ALL_REDUCE"]:
        assert p.is_unconfirmed(community), community
    assert not p.is_unconfirmed("gpu.count_per_node")
    assert not p.is_unconfirmed("env.NCCL_NET")


def test_berzelius_thin_is_the_default_and_fat_is_a_variant():
    thin, fat, plain = load_profile("berzelius:thin"), load_profile("berzelius:fat"), load_profile("berzelius")
    assert plain.variant == "thin"
    assert (plain.gpu.memory_gib, thin.gpu.memory_gib, fat.gpu.memory_gib) == (39.39, 39.39, 79.15)
    assert (thin.gpu.model, fat.gpu.model) == ("A100-SXM4-40GB", "A100-SXM4-80GB")
    assert (thin.gpu.hbm_bandwidth_tbs, fat.gpu.hbm_bandwidth_tbs) == (1.555, 2.039)
    assert (thin.gpu.bf16_tflops, fat.gpu.bf16_tflops) == (312, 312)
    assert (thin.node.ram_gib, fat.node.ram_gib) == (999, 2000)
    assert (thin.slurm.constraint, fat.slurm.constraint) == ("thin", "fat")
    assert (thin.max_nodes, fat.max_nodes) == (60, 34)
    assert set(plain.variants) == {"thin", "fat"}


def test_berzelius_facts():
    p = load_profile("berzelius")
    assert (p.gpu.count_per_node, p.node.cpu_cores, p.node.arch) == (8, 128, "x86_64")
    assert p.gpu.compute_capability == "8.0"
    assert "InfiniBand" in p.node.interconnect
    assert p.slurm.gpu_request == "gpus"
    assert p.slurm.default_partition == "berzelius"
    assert p.default_partition.max_time == "3-00:00:00"
    assert p.slurm.account_required is False
    for account in ["berzelius-2025-35", "Berzelius-2024-58"]:
        assert re.match(p.slurm.account_pattern, account), account
    assert not re.match(p.slurm.account_pattern, "brics.a5k")
    assert (p.idle_gpu_policy.min_mean_power_w, p.idle_gpu_policy.grace_minutes) == (100, 60)
    assert p.idle_gpu_policy.action == "cancel"
    assert p.storage.node_local.path == "/scratch/local"
    assert p.storage.run_root.quota_gib == 2000
    assert p.storage.run_root.path.startswith("/proj/")
    assert p.storage.hf_home.startswith("/proj/")
    assert p.container.runtime == "apptainer"


def test_berzelius_variant_carries_its_own_sources_and_marks():
    thin, fat = load_profile("berzelius:thin"), load_profile("berzelius:fat")
    assert "(SXM4 40GB)" in thin.source_of("gpu.hbm_bandwidth_tbs")
    assert "(SXM4 80GB)" in fat.source_of("gpu.hbm_bandwidth_tbs")
    assert "30 TB" in fat.source_of("storage.node_local.quota_gib")
    for p in (thin, fat):
        assert p.is_unconfirmed("gpu.memory_gib")
        assert p.is_unconfirmed("slurm.default_partition")
        assert not p.is_unconfirmed("slurm.partitions.berzelius.max_time")


def test_berzelius_hopper_marks_what_is_inferred():
    p = load_profile("berzelius-hopper")
    assert (p.gpu.model, p.gpu.memory_gib, p.gpu.hbm_bandwidth_tbs, p.gpu.bf16_tflops) == ("H200", 139.8, 4.8, 989)
    assert (p.gpu.count_per_node, p.node.cpu_cores) == (8, 112)
    assert p.default_partition.max_time == "2-00:00:00"
    assert p.variants == {} and p.extends is None
    assert p.max_nodes is None
    for inferred in [
        "gpu.count_per_node",
        "node.cpu_cores",
        "node.ram_gib",
        "node.arch",
        "slurm.partitions.berzelius-hopper.max_time",
        "slurm.default_partition",
        "storage.run_root.path",
    ]:
        assert p.is_unconfirmed(inferred), inferred
    assert not p.is_unconfirmed("gpu.hbm_bandwidth_tbs")


# --------------------------------------------------------------------------- errors


def test_typo_key_names_file_and_key(isolated):
    path = write(isolated / "typo.yaml", "extends: isambard-ai\ngpu:\n  count_per_nod: 4\n")
    with pytest.raises(ProfileError) as exc:
        load_profile_file(path)
    assert str(exc.value) == f"{path}: gpu.count_per_nod: unknown key"


def test_wrong_type_names_the_field(isolated):
    path = write(isolated / "bad.yaml", "extends: isambard-ai\ngpu:\n  count_per_node: four\n")
    with pytest.raises(ProfileError, match=r"bad\.yaml: gpu\.count_per_node: Input should be a valid integer"):
        load_profile_file(path)


def test_wrong_literal_names_the_field(isolated):
    path = write(isolated / "bad.yaml", "extends: berzelius\nnode:\n  arch: arm64\n")
    with pytest.raises(ProfileError, match=r"bad\.yaml: node\.arch: Input should be 'x86_64' or 'aarch64'"):
        load_profile_file(path)


def test_missing_required_field(isolated):
    path = write(isolated / "bare.yaml", "name: bare\ngpu:\n  model: X\n")
    with pytest.raises(
        ProfileError, match=r"bare\.yaml: gpu\.count_per_node: required field is missing \(and \d+ more\)"
    ):
        load_profile_file(path)


def test_not_yaml_and_not_a_mapping(isolated):
    with pytest.raises(ProfileError, match=r"broken\.yaml: line \d+: not valid YAML"):
        load_profile_file(write(isolated / "broken.yaml", "gpu: [unclosed\n"))
    with pytest.raises(ProfileError, match=r"list\.yaml: \(top level\): expected a mapping"):
        load_profile_file(write(isolated / "list.yaml", "- a\n- b\n"))
    with pytest.raises(ProfileError, match=r"absent\.yaml: no such file"):
        load_profile_file(isolated / "absent.yaml")


def test_source_or_mark_for_a_field_that_does_not_exist(isolated):
    path = write(isolated / "s.yaml", "extends: berzelius\nsources:\n  gpu.memroy_gib: somewhere\n")
    with pytest.raises(ProfileError) as exc:
        load_profile_file(path)
    assert str(exc.value) == f"{path}: sources: 'gpu.memroy_gib' names no field of the profile"
    path = write(isolated / "u.yaml", "extends: isambard-ai\nunconfirmed: [env.NO_SUCH_VAR]\n")
    with pytest.raises(ProfileError, match=r"u\.yaml: unconfirmed: 'env\.NO_SUCH_VAR' names no field"):
        load_profile_file(path)


def test_bad_variant_override_names_the_variant(isolated):
    text = "extends: berzelius\nvariants:\n  fat:\n    overrides:\n      gpu:\n        memroy_gib: 80\n"
    path = write(isolated / "v.yaml", text)
    load_profile_file(path)  # the default variant (thin) is fine
    with pytest.raises(ProfileError) as exc:
        load_profile_file(path, "fat")
    assert str(exc.value) == f"{path} (variant fat): gpu.memroy_gib: unknown key"


def test_unknown_cluster_and_variant_suggest_closest():
    with pytest.raises(UnknownNameError) as exc:
        load_profile("isambard")
    assert str(exc.value) == "unknown cluster 'isambard'; closest: isambard-ai"
    with pytest.raises(UnknownNameError) as exc:
        load_profile("berzelius:fatt")
    assert str(exc.value) == "unknown variant of cluster berzelius 'fatt'; closest: fat"


# --------------------------------------------------------------------------- extends and discovery


USER_PROFILE = """\
extends: isambard-ai
description: our project on Isambard-AI
gpu:
  memory_gib: 95.0
slurm:
  exclude_nodes: [nid010798, nid010869]
  account_example: brics.u5gx
sources:
  gpu.memory_gib: torch.cuda total_memory on our nodes
unconfirmed: [slurm.exclude_nodes]
"""


def test_user_profile_extends_and_overrides(isolated):
    write(isolated / "clusters" / "ours.yaml", USER_PROFILE)
    p = load_profile("ours")
    assert (p.name, p.extends, p.description) == ("ours", "isambard-ai", "our project on Isambard-AI")
    assert p.gpu.memory_gib == 95.0
    assert p.slurm.exclude_nodes == ["nid010798", "nid010869"]
    assert p.slurm.account_example == "brics.u5gx"
    # everything else is the parent's
    assert (p.gpu.count_per_node, p.slurm.qos.max_gpus, p.env["FI_CXI_DEFAULT_TX_SIZE"]) == (4, 32, "2048")
    # an overridden fact takes the child's source and confidence; the parent's other marks stay
    assert p.source_of("gpu.memory_gib") == "torch.cuda total_memory on our nodes"
    assert not p.is_unconfirmed("gpu.memory_gib")
    assert p.is_unconfirmed("storage.hf_home")
    assert p.is_unconfirmed("slurm.exclude_nodes")
    # an overridden fact the child gives no source for keeps none rather than the parent's
    assert p.source_of("slurm.account_example") is None


def test_user_profile_file_outside_the_search_dirs(isolated):
    path = write(isolated / "elsewhere" / "mine.yaml", USER_PROFILE)
    p = resolve_profile(cluster_file=path)
    assert (p.name, p.gpu.memory_gib, p.node.ram_gib) == ("mine", 95.0, 460)


def test_user_profile_picks_a_variant_of_its_parent(isolated):
    write(
        isolated / "clusters" / "bz.yaml",
        "extends: berzelius\ndefault_variant: fat\nslurm:\n  account_required: true\n",
    )
    p = load_profile("bz")
    assert (p.variant, p.gpu.memory_gib, p.slurm.constraint, p.slurm.account_required) == ("fat", 79.15, "fat", True)
    assert load_profile("bz:thin").gpu.memory_gib == 39.39


def test_extends_cycles_are_errors(isolated):
    write(isolated / "clusters" / "a.yaml", "extends: b\n")
    write(isolated / "clusters" / "b.yaml", "extends: a\n")
    write(isolated / "clusters" / "self.yaml", "extends: self\n")
    with pytest.raises(ProfileError, match=r"b\.yaml: extends: cycle through 'a'"):
        load_profile("a")
    with pytest.raises(ProfileError, match=r"self\.yaml: extends: cycle through 'self'"):
        load_profile("self")
    with pytest.raises(ProfileError, match=r"extends: cycle"):
        load_profile_file(isolated / "clusters" / "a.yaml")


def test_extends_unknown_parent(isolated):
    path = write(isolated / "x.yaml", "extends: berzelius-hoper\n")
    with pytest.raises(UnknownNameError, match=r"unknown cluster 'berzelius-hoper'; closest: berzelius-hopper"):
        load_profile_file(path)


def test_search_dirs_and_precedence(isolated, monkeypatch):
    config = isolated / "config" / "hpcrl" / "clusters"
    write(config / "cfg-only.yaml", "extends: berzelius\ndescription: from config dir\n")
    write(config / "both.yaml", "extends: berzelius\ndescription: from config dir\n")
    write(isolated / "clusters" / "both.yaml", "extends: berzelius\ndescription: from ./clusters\n")
    extra = isolated / "extra"
    write(extra / "env-only.yaml", "extends: isambard-ai\n")
    monkeypatch.setenv("HPCRL_CLUSTERS_DIR", str(extra))
    files = profile_files()
    assert set(SHIPPED) | {"cfg-only", "both", "env-only"} <= set(files)
    assert files["both"] == isolated / "clusters" / "both.yaml"
    assert load_profile("both").description == "from ./clusters"
    assert load_profile("cfg-only").description == "from config dir"
    assert load_profile("env-only").gpu.model == "GH200"


def test_resolve_profile_variant_for_names_and_files(isolated):
    assert resolve_profile().name == "isambard-ai"
    assert resolve_profile("berzelius", variant="fat").gpu.memory_gib == 79.15
    assert resolve_profile("berzelius:thin", variant="fat").gpu.memory_gib == 79.15
    path = write(isolated / "elsewhere" / "bz.yaml", "extends: berzelius\n")
    assert resolve_profile(cluster_file=path).gpu.memory_gib == 39.39
    fat = resolve_profile(cluster_file=path, variant="fat")
    assert (fat.name, fat.variant, fat.gpu.memory_gib) == ("bz", "fat", 79.15)
