"""Optimizers by name or class, with their arguments; rows name them; a step split into forward,
backward and optimizer time inside the epoch's measured total."""

from __future__ import annotations

import pytest
import torch

import perflab
from perflab.config.schema import TrainerConfig
from perflab.errors import Refused
from perflab.train import optim

from conftest import FAST

SMALL = ["data.train_size=256", "data.test_size=64", "trainer.batch_size=64", "results.table=false", *FAST]


def test_adamw_by_name_trains_names_itself_and_splits_each_step_inside_the_measured_total(work):
    df = perflab.run("quick/train", [*SMALL, "trainer.optimizer=adamw", "trainer.weight_decay=0.01", "trainer.lr=0.01"])
    assert (df["status"] == "ok").all(), df[["measurement", "error"]]
    trained = df[df["measurement"].isin(["epoch", "train"])]
    assert (trained["optimizer"] == "adamw(betas=0.9,0.999, weight_decay=0.01)").all()
    epochs = df[df["measurement"] == "epoch"]
    steps = 256 // 64
    phases = epochs[["forward_s", "backward_s", "optimizer_s"]]
    assert (phases > 0).all().all(), "each phase timed"
    assert (phases.sum(axis=1) * steps <= epochs["train_s"]).all(), "the phases lie inside the epoch's time"
    summary = df[df["measurement"] == "train"].iloc[0]
    assert summary["forward_s"] == pytest.approx(epochs["forward_s"].iloc[1:].mean())


def test_scratch_has_no_one_step_to_split_and_leaves_the_columns_out(work):
    df = perflab.run("quick/train", [*SMALL, "trainer.epochs=1", "strategy=scratch", "devices.count=2"])
    assert df.attrs["outcome"] == "ok" and "forward_s" not in df


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["trainer.optimizer=adamm"], "trainer.optimizer=adamm: allowed: sgd, adam, adamw, or an optimizer class's"),
        (["trainer.optimizer=torch.optim.RMSpro"], "trainer.optimizer=torch.optim.RMSpro: torch.optim has no RMSpro"),
        (["trainer.optimizer=torch.nn.Linear"], "trainer.optimizer=torch.nn.Linear: not a torch.optim.Optimizer class"),
        (["trainer.betas=[0.9]"], "trainer.betas=[0.9]: allowed: two numbers in [0, 1)"),
        (
            ["trainer.optimizer=torch.optim.Adagrad", "trainer.momentum=0.5"],
            "trainer.momentum=0.5: Adagrad takes no momentum; allowed: 0.9 (its default) with Adagrad",
        ),
        (
            ["trainer.betas=[0.5,0.6]"],
            "trainer.betas=[0.5,0.6]: SGD takes no betas; allowed: [0.9, 0.999] (its default)",
        ),
    ],
)
def test_an_optimizer_that_is_none_is_one_line_before_anything_runs(work, overrides, line):
    with pytest.raises(Refused) as refused:
        perflab.run("quick/train", [*SMALL, *overrides])
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)


def test_each_optimizer_gets_the_arguments_it_takes():
    params = [torch.nn.Parameter(torch.zeros(2))]
    adamw = optim.factory(TrainerConfig(optimizer="adamw", weight_decay=0.05, betas=[0.8, 0.99]), 0.01)(params)
    assert isinstance(adamw, torch.optim.AdamW)
    assert adamw.param_groups[0]["betas"] == (0.8, 0.99) and adamw.param_groups[0]["weight_decay"] == 0.05
    sgd = optim.factory(TrainerConfig(momentum=0.5), 0.1)(params)
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.5
    rms = optim.factory(TrainerConfig(optimizer="torch.optim.RMSprop", momentum=0.3), 0.1)(params)
    assert isinstance(rms, torch.optim.RMSprop) and rms.param_groups[0]["momentum"] == 0.3
    # momentum 0 is none (lenet_scratch's, resnet18_concise's): no argument for Adam to refuse
    adam = optim.factory(TrainerConfig(optimizer="adam", momentum=0.0), 0.01)(params)
    assert isinstance(adam, torch.optim.Adam)
