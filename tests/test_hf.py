"""Hugging Face models as they come: a folder written by save_pretrained, random weights from a
config class, a plain ``_target_`` of transformers; their outputs unwrapped in one place; each
mistake one line before anything is timed. Tiny models (1 layer, 32 wide, 100 tokens): seconds."""

from __future__ import annotations

import json
import shutil

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
        (["model.name=EMPTY"], "model.name=EMPTY: the folder has no config.json; allowed: a folder written by"),
        (
            ["model.config.model_type=llama", "+model.config.hidden_sizee=64"],  # else a default 7B Llama
            "model.config.hidden_sizee=64: LlamaConfig has no key hidden_sizee; did you mean model.config.hidden_size?"
            "; allowed: the keys LlamaConfig takes: vocab_size, hidden_size,",
        ),
        (
            ["model.config.model_type=gpt2", "+model.config.n_layr=1"],
            "model.config.n_layr=1: GPT2Config has no key n_layr; did you mean model.config.n_layer?",
        ),
        (
            ["model.config.model_type=gpt2", "+model.config.n_layer=abc"],
            "model.config.n_layer=abc: GPT2Config refuses it: TypeError: Field 'n_layer' expected int",
        ),
        (
            ["model.config.model_type=gpt2", "+model.config.n_layer=1", "+model.config.n_embd=-3"],
            "model.config.n_embd=-3: a size of the model; allowed: an integer >= 1",
        ),
        (  # range(-1) builds no layer: measured as if it were a model
            ["model.config.model_type=gpt2", "+model.config.n_layer=-1"],
            "model.config.n_layer=-1: a size of the model; allowed: an integer >= 1",
        ),
        (["model.name=NEGATIVE"], "model.name=NEGATIVE: its config.json sets n_positions=-4, a size below 1; allowed:"),
        (
            ["model.config.model_type=gpt2", "model.task=seq2seq-lm"],
            "model.task=seq2seq-lm: gpt2 has no seq2seq-lm model; allowed: a task gpt2 has a model for: auto, "
            "causal-lm, sequence-classification, base",
        ),
    ],
)
def test_a_missing_folder_or_an_unknown_name_is_one_line_before_anything_runs(
    work, gpt2_folder, tmp_path, overrides, line
):
    (tmp_path / "EMPTY").mkdir()  # a folder, but not save_pretrained's
    negative = tmp_path / "NEGATIVE"  # a folder whose config.json says a size no model has
    shutil.copytree(gpt2_folder, negative)
    config = json.loads((negative / "config.json").read_text())
    (negative / "config.json").write_text(json.dumps({**config, "n_positions": -4}))
    given = list(overrides)
    for word, place in (("FOLDER", gpt2_folder), ("EMPTY", tmp_path / "EMPTY"), ("NEGATIVE", negative)):
        given, line = [o.replace(word, str(place)) for o in given], line.replace(word, str(place))
    with pytest.raises(Refused) as refused:
        perflab.run("quick/train", [*TOKENS, "model=hf", *given])
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)
    assert not list(work.glob("outputs/runs/*/results.csv")), "nothing measured"


def test_an_unknown_hub_id_without_the_hub_is_one_line_at_once(work, monkeypatch, capfd):
    from perflab.models import huggingface as hf

    if hf.hub_reachable():
        pytest.skip("the hub can be reached from here: huggingface_hub answers for it")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(Refused) as refused:
        perflab.run("quick/train", [*TOKENS, "model=hf", "model.name=facebook/opt-nonexistent-125m"])
    assert str(refused.value) == (
        "model.name=facebook/opt-nonexistent-125m: not a local folder, and not in the Hugging Face cache, and the "
        f"hub ({hf._endpoint()}) cannot be reached; allowed: a folder written by save_pretrained, or a hub id "
        "already in the Hugging Face cache"
    )
    assert "Retrying" not in "".join(capfd.readouterr()), "no retries of huggingface_hub's"


