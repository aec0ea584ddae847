"""The front door's check of a config mistake without Hydra (perflab.config.early, issue 31):
it says exactly the line the composed config's check says, or nothing (then Hydra composes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from perflab.app import checked_by_composing
from perflab.config import early, registry

# (experiment, overrides, whether the early check answers it itself)
CASES = [
    ("matmul", ["experiment.size=-5"], True),
    ("matmul", ["+bench.repeat=3"], True),
    ("matmul", ["+foo=1"], True),
    ("matmul", ["seed=-1"], True),
    ("matmul", ["devices.spec=gpu"], True),
    ("matmul", ["bench.min_time_s=1", "bench.repeats=0"], True),  # an int in a float field, as OmegaConf types it
    ("matmul", ["experiment.dtype=float8", "experiment.size=0"], True),  # the first in the schema's order
    ("quick/matmul", ["experiment.iterations=0"], True),  # through the quick preset's defaults list
    ("matmul", ["experiment.size=5", "bench.min_time_s=1", "devices.threads=null", "results.store=a/b"], True),
    ("matmul", ["experiment.size=1.5"], False),  # OmegaConf's words for a float in an int field
    ("matmul", ["bench.repeat=3"], False),  # no +: Hydra's words
    ("matmul", ["+bench.repeats=3"], False),  # + to a key that is there: Hydra's words
    ("matmul", ["experiment.name=comm"], False),
    ("matmul", ["experiment.size=${experiment.iterations}"], False),  # valid only through the interpolation
    ("matmul", ["experiment.size=${bench.warmup}"], False),  # refused only once resolved (warmup 2 ... valid)
    ("matmul", ["+bench.repeat=3", "+bench.repeat=4"], False),  # a second + to the key added: Hydra's words
    ("matmul", ["+foo=3", "+foo=4"], False),
    ("hardware", ["experiment.copy_mb=0"], True),  # a preset with a list (dtypes), typed item by item
    ("quick/hardware", ["bench.warmup=0"], True),
    ("train", ["trainer.epochs=0"], False),  # a preset with model/data: Hydra composes it
    ("train", ["devices.spec=gpu"], False),
]


@pytest.mark.parametrize(("experiment", "overrides", "answers"), CASES)
def test_the_early_check_says_what_the_composed_config_says_or_nothing(experiment, overrides, answers):
    said = early.refusal(experiment, overrides)
    composed = checked_by_composing(experiment, overrides)[0]
    assert said == (composed if answers else None)


MINE = """
from dataclasses import dataclass
from perflab.experiment import ExperimentConfig, require


@dataclass
class Config(ExperimentConfig):
    rows: int
    lo: int = 5
    hi: float = 10.0

    def __post_init__(self):
        require(self.rows >= 1, "rows", self.rows, "an integer >= 1")
        require(self.lo < self.hi, "hi", self.hi, "a number above lo")


def run(ctx):
    pass
"""
TAGGED = """
from dataclasses import dataclass
from perflab.experiment import ExperimentConfig, require


@dataclass
class Config(ExperimentConfig):
    tag: str = "${results.store}"  # resolved before the checks see it

    def __post_init__(self):
        require("$" not in self.tag, "tag", self.tag, "a resolved text")


def run(ctx):
    pass
"""
DERIVED = """
from dataclasses import dataclass, field
from perflab.experiment import ExperimentConfig


@dataclass
class Config(ExperimentConfig):
    size: int = 4
    area: int = field(init=False, default=0)  # set after __init__, as OmegaConf sets it

    def __post_init__(self):
        self.area = self.size * self.size


def run(ctx):
    pass
"""


@pytest.fixture
def mine(tmp_path, monkeypatch):
    """A user's experiment, declared through the entry-point group as pip leaves it."""
    meta = tmp_path / "minepkg-0.1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: minepkg\nVersion: 0.1.0\n")
    (meta / "entry_points.txt").write_text(
        f"[{registry.GROUP}]\nmine = minepkg_mine\ntagged = minepkg_tagged\nderived = minepkg_derived\n"
    )
    (tmp_path / "minepkg_mine.py").write_text(MINE)
    (tmp_path / "minepkg_tagged.py").write_text(TAGGED)
    (tmp_path / "minepkg_derived.py").write_text(DERIVED)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.entries.cache_clear()
    registry.get.cache_clear()
    yield
    registry.entries.cache_clear()
    registry.get.cache_clear()
    sys.modules.pop("minepkg_mine", None)
    sys.modules.pop("minepkg_tagged", None)
    sys.modules.pop("minepkg_derived", None)
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo  # composing registered it: this process forgets it too
    for group in (repo.get("experiment", {}), repo.get("schema", {}).get("experiment", {})):
        group.pop("mine.yaml", None)
        group.pop("tagged.yaml", None)
        group.pop("derived.yaml", None)


