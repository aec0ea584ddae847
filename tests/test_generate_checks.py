"""What a user trying held-out tiny models found wrong with generate and infer (issue 30): the
decode row lacked the busy-machine columns of the calls its steps come from, infer cut
``experiment.seq_len`` to the model's positions without a word, and a user's model with fewer
positions than prompt + new tokens failed inside generating. Real tiny models, no mocks."""

from __future__ import annotations

import math

import pytest

import perflab
from perflab.errors import Refused

from conftest import FAST, ROOT

transformers = pytest.importorskip("transformers")
QUIET = ["results.table=false", *FAST]
BUSY_COLUMNS = ["others_cpu_pct", "waited_pct", "cpu_pressure_pct", "load_before", "load_after", "cpus"]


@pytest.fixture(scope="session")  # its group's worker builds it once (module: again after another module's test)
def llama(tmp_path_factory):
    """A tiny Llama with 64 positions, saved as a user would bring it."""
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=256,
        max_position_embeddings=64,
    )
    folder = tmp_path_factory.mktemp("models") / "tiny-llama"
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def busy_reason(suspect: object) -> str:
    """The busy machine's part of a row's suspect ("" if none)."""
    text = suspect if isinstance(suspect, str) else ""
    return next((part for part in text.split("; ") if part.startswith("the machine was busy")), "")


@pytest.mark.xdist_group("tiny_llama")  # one worker saves the models once
def test_the_decode_row_carries_the_busy_columns_of_its_generate_calls(work, llama):
    """decode's samples are the steps of generate's timed calls: the same machine columns and the
    same busy verdict. A tiny threshold makes any wait for a CPU a busy machine."""
    from perflab.experiments.generate import headline

    over = ["experiment.prompt_len=16", "experiment.new_tokens=8", "experiment.batch=4", "bench.busy_threshold=1e-9"]
    df = perflab.run("quick/generate", ["model=hf", f"model.name={llama}", *over, *QUIET])
    rows = df.set_index("measurement")
    generate, decode = rows.loc["generate"], rows.loc["decode"]
    for column in BUSY_COLUMNS:
        same = generate[column] == decode[column] or (math.isnan(generate[column]) and math.isnan(decode[column]))
        assert same, f"{column}: generate {generate[column]}, decode {decode[column]}"
    assert not math.isnan(decode["waited_pct"]) and not math.isnan(decode["load_before"]), "filled, not empty"
    assert busy_reason(decode["suspect"]) == busy_reason(generate["suspect"]) != "", "flagged as its calls are"
    # the headline's decode line: batch / mean step, the median step's rate beside it, and its flags
    line = next(x for x in headline(df.to_dict("records")) if x.startswith("decode:"))
    mean_rate = 4 / decode["mean_s"]
    assert line.startswith(f"decode: {mean_rate:,.0f} tokens/s" if mean_rate >= 1e4 else f"decode: {mean_rate:.4g}")
    assert "at the median step" in line and line.endswith("suspect]")


@pytest.mark.xdist_group("tiny_llama")  # one worker saves the models once
def test_infer_refuses_a_seq_len_beyond_the_models_positions(work, llama):
    """Cut short, seq_len=100 measured 64 tokens under the label 100: refused in one line instead;
    64, the model's positions, runs."""
    with pytest.raises(Refused) as refused:
        perflab.run("quick/infer", ["model=hf", f"model.name={llama}", "experiment.seq_len=100", *QUIET])
    line = str(refused.value)
    assert line == "experiment.seq_len=100: it outgrows the model's 64 positions; allowed: at most 64", line
    df = perflab.run(
        "quick/infer", ["model=hf", f"model.name={llama}", "experiment.seq_len=64", "experiment.batches=[1]", *QUIET]
    )
    forward = df[df["measurement"] == "forward batch 1"].iloc[0]
    assert forward["status"] == "ok" and forward["input"].startswith("(B, 64)")


def test_generate_refuses_a_users_model_with_fewer_positions_than_prompt_and_new_tokens(work, monkeypatch):
    """The docs' rule, data.seq_len at least prompt + new tokens, checked before generating (it
    failed inside, an IndexError of the position embedding)."""
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "userpkg"))
    over = ["data.seq_len=32", "experiment.prompt_len=30", "experiment.new_tokens=8"]
    with pytest.raises(Refused) as refused:
        perflab.run("quick/generate", ["model._target_=userpkg.models.TinyTransformer", "data=tokens", *over, *QUIET])
    line = str(refused.value)
    assert line.startswith("data.seq_len=32: ") and "\n" not in line
    assert line.endswith("allowed: at least experiment.prompt_len + experiment.new_tokens = 38"), line


def test_headlines_write_rates_with_commas_and_name_what_the_rows_hold():
    """38,598 tokens/s as the tables write it (never 3.86e+04), export_s on the terminal, the
    optimizer in training's headline, a flagged row's line flagged."""
    from perflab.experiments import infer, train

    forward = {"measurement": "forward batch 8", "status": "ok", "batch": 8, "items_per_s": 38598.0}
    forward.update(items_unit="tokens", median_s=2e-4, export_s=1.5, suspect="the machine was busy: ...")
    (line,) = infer.headline([forward])
    assert "38,598 tokens/s" in line and "export 1.5 s" in line and line.endswith("[suspect]"), line
    summary = {"measurement": "train", "status": "ok", "items_per_s": 12345.0, "per_device_items_per_s": 12345.0}
    summary.update(model="mlp", strategy="single", items_unit="images", median_s=1.0, optimizer="adamw(wd=0.01)")
    assert (
        "12,345 images/s" in train.headline([summary])[0] and "optimizer adamw(wd=0.01)" in train.headline([summary])[0]
    )