def test_random_weights_larger_than_the_free_memory_are_an_oom_row_predicted_before_allocating(work):
    wide = ["model=hf", "model.config.model_type=gpt2", "+model.config.n_layer=1", "+model.config.n_embd=131072"]
    df = perflab.run("quick/train", [*TOKENS, *wide, "+model.config.n_head=1", "+model.config.vocab_size=100"])
    row = df.iloc[0]
    assert len(df) == 1 and row["status"] == "oom", df[["measurement", "status", "error"]]
    assert "(predicted)" in row["error"] and row["predicted_bytes"] > row["available_bytes"]
    assert row["predicted_bytes"] > 12 * 131072**2 * 4, "one layer's weights in float32, at least"


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


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_a_model_folder_rewritten_is_a_new_point_and_the_same_folder_is_done(cli, work, tmp_path):
    """The done marks key a folder model by its contents, not the name typed: the same folder
    again is done; after save_pretrained wrote other weights (and another config) over it, the
    point is measured again, and its rows say which contents each run measured."""
    from perflab import compare
    from perflab.job.sweep import job_dirs
    from perflab.results import load
    from perflab.store.rundir import RunRecord

    def last_sweep():
        return max((work / "outputs" / "sweeps").iterdir(), key=lambda p: p.stat().st_mtime_ns)

    def outcomes():
        return [RunRecord.read(j).outcome for j in job_dirs(last_sweep())]

    folder = save_gpt2(tmp_path / "model")
    point = ["-m", "+experiment=quick/infer", "model=hf", f"model.name={folder}", "experiment.batches=[1]"]
    point += ["results.table=false", *FAST]
    cli(*point)
    cli(*point)
    assert outcomes() == ["done"], "the same folder: the same point"
    transformers.set_seed(1)
    save_gpt2(folder, n_layer=2)  # the user overwrote it: other weights, another config
    cli(*point)
    assert outcomes() == ["ok"], "a rewritten folder is measured again, not 'already done'"
    cli(*point)
    assert outcomes() == ["done"]
    rows = load(work / "outputs")
    assert (rows.groupby("run_id")["model_digest"].nunique() == 1).all(), "each run's rows name their contents"
    assert rows["run_id"].nunique() == 2 and rows["model_digest"].nunique() == 2, "two runs, two contents"
    assert rows["config_hash"].nunique() == 1, "the same config: compare still pairs old and new weights"
    table = compare.compare(rows=rows)
    forward = table[table["measurement"] == "forward batch 1"]
    assert forward["model_digest"].nunique() == 2, "one tree's table: a line per contents, never pooled"
    record = RunRecord.read(job_dirs(last_sweep())[0])
    assert record is not None and record.model_digest in set(rows["model_digest"]), "run.json keeps it (a rebuild)"


def test_compare_pairs_a_folders_old_and_new_weights_and_says_their_contents_differ(cli, work, tmp_path):
    from perflab import compare
    from perflab.analysis.comparison import MODEL_CONTENTS_DIFFER

    folder = save_gpt2(tmp_path / "model")
    point = ["+experiment=quick/infer", "model=hf", f"model.name={folder}", "experiment.batches=[1]"]
    cli(*point, "results.store=old", "results.table=false", *FAST)
    transformers.set_seed(1)
    save_gpt2(folder)  # other weights, the same config
    cli(*point, "results.store=new", "results.table=false", *FAST)
    df = compare.ab(work / "old", work / "new")
    assert not df.empty and ("change" not in df or df["change"].isna().all()), "every point paired"
    assert (df["identity"].fillna("") == "").all(), "not a different machine: judged"
    assert sum(MODEL_CONTENTS_DIFFER in n for n in df.attrs["notes"]) == 1, "said once, not once per point"
    assert len(df) > 1
    same = compare.ab(work / "old", work / "old")
    assert not any(MODEL_CONTENTS_DIFFER in n for n in same.attrs["notes"])


def test_two_folders_in_one_tree_compare_against_a_baseline_folder(cli, work, tmp_path):
    """Two model folders are two configs (model.name): their digests are no key of the table,
    and --baseline model.name=A finds A's row for B's (a digest key matched nothing)."""
    from perflab import compare

    a, b = save_gpt2(tmp_path / "a"), save_gpt2(tmp_path / "b", n_layer=2)
    for folder in (a, b):
        cli("+experiment=quick/infer", "model=hf", f"model.name={folder}", "experiment.batches=[1]")
    table = compare.compare(work / "outputs", by=["model.name"], baseline=f"model.name={a}")
    forward = table[table["measurement"] == "forward batch 1"].set_index("cfg.model.name")
    assert "model_digest" not in table
    assert forward.loc[str(a), "significance"] == "baseline"
    assert forward.loc[str(b), "significance"] != "no baseline" and forward.loc[str(b), "speedup_vs_baseline"] > 0


def test_a_large_weight_file_counts_by_its_size_and_time(tmp_path, monkeypatch):
    """Weights above SMALL_FILE are not read: their name, size and modification time are the digest."""
    import os

    from perflab.measure import environment

    monkeypatch.setattr(environment, "SMALL_FILE", 0)
    folder = save_gpt2(tmp_path / "m")
    named = type("M", (), {"name": str(folder)})()
    first = environment.model_contents(named)["model_digest"]
    weights = next(f for f in folder.iterdir() if f.suffix in (".safetensors", ".bin"))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert environment.model_contents(named)["model_digest"] != first


def test_a_model_digest_is_of_a_folder_only(tmp_path):
    from perflab.measure.environment import model_contents

    assert model_contents(None) == {} and model_contents(type("M", (), {"name": "gpt2"})()) == {}
    folder = save_gpt2(tmp_path / "m")
    named = type("M", (), {"name": str(folder)})()
    first = model_contents(named)["model_digest"]
    assert model_contents(named) == {"model_digest": first}, "reading twice changes nothing"
    (folder / ".cache").mkdir()
    (folder / ".cache" / "lock").write_text("a tool's own file")
    assert model_contents(named) == {"model_digest": first}, "hidden files and folders (.git/) are not the model"
    (folder / "config.json").write_text((folder / "config.json").read_text().replace('"n_head": 2', '"n_head": 1'))
    assert model_contents(named)["model_digest"] != first
