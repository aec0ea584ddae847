"""The inference and generation experiments: latency percentiles and throughput across batch
sizes for any model perflab builds; prefill, decode and the KV cache of a causal LM, Hugging
Face's through its generate, a user's through its decode(ids, cache). Tiny models: seconds."""

from __future__ import annotations

import pytest
import torch

import perflab
from perflab.errors import Refused

from conftest import FAST, ROOT

transformers = pytest.importorskip("transformers")
QUIET = ["results.table=false", *FAST]
USERPKG = ROOT / "examples" / "userpkg"


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    from test_hf import save_gpt2

    return save_gpt2(tmp_path_factory.mktemp("models") / "tiny-gpt2")


@pytest.fixture
def userpkg(work, monkeypatch):
    monkeypatch.syspath_prepend(str(USERPKG))
    return work


def test_inference_of_a_torchvision_model_across_batches_with_percentiles(work):
    df = perflab.run(
        "quick/infer",
        ["model=torchvision", "model.arch=resnet18", "data.shape=[3,32,32]", "experiment.batches=[1,2]", *QUIET],
    )
    assert (df["status"] == "ok").all(), df[["measurement", "error"]]
    load = df[df["measurement"] == "load"].iloc[0]
    assert load["load_s"] > 0 and load["params"] == 11_181_642 and load["rss_peak_mb"] > 0
    timed = df[df["measurement"].str.startswith("forward batch")].set_index("batch")
    assert list(timed.index) == [1, 2] and (timed["items_unit"] == "images").all()
    assert ((timed["p50_s"] <= timed["p90_s"]) & (timed["p90_s"] <= timed["p99_s"])).all()
    assert list(timed["items_per_s"]) == pytest.approx(list(timed.index / timed["median_s"]))
    assert (timed["first_call_s"] > 0).all() and (timed["warmup_n"] == 1).all()
    assert (timed["tail_note"].str.startswith("p99 of 3 samples") | timed["tail_note"].str.startswith("p90")).all()
    assert "torch.inference_mode()" in timed["note"].iloc[0] and (timed["tflops"] > 0).all()


def test_inference_of_an_hf_model_takes_its_inputs_from_its_config(work, gpt2_folder):
    df = perflab.run("quick/infer", ["model=hf", f"model.name={gpt2_folder}", "experiment.batches=[2]", *QUIET])
    row = df[df["measurement"] == "forward batch 2"].iloc[0]
    assert row["status"] == "ok" and row["input"] == "(B, 32) token ids < 100" and row["items_unit"] == "tokens"
    assert row["items_per_s"] == pytest.approx(2 * 32 / row["median_s"])


def test_a_gpt2_from_a_folder_generates_prefill_decode_and_its_kv_cache(work, gpt2_folder):
    df = perflab.run(
        "quick/generate",
        ["model=hf", f"model.name={gpt2_folder}", "experiment.prompt_len=8", "experiment.new_tokens=5", *QUIET],
    )
    assert (df["status"] == "ok").all(), df[["measurement", "error"]]
    rows = df.set_index("measurement")
    assert rows.loc["prefill", "items_per_s"] == pytest.approx(8 / rows.loc["prefill", "median_s"])
    decode = rows.loc["decode"]
    assert decode["n"] == 3 * 4, "each timed call's 4 decode steps, warm-up left out"
    assert decode["items_per_s"] == pytest.approx(1 / decode["median_s"]) and decode["p99_s"] >= decode["p50_s"]
    # 1 layer: keys and values of 8 + 5 - 1 tokens, 32 wide, float32
    assert decode["kv_cache_mb"] == pytest.approx(2 * 12 * 32 * 4 / 2**20)
    # a whole call is a prefill and 4 decode steps more: on best samples, which a busy machine moves
    # least; of 3 samples each, all of one row can be disturbed: then perflab flags it, and says so
    flagged = rows.loc[["prefill", "generate"], "suspect"].fillna("").astype(str).str.len().gt(0).any()
    assert flagged or rows.loc["generate", "min_s"] > rows.loc["prefill", "min_s"]


def test_a_users_model_with_a_kv_cache_generates_through_its_decode(userpkg):
    from userpkg.models import TinyTransformer

    net = TinyTransformer(vocab_size=50, seq_len=32, d_model=32).eval()
    ids = torch.randint(0, 50, (2, 6))
    logits, cache = net.decode(ids)
    step, _ = net.decode(logits[:, -1:].argmax(-1), cache)
    full = net(torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1))
    assert torch.allclose(step[:, -1], full[:, -1], atol=1e-5), "the cache gives what recomputing gives"
    df = perflab.run(
        "quick/generate",
        ["model._target_=userpkg.models.TinyTransformer", "+model.d_model=32", "data.vocab_size=50", *QUIET],
    )
    decode = df[df["measurement"] == "decode"].iloc[0]
    assert decode["status"] == "ok" and decode["generator"] == "greedy loop over decode(ids, cache)"


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["model=lenet"], "model=lenet: it has no decode(ids, cache) method; allowed: a Hugging Face causal LM"),
        (["experiment.prompt_len=1020"], "experiment.prompt_len=1020: with new_tokens=8 it outgrows the model's 1024"),
    ],
)
def test_generation_refuses_what_cannot_generate_in_one_line(work, overrides, line):
    with pytest.raises(Refused) as refused:
        perflab.run("quick/generate", [*overrides, *QUIET])
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)


