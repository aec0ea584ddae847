"""Hugging Face models as they come: a folder written by save_pretrained, random weights from a
config class, a plain ``_target_`` of transformers; their outputs unwrapped in one place; each
mistake one line before anything is timed. Tiny models (1 layer, 32 wide, 100 tokens): seconds."""

from __future__ import annotations

import pytest

import perflab
from perflab.errors import Refused

from conftest import FAST

transformers = pytest.importorskip("transformers")

TINY_GPT2 = {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 100, "n_positions": 64}
TOKENS = [
    "data=tokens",
    "data.vocab_size=100",
    "data.seq_len=16",
    "data.train_size=64",
    "data.test_size=32",
    "trainer.batch_size=16",
    "trainer.epochs=1",
    "results.table=false",
    *FAST,
]


def save_gpt2(folder, **over):
    cfg = transformers.AutoConfig.for_model("gpt2", **{**TINY_GPT2, "bos_token_id": 0, "eos_token_id": 0, **over})
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    return save_gpt2(tmp_path_factory.mktemp("models") / "tiny-gpt2")


def test_a_gpt2_from_a_local_folder_trains_with_no_adapter(work, gpt2_folder):
    df = perflab.run("quick/train", ["model=hf", f"model.name={gpt2_folder}", *TOKENS])
    assert (df["status"] == "ok").all(), df[["measurement", "error"]]
    summary = df[df["measurement"] == "train"].iloc[0]
    assert summary["model"] == f"hf.{gpt2_folder}" and summary["items_unit"] == "tokens"
    assert summary["cfg.model.name"] == str(gpt2_folder) and summary["items_per_s"] > 0
    # its masking code reads values back (no meta run): counted on a real copy, attention included
    matmuls = 12 * 32 * 32 + 32 * 100  # per layer: qkv, proj, 2 MLP (4x wide); the head over the vocabulary
    assert summary["flops_per_item"] > 6 * matmuls and summary["tflops"] > 0


def test_random_weights_from_a_config_and_a_plain_transformers_target_train(work):
    by_type = [
        "model=hf",
        "model.config.model_type=gpt2",
        *(f"+model.config.{k}={v}" for k, v in TINY_GPT2.items()),
    ]
    by_target = [
        "model._target_=transformers.GPT2LMHeadModel",
        "+model.config._target_=transformers.GPT2Config",
        *(f"+model.config.{k}={v}" for k, v in TINY_GPT2.items()),
    ]
    for overrides, label in ((by_type, "hf.gpt2"), (by_target, "transformers.GPT2LMHeadModel")):
        df = perflab.run("quick/train", [*overrides, *TOKENS])
        summary = df[df["measurement"] == "train"].iloc[0]
        assert summary["status"] == "ok" and summary["model"] == label, df[["measurement", "error"]]


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["model.name=/no/such/folder"], "model.name=/no/such/folder: no such folder; allowed: a folder written by"),
        (["model.name=FOLDER", "data.vocab_size=256"], "data.vocab_size=256: the model's config decides its "),
        (["model.name=FOLDER", "data.seq_len=128"], "data.seq_len=128: the model holds no more positions"),
        (["model.config.model_type=gpt3"], "model.config.model_type=gpt3: not a model type of transformers; did you"),
        ([], "model.name=None: neither model.name nor model.config;"),
    ],
)
def test_a_missing_folder_or_an_unknown_name_is_one_line_before_anything_runs(work, gpt2_folder, overrides, line):
    given = [o.replace("FOLDER", str(gpt2_folder)) for o in overrides]
    with pytest.raises(Refused) as refused:
        perflab.run("quick/train", [*TOKENS, "model=hf", *given])
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)
    assert not list(work.glob("outputs/runs/*/results.csv")), "nothing measured"


def test_the_hf_keys_leave_every_earlier_runs_hash_as_it_was():
    from perflab.config.schema import config_hash

    before = {"model": {"_target_": "perflab.models.lenet", "arch": None}, "seed": 0}
    after = {"model": {**before["model"], "name": None, "config": {}, "task": None}, "seed": 0}
    assert config_hash(before) == config_hash(after)
    assert config_hash(before) != config_hash({**after, "model": {**after["model"], "name": "x"}})


def test_an_hf_output_becomes_a_tensor_in_one_place():
    import torch

    from perflab.models import huggingface as hf

    net = hf.Unwrapped(hf.build(config={"model_type": "gpt2", **TINY_GPT2}))
    out = net.eval()(torch.randint(0, 100, (2, 8)))
    assert isinstance(out, torch.Tensor) and out.shape == (2, 8, 100)
    spec = hf.input_spec(net, seq_len=500)
    assert spec.tokens and spec.shape == (64,) and spec.classes == 100, "capped at the model's positions"


def test_random_weights_pick_the_task_a_config_is_for():
    from perflab.models import huggingface as hf

    def chosen(model_type):
        return hf._model_class(transformers, transformers.AutoConfig.for_model(model_type), "auto", False)

    assert {t: chosen(t) for t in ("gpt2", "bert", "vit")} == {
        "gpt2": transformers.AutoModelForCausalLM,
        "bert": transformers.AutoModelForSequenceClassification,  # an encoder: no causal head unless is_decoder
        "vit": transformers.AutoModelForImageClassification,
    }
