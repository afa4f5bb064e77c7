"""Run configs: shipped configs load, --set overrides, pins, and one-line errors."""

from __future__ import annotations

import pytest

from hpcrl.errors import ConfigError, HpcrlError
from hpcrl.planning.config import load_run_config, parse_override
from hpcrl.planning.run_plan import pins_from, workload_from_config


def test_default_config_is_32b_on_isambard():
    cfg = load_run_config()
    assert cfg.args["model_name_or_path"] == "allenai/Olmo-3-1125-32B"
    assert cfg.hpcrl.cluster == "isambard-ai" and cfg.hpcrl.nodes == 16
    assert cfg.pinned == ()


def test_shipped_7b_config():
    cfg = load_run_config("grpo-olmo3-7b")
    w = workload_from_config(cfg)
    assert w.model.name == "allenai/Olmo-3-1025-7B"
    assert w.pack_length >= w.max_prompt_token_length + w.response_length


def test_set_overrides_args_and_section_with_yaml_values():
    cfg = load_run_config(None, ["beta=0.0", "hpcrl.nodes=4", "num_learners_per_node=[2, 2]", "exp_name=a b"])
    assert cfg.hpcrl.nodes == 4
    assert cfg.args["num_learners_per_node"] == [2, 2]
    assert cfg.args["exp_name"] == "a b"
    assert "num_learners_per_node" in cfg.pinned
    pins = pins_from(cfg)
    assert (pins.learners_per_node, pins.learner_nodes) == (2, 2)


def test_digest_changes_with_inputs_and_is_stable():
    a = load_run_config(None, ["beta=0.0"]).digest()
    assert a == load_run_config(None, ["beta=0.0"]).digest()
    assert a != load_run_config(None, ["learning_rate=2e-6"]).digest()


@pytest.mark.parametrize(
    "sets,needle",
    [
        (
            ["not_a_flag=1"],
            r"unknown open-instruct argument 'not_a_flag' \(grpo_fast.py at open-instruct e6c3044aa620\)",
        ),
        (["pack_lenght=4096"], "pack_length"),
        (["hpcrl.nodez=3"], "hpcrl.nodez: unknown key"),
        (["output_dir=/tmp/x"], "output_dir is set by hpcrl"),
        (["pack_length=long"], "pack_length: expected int"),
        (["=3"], "expected key=value"),
    ],
)
def test_bad_overrides_name_the_problem(sets, needle):
    with pytest.raises(HpcrlError, match=needle):
        load_run_config(None, sets)


def test_legacy_layout_flags_checked_against_legacy_table():
    # wandb_project_name exists only in the older single-Args layout.
    with pytest.raises(
        HpcrlError,
        match=r"wandb_project_name: open-instruct e6c3044a has no such key; it exists in "
        r"1611e3df \(set hpcrl.arg_layout=legacy\)",
    ):
        load_run_config(None, ["wandb_project_name=x"])
    with pytest.raises(HpcrlError, match=r"'nope_flag' \(legacy grpo_fast.py at open-instruct [0-9a-f]{12}\)"):
        load_run_config(None, ["hpcrl.arg_layout=legacy", "nope_flag=1"])
    cfg = load_run_config(None, ["hpcrl.arg_layout=legacy", "wandb_project_name=x"])
    assert cfg.args["wandb_project_name"] == "x"


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_run_config(str(tmp_path / "nope.yaml"))


def test_unknown_key_in_file(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("hpcrl:\n  nodes: 2\nmodel_name_or_path: x\nlearning_rat: 1e-6\n")
    with pytest.raises(HpcrlError, match="learning_rat.*closest: learning_rate"):
        load_run_config(str(f))


def test_parse_override_keeps_strings():
    assert parse_override("model_name_or_path=/p/$(touch x)") == ("model_name_or_path", "/p/$(touch x)")


def test_wall_time_survives_yaml_base_60():
    cfg = load_run_config(None, ["hpcrl.time=24:00:00"])
    assert cfg.hpcrl.time == "24:00:00"


def test_an_override_error_names_the_set_not_the_shipped_file():
    with pytest.raises(ConfigError) as err:
        load_run_config(None, ["beta=0.01", "hpcrl.nodess=3"])
    assert str(err.value) == "--set hpcrl.nodess: unknown key; closest: hpcrl.nodes"
    with pytest.raises(ConfigError) as err:
        load_run_config("grpo-olmo3-7b", ["learnig_rate=1e-6"])
    assert str(err.value).startswith("--set learnig_rate: unknown open-instruct argument 'learnig_rate' ")
    assert str(err.value).endswith("; closest: learning_rate")


def test_a_file_error_names_the_file_as_given_even_with_overrides(tmp_path, monkeypatch):
    (tmp_path / "run.yaml").write_text("hpcrl:\n  nodez: 2\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_run_config("run.yaml", ["beta=0.01"])
    assert str(err.value) == "run.yaml: hpcrl.nodez: unknown key; closest: hpcrl.nodes"


def test_an_override_that_breaks_a_shipped_config_never_shows_its_package_path():
    with pytest.raises(ConfigError) as err:
        load_run_config("grpo-olmo3-7b", ["hpcrl.backend=verll"])
    assert str(err.value) == "--set hpcrl.backend: unknown backend 'verll'; closest: verl"
