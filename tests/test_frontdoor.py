"""The front door's check of a config mistake (issues 31 and 45): a plain run's config composed
once with Hydra's compose API and checked as the job checks it, before hydra.main and torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from perflab.app import checked_by_composing
from perflab.config import registry

# (experiment, overrides, the line it is refused with: None for a valid run)
CASES = [
    ("matmul", ["experiment.size=-5"], "experiment.size=-5: allowed: an integer >= 1"),
    ("matmul", ["seed=-1"], "seed=-1: allowed: an integer from 0 to 4294967295 (numpy's seed range)"),
    ("matmul", ["bench.min_time_s=1", "bench.repeats=0"], "bench.repeats=0: allowed: an integer >= 1"),
    ("quick/matmul", ["experiment.iterations=0"], "experiment.iterations=0: allowed: an integer >= 1"),
    ("matmul", ["experiment.size=5", "bench.min_time_s=1", "devices.threads=null", "results.store=a/b"], None),
    ("matmul", ["experiment.size=${bench.warmup}"], None),  # warmup 2: valid once resolved
    ("train", ["trainer.epochs=0"], "trainer.epochs=0: allowed: an integer >= 1"),  # a preset with model/data
]


@pytest.mark.parametrize(("experiment", "overrides", "line"), CASES)
def test_a_plain_runs_mistake_is_refused_from_its_composed_config(experiment, overrides, line):
    assert checked_by_composing(experiment, overrides) == line


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
    ("overrides", "refused"),
    [
        ([], True),  # rows set nowhere
        (["experiment.rows=0"], True),
        (["experiment.rows=3"], False),
        (["experiment.rows=3", "experiment.hi=7"], False),  # valid only because of lo's default (5)
        (["experiment.rows=3", "experiment.hi=4"], True),
        (["experiment.rows=3", "experiment.lo=11"], True),  # refused by the default of hi (10)
        (["experiment.rows=3", "+experiment.rowz=1"], True),
    ],
)
def test_a_users_experiment_is_refused_or_accepted_as_its_config_says(mine, overrides, refused):
    said = checked_by_composing("mine", overrides)
    assert (said is not None) == refused
    assert said is None or "mine" not in said


def test_an_experiments_default_that_interpolates_is_checked_resolved(mine):
    assert checked_by_composing("tagged", ["seed=1"]) is None


@pytest.mark.parametrize(("overrides", "refused"), [(["experiment.size=3"], False), (["seed=-1"], True)])
def test_an_experiment_with_a_field_set_after_init_is_checked_as_composed(mine, overrides, refused):
    """OmegaConf sets an ``init=False`` field after ``__init__``."""
    assert (checked_by_composing("derived", overrides) is not None) == refused


def test_a_refused_value_is_one_line_and_exit_2_before_torch(tmp_path):
    script = (
        "import sys\nfrom perflab.app import main\ncode = main(sys.argv[1:])\n"
        "print(code, *sorted(m for m in ('torch', 'pandas') if m in sys.modules))"
    )
    args = ["+experiment=matmul", "experiment.size=-5"]
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=tmp_path, capture_output=True, text=True)
    assert done.stdout.split() == ["2"], done.stderr
    assert done.stderr == "perflab: error: experiment.size=-5: allowed: an integer >= 1\n"
