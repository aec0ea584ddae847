"""generate's per-token times come from a streamer's ``put()`` (``_Stamps``): each stamp must
be read when its own token is chosen, not one step later. A tiny GPT-2 whose forward sleeps at
one chosen call shows which step carries the sleep."""

from __future__ import annotations

import time

import pytest
import torch

transformers = pytest.importorskip("transformers")

SLEEP_S = 0.25  # far above a busy machine's stall (a step here is ~0.5 ms; at load 7 one stalled 50 ms)


def stamps_with_a_slow_forward(slow_call: int, new_tokens: int = 8) -> tuple[float, list[float]]:
    """The seconds from the call's start to each token's stamp, with forward call ``slow_call``
    (0: the prompt's, k: the one that chooses token k) sleeping SLEEP_S."""
    from perflab.experiments.generate import Generator
    from perflab.measure.devices import Device

    transformers.set_seed(0)
    cfg = transformers.AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    calls = []

    def slow(module, args):
        if len(calls) == slow_call:
            time.sleep(SLEEP_S)
        calls.append(1)

    model.register_forward_pre_hook(slow)
    gen = Generator(model, Device("cpu", "cpu"))
    with torch.inference_mode():
        t0 = gen.now()
        times, _ = gen.run(torch.randint(0, 100, (1, 8)), new_tokens)
    assert len(calls) == new_tokens, "one forward a token: the prompt's, then one per decode step"
    return t0, times


@pytest.mark.parametrize("slow_call", [3, 6])
def test_a_slow_decode_step_is_the_per_token_latency_at_its_own_index(slow_call):
    t0, times = stamps_with_a_slow_forward(slow_call)
    steps = [b - a for a, b in zip(times, times[1:])]  # as run() derives decode's samples
    assert len(times) == 8 and len(steps) == 7
    slowest = max(range(len(steps)), key=steps.__getitem__)
    assert slowest == slow_call - 1, f"token {slow_call}'s step is decode sample {slow_call - 1}: {steps}"
    assert steps[slow_call - 1] >= SLEEP_S


def test_a_slow_prompt_forward_is_the_first_tokens_time_not_a_decode_step():
    t0, times = stamps_with_a_slow_forward(0)
    steps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] - t0 >= SLEEP_S and all(s < times[0] - t0 for s in steps)


def test_a_device_where_transformers_streams_late_is_refused_by_its_own_rule():
    """transformers 5 defers its stop check on mps (tokens streamed a step late): generate
    refuses such a device; cpu and cuda stream each token as it is chosen."""
    from transformers.generation import utils

    from perflab.experiments.generate import streams_late

    assert not streams_late("cpu") and not streams_late("cuda")
    assert streams_late("mps") == hasattr(utils, "DeferredStopCheck")
