"""Inside the clock only the user's call runs: no thread started during the job (perflab's
watchers, samplers of memory, load or energy, a pool's worker) is alive beside a timed call,
which on a 2-core machine would take a core from it, and the job's torch settings hold there
(issue 30: a fresh perflab process generated up to 33 % slower than a fresh torch one on best
samples; this is what was ruled out first)."""

from __future__ import annotations

import gc
import os
import threading

import pytest
import torch

import perflab
from perflab.experiments.generate import Generator
from perflab.measure.instruments import memory

from conftest import FAST

pytest.importorskip("transformers")


def new_threads(before: set[int | None]) -> list[str]:
    """Live threads started since ``before`` (their idents), other than the caller and tqdm's
    monitor (Hugging Face's progress bars start it; it sleeps): whoever started them, a pool's
    worker included, they could run beside a timed call."""
    return [
        t.name
        for t in threading.enumerate()
        if t.ident not in before and t is not threading.current_thread() and not type(t).__module__.startswith("tqdm")
    ]


def settings() -> tuple[object, ...]:
    """The process-wide settings a user's code runs under, that perflab has no reason to change."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("OMP_", "MKL_", "KMP_", "MALLOC_"))))
    return (
        torch.get_num_interop_threads(),
        torch.get_float32_matmul_precision(),
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled,
        torch.get_default_dtype(),
        gc.isenabled(),
        env,
    )


def test_a_timed_generate_call_runs_alone_under_the_users_settings(work, monkeypatch):
    seen: list[tuple[list[str], int, bool, bool]] = []
    inside: list[tuple[object, ...]] = []
    real = Generator.run

    def spy(self, ids, n):  # the real call, and what else runs when it starts
        seen.append(
            (new_threads(started), torch.get_num_threads(), torch.is_inference_mode_enabled(), torch.is_grad_enabled())
        )
        inside.append(settings())
        return real(self, ids, n)

    monkeypatch.setattr(Generator, "run", spy)
    before = settings()
    started = {t.ident for t in threading.enumerate()}
    df = perflab.run(
        "quick/generate",
        ["experiment.prompt_len=8", "experiment.new_tokens=3", "devices.threads=1", "results.table=false", *FAST],
    )
    assert (df["status"] == "ok").all(), df[["measurement", "error"]]
    timed = seen[1:]  # the first is check()'s dry call, before the job's settings
    assert len(timed) >= 6, "warm-up and timed calls of prefill and generate"
    assert {s[1:] for s in timed} == {(1, True, False)}, "one intra-op thread, inference_mode, no grad"
    # where the kernel keeps no resettable peak RSS (not Linux), a sampler thread is the documented fallback
    allowed = set() if memory._reset_kernel_peak() else {"perflab-rss"}
    assert all(set(names) <= allowed for names, *_ in timed), [names for names, *_ in timed]
    assert set(inside) == {before} and settings() == before, "gc, torch's flags, OMP/MKL/malloc env as the user's"
