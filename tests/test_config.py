"""Every experiment config composes into the typed schema; bad values become one line."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from perflab import registry
from perflab.errors import ConfigError, one_line
from perflab.schema import BenchConfig, DevicesConfig, PerflabConfig, validate


@pytest.mark.parametrize("preset", sorted(registry.presets()))
def test_every_experiment_config_composes_and_validates(compose_cfg, preset):
    cfg = compose_cfg(f"+experiment={preset}")
    settings = validate(cfg)
    assert isinstance(settings, PerflabConfig)
    assert type(settings.experiment) is registry.discover()[settings.experiment.name].module.Config
    assert not OmegaConf.missing_keys(cfg), "every experiment knob needs a value in its yaml"


def test_each_experiment_module_has_a_yaml_and_each_yaml_a_summary():
    for name in registry.discover():
        assert name in registry.presets(), f"conf/experiment/{name}.yaml is missing"
    for name, summary in registry.presets().items():
        assert summary, f"conf/experiment/{name}.yaml needs a one-line comment after the package line"


def test_listing_names_every_experiment_with_an_example():
    text = registry.listing()
    for name, summary in registry.presets().items():
        assert f"{name}  " in text and summary in text
    assert "python -m perflab +experiment=" in text


def test_negative_size_names_the_full_key(compose_cfg):
    cfg = compose_cfg("+experiment=matmul", "experiment.size=-5")
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.line() == "experiment.size=-5: allowed: an integer >= 1"


@pytest.mark.parametrize(
    "override, expected",
    [
        ("bench.repeats=0", "bench.repeats=0: allowed: an integer >= 1"),
        ("bench.timer=stopwatch", "bench.timer=stopwatch: allowed: auto, cuda_event, wall_sync, torch_utils_benchmark"),
        ("devices.on_missing=ignore", "devices.on_missing=ignore: allowed: auto, error, skip"),
        ("devices.count=0", "devices.count=0: allowed: null or an integer >= 1"),
        ("experiment.dtype=int8", "experiment.dtype=int8: allowed: float32, float16, bfloat16, float64"),
    ],
)
def test_range_checks(compose_cfg, override, expected):
    cfg = compose_cfg("+experiment=matmul", override)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.line() == expected


def test_wrong_type_is_caught_while_composing(compose_cfg):
    with pytest.raises(Exception) as err:
        compose_cfg("+experiment=matmul", "experiment.size=abc")
    assert one_line(err.value) == "experiment.size=abc: allowed: integer"


def test_unknown_key_lists_the_allowed_keys(compose_cfg):
    with pytest.raises(Exception) as err:
        compose_cfg("+experiment=matmul", "experiment.sise=5")
    assert one_line(err.value) == "experiment.sise=5: unknown key; allowed under experiment: name, size, iterations, dtype"


def test_unknown_experiment_lists_the_choices(compose_cfg):
    with pytest.raises(Exception) as err:
        compose_cfg("+experiment=nope")
    line = one_line(err.value)
    assert line.startswith("experiment=nope: unknown experiment; allowed: ")
    for name in registry.presets():
        assert name in line


def test_schema_types_are_enforced_on_assignment():
    cfg = OmegaConf.structured(BenchConfig)
    with pytest.raises(ValidationError):
        cfg.repeats = "many"


def test_devices_spec_accepts_string_or_list():
    assert DevicesConfig(spec="auto").spec == "auto"
    assert DevicesConfig(spec=["cuda:0", "cpu"]).spec == ["cuda:0", "cpu"]
    with pytest.raises(ConfigError) as err:
        DevicesConfig(spec=[])
    assert err.value.line().startswith("spec=[]: allowed: auto, cpu, cuda, mps, or a non-empty list")


def test_training_presets_carry_the_books_settings(compose_cfg):
    scratch = validate(compose_cfg("+experiment=lenet_scratch"))
    assert (scratch.model.name, scratch.strategy.name) == ("lenet", "scratch")
    assert (scratch.trainer.batch_size, scratch.trainer.lr, scratch.trainer.epochs) == (256, 0.2, 10)
    concise = compose_cfg("+experiment=resnet18_concise")
    assert concise.model.name == "resnet18" and concise.trainer.scaling == "weak"
    preset = OmegaConf.load(registry.config_dir() / "experiment" / "resnet18_concise.yaml")
    assert preset.hydra.sweeper.params["devices.count"] == "1,2"  # -m runs the book's 1 and 2 devices


def test_training_groups_can_be_swapped(compose_cfg):
    s = validate(compose_cfg("+experiment=train", "model=resnet18_tv", "strategy=ddp", "data=fashion_mnist"))
    assert (s.model.name, s.strategy.name, s.data.name) == ("resnet18_tv", "ddp", "fashion_mnist")


def test_non_training_experiments_have_no_training_sections(compose_cfg):
    s = validate(compose_cfg("+experiment=matmul"))
    assert s.model is s.trainer is s.data is s.strategy is None
