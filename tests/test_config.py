"""The config: every preset composes into the typed schema, mistakes are one line, keys the
schema does not know are refused, and each choice list and default has one source."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import yaml
from omegaconf import OmegaConf

from perflab.config import registry, schema
from perflab.config.schema import PerflabConfig, validate
from perflab.errors import ConfigError, one_line

from conftest import ROOT, presets


@pytest.mark.parametrize("preset", presets())
def test_every_preset_and_its_quick_variant_compose_and_validate(compose_cfg, preset):
    for choice in (preset, f"quick/{preset}"):
        cfg = compose_cfg(f"+experiment={choice}")
        experiment = registry.get(cfg.experiment.name)
        settings = validate(cfg, experiment.module.Config)
        assert isinstance(settings, PerflabConfig)
        assert type(settings.experiment) is experiment.module.Config
        assert not OmegaConf.missing_keys(cfg), f"{choice}: every experiment knob needs a value in its yaml"


def test_each_experiment_has_a_preset_with_a_summary_and_each_preset_a_quick_variant():
    for name in [n for n, d in registry.declared().items() if d.builtin]:  # perflab's own (a user's needs none)
        assert name in registry.presets(), f"conf/experiment/{name}.yaml is missing"
    for name, summary in registry.presets().items():
        assert summary, f"conf/experiment/{name}.yaml needs a one-line comment after the package line"
        assert (registry.config_dir() / "experiment" / "quick" / f"{name}.yaml").is_file(), f"quick/{name} missing"


def test_listing_names_every_experiment_with_an_example():
    text = registry.listing()
    for name, summary in registry.presets().items():
        assert f"{name}  " in text and summary in text
    assert "perflab +experiment=" in text and "quick/" in text


@pytest.mark.parametrize(
    "override, expected",
    [
        ("experiment.size=-5", "experiment.size=-5: allowed: an integer >= 1"),
        ("bench.repeats=0", "bench.repeats=0: allowed: an integer >= 1"),
        ("bench.timer=stopwatch", "bench.timer=stopwatch: allowed: auto, cuda_event, wall_sync, torch_utils_benchmark"),
        ("devices.on_missing=ignore", "devices.on_missing=ignore: allowed: auto, error, skip"),
        ("devices.count=0", "devices.count=0: allowed: null or an integer >= 1"),
        ("experiment.dtype=int8", "experiment.dtype=int8: allowed: float32, float16, bfloat16, float64"),
        ("seed=-1", "seed=-1: allowed: an integer from 0 to 4294967295 (numpy's seed range)"),
        ("bench.min_time_s=inf", "bench.min_time_s=inf: allowed: a finite number"),
        (
            "experiment.size=99999999999999999999",
            "experiment.size=99999999999999999999: allowed: an integer below 2**63",
        ),
        ("bench.noise_threshold=nan", "bench.noise_threshold=nan: allowed: a number > 0"),
    ],
)
def test_range_checks_name_the_full_key(compose_cfg, override, expected):
    cfg = compose_cfg("+experiment=matmul", override)
    with pytest.raises(ConfigError) as err:
        validate(cfg, registry.get("matmul").module.Config)
    assert err.value.line() == expected


@pytest.mark.parametrize(
    "override, expected",
    [
        ("+experiment.sise=5", "experiment.sise=5: unknown key; did you mean experiment.size?"),
        ("+devices.cout=2", "devices.cout=2: unknown key; did you mean devices.count?"),
        ("+bench.repeat=3", "bench.repeat=3: unknown key; did you mean bench.repeats?"),
        ("+experiments=matmul", "experiments=matmul: unknown key; did you mean experiment?"),
    ],
)
def test_keys_added_outside_the_schema_are_refused_with_a_did_you_mean(compose_cfg, override, expected):
    cfg = compose_cfg("+experiment=matmul", override)
    with pytest.raises(ConfigError) as err:
        validate(cfg, registry.get("matmul").module.Config)
    assert err.value.line().startswith(expected + "; allowed: the keys under")


def test_wrong_type_and_unknown_override_are_caught_while_composing(compose_cfg):
    with pytest.raises(Exception) as err:
        compose_cfg("+experiment=matmul", "experiment.size=abc")
    assert one_line(err.value) == "experiment.size=abc: allowed: an integer"
    for override, wanted in (("bench.profile=maybe", "true or false"), ("bench.min_time_s=fast", "a number")):
        with pytest.raises(Exception) as err:
            compose_cfg("+experiment=matmul", override)
        assert one_line(err.value) == f"{override}: allowed: {wanted}"
    with pytest.raises(Exception) as err:
        compose_cfg("+experiment=matmul", "experiment.sise=5")
    assert one_line(err.value) == (
        "experiment.sise=5: unknown key; did you mean experiment.size?; allowed: the keys under experiment: "
        "name, size, iterations, dtype"
    )


def test_a_key_under_an_empty_mapping_is_said_to_need_a_plus(cli):
    ran = cli(
        "-m", "+launcher=slurm", "+experiment=quick/matmul", "hydra.launcher.additional_parameters.exclusive=true", rc=2
    )
    assert ran.err.strip() == (
        "perflab: error: hydra.launcher.additional_parameters.exclusive=true: unknown key; allowed: a new key under "
        "hydra.launcher.additional_parameters, added with a +: +hydra.launcher.additional_parameters.exclusive=..."
    )


def test_unknown_experiment_lists_the_choices(compose_cfg):
    with pytest.raises(Exception) as err:
        compose_cfg("+experiment=nope")
    line = one_line(err.value)
    assert line.startswith("experiment=nope: unknown experiment; allowed: ")
    for name in registry.presets():
        assert name in line


def test_training_presets_carry_the_books_settings(compose_cfg):
    scratch = validate(compose_cfg("+experiment=lenet_scratch"))
    assert (scratch.model.label, scratch.model.init, scratch.strategy.name) == ("lenet", "book_normal", "scratch")
    assert (scratch.trainer.batch_size, scratch.trainer.lr, scratch.trainer.epochs, scratch.trainer.momentum) == (
        256,
        0.2,
        10,
        0.0,
    )
    concise = compose_cfg("+experiment=resnet18_concise")
    assert concise.model._target_ == "perflab.models.resnet18" and concise.trainer.scaling == "weak"
    preset = OmegaConf.load(registry.config_dir() / "experiment" / "resnet18_concise.yaml")
    assert preset.hydra.sweeper.params["devices.count"] == "1,2"  # -m runs the book's 1 and 2 devices


def test_quick_variants_keep_user_overrides_on_top(compose_cfg):
    assert compose_cfg("+experiment=quick/matmul").experiment.size == 256
    assert compose_cfg("+experiment=quick/matmul", "experiment.size=7").experiment.size == 7


def test_non_training_experiments_have_no_training_sections(compose_cfg):
    s = validate(compose_cfg("+experiment=matmul"))
    assert s.model is s.trainer is s.data is s.strategy is None


def test_choice_lists_have_one_source():
    from perflab.experiments import compile as compile_exp
    from perflab.train import strategies

    assert tuple(strategies.STRATEGIES) == schema.STRATEGIES
    assert compile_exp.MODES[2:] == tuple(f"compile-{m}" for m in schema.COMPILE_MODES)


def test_group_files_set_only_what_differs_from_the_schema_defaults():
    """A default lives in the dataclass; conf/ files restate none of them (presets may pin
    the book's values on purpose, group files and the root config may not)."""
    defaults = {
        name: {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        for name, cls in schema.SECTIONS.items()
    }
    conf = registry.config_dir()
    for group in ("model", "data", "strategy"):
        for path in (conf / group).glob("*.yaml"):
            for key, value in (yaml.safe_load(path.read_text()) or {}).items():
                restated = key not in ("name", "_target_") and defaults[group].get(key, object()) == value
                assert not restated, f"{path}: {key} restates a default"
    root = yaml.safe_load((conf / "config.yaml").read_text())
    assert set(root) <= {"defaults", "hydra"}, "conf/config.yaml restates schema defaults"


def test_volatile_keys_leave_the_run_identity_alone():
    base = {"experiment": {"name": "matmul", "size": 64}, "results": {"store": "a"}, "trainer": {"resume": True}}
    moved = {"experiment": {"name": "matmul", "size": 64}, "results": {"store": "b"}, "trainer": {"resume": None}}
    other = {"experiment": {"name": "matmul", "size": 65}, "results": {"store": "a"}, "trainer": {"resume": True}}
    assert schema.config_hash(base) == schema.config_hash(moved) != schema.config_hash(other)
    assert {"results", "trainer.resume", "trainer.checkpoint_dir", "bench.profile"} <= set(schema.volatile_keys())


def test_a_config_mistake_help_and_the_listing_never_import_torch(tmp_path):
    probe = (
        "import sys, contextlib, io\nfrom perflab.app import main\n"
        "for args in ([], ['+experiment=matmul', 'experiment.size=-5'], ['+experiment=matmul', '--help'],"
        " ['+experiment=train', '+bench.repeat=3']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n            main(args)\n        except SystemExit:\n            pass\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("results.csv"))
    assert (ROOT / "conf").is_dir()