@pytest.mark.parametrize(
    ("overrides", "answers"),
    [
        ([], True),  # rows set nowhere
        (["experiment.rows=0"], True),
        (["experiment.rows=3"], True),  # valid
        (["experiment.rows=3", "experiment.hi=7"], True),  # valid only because of lo's default (5)
        (["experiment.rows=3", "experiment.hi=4"], True),
        (["experiment.rows=3", "experiment.lo=9"], True),  # refused by the default of hi
        (["experiment.rows=3", "+experiment.rowz=1"], True),
    ],
)
def test_a_users_experiment_is_refused_or_accepted_as_composing_does(mine, overrides, answers):
    said = early.refusal("mine", overrides)
    composed = checked_by_composing("mine", overrides)[0]
    assert said == (composed if answers else None)
    assert composed is None or "mine" not in composed


def test_an_experiments_default_that_interpolates_is_left_to_composing(mine):
    """Valid only once resolved: the early check, which does not resolve, says nothing."""
    assert checked_by_composing("tagged", ["seed=1"])[0] is None
    assert early.refusal("tagged", ["seed=1"]) is None


@pytest.mark.parametrize(("overrides", "refused"), [(["experiment.size=3"], False), (["seed=-1"], True)])
def test_an_experiment_with_a_field_set_after_init_is_left_to_composing(mine, overrides, refused):
    """OmegaConf sets an ``init=False`` field after ``__init__``: the early check does not guess."""
    assert early.composed("derived", overrides) is None
    assert early.refusal("derived", overrides) is None
    assert (checked_by_composing("derived", overrides)[0] is not None) == refused


def test_a_refused_value_is_one_line_and_exit_2_without_hydra(tmp_path):
    script = (
        "import sys\nfrom perflab.app import main\ncode = main(sys.argv[1:])\n"
        "print(code, *sorted(m for m in ('hydra', 'omegaconf', 'torch', 'pandas') if m in sys.modules))"
    )
    args = ["+experiment=matmul", "experiment.size=-5"]
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=tmp_path, capture_output=True, text=True)
    assert done.stdout.split() == ["2"], done.stderr
    assert done.stderr == "perflab: error: experiment.size=-5: allowed: an integer >= 1\n"


@pytest.mark.parametrize("overrides", [["bench.repeats=0"], ["+bench.repeat=3"], ["bench.warmup=0", "seed=7"]])
def test_every_preset_is_refused_or_accepted_as_composing_does(overrides):
    from perflab.app import preset_names

    for name in preset_names():
        said = early.refusal(name, overrides)
        assert said is None or said == checked_by_composing(name, overrides)[0], name


@pytest.mark.parametrize("overrides", [[], ["experiment.size=7", "bench.min_time_s=1", "+bench.repeat=3", "seed=4"]])
def test_the_plain_config_is_the_one_hydra_composes(overrides):
    """What --help prints and the early check checks: every key, value and order as composed."""
    from omegaconf import OmegaConf

    from perflab.app import preset_names
    from perflab.config.composition import compose

    answered = 0
    for name in preset_names():
        plain = early.composed(name, overrides)
        if plain is None:
            continue
        answered += 1
        assert OmegaConf.to_yaml(plain[0]) == OmegaConf.to_yaml(compose(name, overrides)[0]), name
    assert answered >= 4  # matmul and quick/matmul at least, with the overrides


@pytest.mark.parametrize("overrides", [[], ["experiment.rows=3", "experiment.hi=7"]])
def test_a_users_plain_config_is_the_one_hydra_composes(mine, overrides):
    from omegaconf import OmegaConf

    from perflab.config.composition import compose

    plain = early.composed("mine", overrides)
    assert plain is not None
    assert OmegaConf.to_yaml(plain[0]) == OmegaConf.to_yaml(compose("mine", overrides)[0])