def test_inference_of_a_models_torch_export(work, monkeypatch):
    real, shapes = torch.export.export, []

    def counted(model, args, *rest, **kwargs):
        shapes.append(tuple(args[0].shape))
        return real(model, args, *rest, **kwargs)

    monkeypatch.setattr(torch.export, "export", counted)
    df = perflab.run("quick/infer", ["experiment.export=true", "experiment.batches=[1,2]", *QUIET])
    assert [s[0] for s in shapes] == [1, 2], "one export per batch, the first batch's too (not one more to check it)"
    assert (df["status"] == "ok").all(), df[["measurement", "error"]]
    timed = df[df["measurement"].str.startswith("forward batch")]
    assert len(timed) == 2 and timed["exported"].all() and (timed["export_s"] > 0).all(), "one export per batch"
    assert "torch.export.export(model, (x,)).module() per batch" in timed["note"].iloc[0]


BRANCHY = '''
import torch


class Branchy(torch.nn.Module):
    """Its path depends on its input's values: torch.export cannot capture it whole."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.head = torch.nn.Linear(28 * 28 * in_channels, num_classes)

    def forward(self, x):
        return self.head(x.flatten(1) if x.sum() > 0 else -x.flatten(1))
'''


def test_inference_refuses_an_export_of_a_model_torch_export_cannot_capture(work, monkeypatch, cli):
    (work / "branchy.py").write_text(BRANCHY)
    monkeypatch.syspath_prepend(str(work))
    ran = cli("+experiment=quick/infer", "model._target_=branchy.Branchy", "experiment.export=true", rc=2)
    line = ran.err.strip()
    assert line.startswith("perflab: error: experiment.export=True: torch.export fails on branchy.Branchy: ")
    assert "data-dependent" in line and "\n" not in line, line
    assert line.endswith("allowed: false, or a model torch.export captures whole")


def test_the_load_row_is_one_sample_that_compare_judges_as_any_time(work, cli, capsys):
    import json

    from perflab.results import load as rows_of

    for _ in range(2):
        perflab.run("quick/infer", ["experiment.batches=[1]", *QUIET])
    load = rows_of(work / "outputs").query("measurement == 'load'")
    assert len(load) == 2 and (load["n"] == 1).all() and (load["median_s"] == load["load_s"]).all()
    assert load["std_s"].isna().all() and "one sample" in load["note"].iloc[0], "its spread is unknown, said"
    runs = sorted(str(p) for p in (work / "outputs" / "runs").iterdir())
    capsys.readouterr()  # the runs' own lines, where logging writes to stdout
    points = json.loads(cli("compare", *runs, "--format", "json", rc=None).out)["points"]
    (judged,) = [p for p in points if p["measurement"] == "load"]
    assert judged["base"] > 0 and judged["new"] > 0 and "no usable" not in judged["why"], judged


@pytest.fixture
def inference_script(monkeypatch):
    """benchmarks/inference.py as a module (its helpers; it imports _results from its folder)."""
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("benchmark_inference", ROOT / "benchmarks" / "inference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_torch_side_of_inference_py_samples_single_calls_back_to_back(inference_script, monkeypatch):
    """As perflab samples: no untimed call between two timed ones (timeit(1) makes two), one call a sample."""
    monkeypatch.setattr(inference_script, "MIN_TIME_S", 0.05)
    calls = []
    m = inference_script.timed(lambda: calls.append(torch.ones(64, 64).sum()))
    assert m.number_per_run == 1 and len(m.times) > 1
    assert len(calls) == inference_script.WARMUP + len(m.times), "every call after the warm-up is a sample"
    assert sum(m.times) >= 0.05


@pytest.mark.parametrize(
    "ratios, want",
    [
        ([1.01, 0.99, 1.02, 0.98, 1.0, 1.025], (0.98, 1.025, "met")),
        ([1.05, 1.04, 1.10, 1.035, 1.2, 1.06], (1.035, 1.2, "missed")),
        ([0.84, 1.14, 1.03, 1.05, 0.99, 1.02], (0.84, 1.14, "not decided")),
    ],
)
def test_the_median_ratios_interval_says_whether_the_goal_is_met(inference_script, ratios, want):
    low, high, goal = inference_script.median_interval(ratios)
    assert (low, high, goal) == (pytest.approx(want[0]), pytest.approx(want[1]), want[2])


def test_too_few_rounds_give_no_95_percent_interval(inference_script):
    low, high, goal = inference_script.median_interval([1.0, 1.01, 0.99, 1.0, 1.0])
    assert low != low and high != high and goal == "not decided", "5 rounds: (min, max) covers 94 %, not 95"
