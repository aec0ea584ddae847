"""history never joins two model folder contents in one series: a folder rewritten with other
weights or another config (its rows' ``model_digest`` differ) is a series per contents, as
compare's table gives each its own line; two folders are two points already (model.name)."""

from __future__ import annotations

import numpy as np
import pytest

from perflab import history
from perflab.store.rundir import RunWriter

from conftest import FAST, timed_row

IDENTITY = {"cpu_model": "Test CPU", "num_threads": 2, "torch": "2.14.1"}


def write_runs(root, folder, digests_and_medians, *, seed=0, first=0):
    """One infer run dir per subject (s00, s01 ...), its model folder ``folder`` with the
    contents ``digest`` at that subject, raw sample times around its median."""
    rng = np.random.default_rng(seed)
    for i, (digest, median) in enumerate(digests_and_medians, start=first):
        times = median * (1 + rng.normal(0, 0.01, 12))
        run = f"{folder}-{i:02d}"
        RunWriter(root / run).add(
            timed_row(
                times,
                run_id=run,
                experiment="infer",
                measurement="forward batch 1",
                **{
                    "device_name": "CPU (2 threads)",
                    "subject": f"s{i:02d}",
                    "subject_time": f"2026-01-{i + 1:02d}T00:00:00+00:00",
                    "timestamp": f"2026-02-01T00:00:{i:02d}+00:00",
                    "run_dir": str(root / run),
                    "cfg.model.name": folder,
                    "model_digest": digest,
                    **IDENTITY,
                },
            ),
            samples=list(times),
        )


def test_a_rewritten_folder_is_a_series_per_contents_not_a_regression(tmp_path):
    """The same folder, 12 subjects: the first 6 measured a small model, the last 6 the bigger
    one the user saved over it (30 % slower). Joined, that is a 'regression' at s06 that no
    commit made; split, each contents' series is flat."""
    write_runs(tmp_path, "tiny-gpt2", [("aaaa", 1.0)] * 6 + [("bbbb", 1.3)] * 6)
    series = history.load_series([str(tmp_path)])
    assert sorted((s.point["model_digest"], s.names[0], len(s.names)) for s in series) == [
        ("aaaa", "s00", 6),
        ("bbbb", "s06", 6),
    ]
    assert all("model_digest=" in s.label for s in series), "the series say which contents"
    assert history.judge(series) == []
    assert history.main([str(tmp_path)]) == 0, "no regression: the change was the folder's, not the code's"


def test_a_step_within_one_contents_is_still_found(tmp_path):
    """Splitting by contents hides no real change: the same contents 10 % slower from s06 is a
    regression as before, while the other contents' runs stay out of its series."""
    write_runs(tmp_path, "tiny-gpt2", [("aaaa", 1.0)] * 6 + [("aaaa", 1.1)] * 6)
    write_runs(tmp_path, "tiny-gpt2", [("bbbb", 5.0)] * 3, seed=1, first=12)
    series = history.load_series([str(tmp_path)])
    (change,) = history.judge(series)
    assert change.label == "regression" and change.series.point["model_digest"] == "aaaa"
    assert (change.series.names[change.at - 1], change.series.names[change.at]) == ("s05", "s06")


def test_two_folders_are_two_points_with_no_digest_in_their_labels(tmp_path):
    write_runs(tmp_path, "a", [("aaaa", 1.0)] * 3)
    write_runs(tmp_path, "b", [("bbbb", 2.0)] * 3, seed=1)
    series = history.load_series([str(tmp_path)])
    assert sorted((s.point for s in series), key=str) == [{"model.name": "a"}, {"model.name": "b"}]


def test_a_real_folder_rewritten_between_two_subjects_is_two_series(cli, work, tmp_path):
    transformers = pytest.importorskip("transformers")

    def save(n_layer):
        config = transformers.AutoConfig.for_model(
            "gpt2", n_layer=n_layer, n_embd=32, n_head=2, vocab_size=100, n_positions=64
        )
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")

    point = ["+experiment=quick/infer", "model=hf", f"model.name={tmp_path / 'model'}", "experiment.batches=[1]"]
    save(1)
    cli(*point, "results.subject=v1", "results.table=false", *FAST)
    save(2)  # the user saved another model over it
    cli(*point, "results.subject=v2", "results.table=false", *FAST)
    series = [s for s in history.load_series([str(work / "outputs")]) if s.measurement == "forward batch 1"]
    assert len(series) == 2 and sorted(len(s.names) for s in series) == [1, 1]
    assert len({s.point["model_digest"] for s in series}) == 2
