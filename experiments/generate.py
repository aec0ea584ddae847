"""Generation by a causal language model: ``prefill`` (time to the first token, per prompt
length) and ``decode`` (per-token latency, its percentiles, and tokens/s as ``items_per_s``),
the whole ``generate`` call, and the KV cache's memory; prompt length x new tokens x batch as
keys to sweep. Greedy decoding, every run exactly ``new_tokens`` long.

A Hugging Face model generates through its own ``generate``; a user's model through a plain
greedy loop over its ``decode(ids, cache) -> (logits, cache)`` (the protocol: logits
``(B, T, vocab)`` for the new tokens ``ids``, the prompt when ``cache`` is None, then one
token at a time with the cache it returned). Each token's time is read when it is chosen (its
logits ready, the greedy pick made), after a sync on a GPU, which HF's ``generate`` does every
token anyway to check for its end."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from perflab.config.schema import PRECISIONS, ExperimentConfig, PerflabConfig, one_of, positive
from perflab.errors import ConfigError, first_line

if TYPE_CHECKING:
    from perflab.job.context import Context
    from perflab.measure.devices import Device

METRIC = "items_per_s"
SUMMARY_ROWS = ("decode",)
PROTOCOL = (
    "a Hugging Face causal LM (model=hf), or a model with decode(ids, cache) -> (logits, cache) (docs/inference.md)"
)


@dataclass
class Config(ExperimentConfig):
    prompt_len: int = 64  # prompt tokens (random ids of the model's vocabulary)
    new_tokens: int = 32  # tokens generated per call, greedily, no early end
    batch: int = 1  # prompts per call
    precision: str = "fp32"  # fp32 | tf32 (CUDA) | bf16-mixed | fp16-mixed (autocast)

    def __post_init__(self) -> None:
        positive(self, "prompt_len", "new_tokens", "batch")
        one_of(self, "precision", PRECISIONS)


class Generator:
    """One model's greedy generation, the same call for HF and a user's model: ``run(ids, n)``
    generates ``n`` tokens and returns the seconds at which each token was chosen (``times[0]``:
    the first token's, after the prefill) and what the call returned (:func:`kv_cache` finds
    its KV cache, outside the clock).

    HF's ``generate`` stamps each token through a streamer (its ``put`` gets every token as it is
    chosen; the first ``put`` is the prompt): a call per token and nothing more. A logits
    processor cost ~20 us a token, as ``LogitsProcessorList`` reads each processor's
    ``inspect.signature`` every step (issue 30: 1-2 % of a small GPT-2's generate call)."""

    def __init__(self, net: Any, device: Device) -> None:
        from perflab.models import huggingface as hf

        self.net, self.device = net, device
        self.inner = getattr(net, "inner", net)
        self.hf = hf.is_hf(self.inner)
        if self.hf:
            eos = getattr(self.inner.generation_config, "eos_token_id", None)
            self.pad = eos if isinstance(eos, int) else 0

    def now(self) -> float:
        from perflab.measure.devices import synchronize

        synchronize([self.device])
        return time.perf_counter()

    def run(self, ids: Any, n: int) -> tuple[list[float], Any]:
        import torch

        times: list[float] = []
        if self.hf:
            out = self.inner.generate(
                ids,
                attention_mask=None if ids.is_floating_point() else torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                num_beams=1,
                pad_token_id=self.pad,
                streamer=_Stamps(times, self.now),
                return_dict_in_generate=True,
                use_cache=True,
            )
            return times, out
        logits, cache = self.inner.decode(ids, None)
        token = logits[:, -1:].argmax(-1)
        times.append(self.now())
        for _ in range(n - 1):
            logits, cache = self.inner.decode(token, cache)
            token = logits[:, -1:].argmax(-1)
            times.append(self.now())
        return times, cache


def streams_late(device_type: str) -> bool:
    """Whether transformers' ``generate`` hands each token to a streamer one step late on this
    kind of device: its ``DeferredStopCheck`` (mps, transformers 5) puts token k after the
    forward of token k + 1, so a stamp would time the next step, and the last two would share
    one. transformers' own rule is asked, so that a device it defers on later is caught too."""
    import torch

    try:
        from transformers.generation.utils import DeferredStopCheck
    except ImportError:  # transformers 4: every token streamed as it is chosen
        return False
    try:  # no cache given: it answers as for any model (conservative: a cache it cannot crop is not deferred)
        return bool(DeferredStopCheck.is_supported(torch.device(device_type), None, True, is_assistant=False))
    except TypeError:  # its signature changed: say nothing rather than refuse every generate
        return False


class _Stamps:
    """A streamer for HF's ``generate`` (its ``put(tokens)`` / ``end()``) that reads the clock
    when each new token is handed out; the first ``put`` is the prompt, not a token."""

    def __init__(self, times: list[float], now: Callable[[], float]) -> None:
        self.times, self.now, self.prompt_seen = times, now, False

    def put(self, tokens: Any) -> None:
        if self.prompt_seen:
            self.times.append(self.now())
        self.prompt_seen = True

    def end(self) -> None:
        pass


def kv_cache(returned: Any) -> Any:
    """The KV cache a generate call kept: HF's output's ``cache`` (transformers 5; its
    ``past_key_values`` before), or the user's loop's own. Read outside the clock: transformers
    5's ``past_key_values`` is a deprecated property that checks for tracing on every read."""
    if hasattr(returned, "sequences"):  # an HF GenerateOutput
        cache = returned.get("cache")
        return cache if cache is not None else returned.get("past_key_values")
    return returned


def check(settings: PerflabConfig, devices: Sequence[Device]) -> None:
    """A causal LM (HF's, or one with ``decode``) whose positions hold prompt + new tokens,
    which generates them for one prompt: before anything is timed."""
    import torch

    from perflab import models
    from perflab.experiments import infer
    from perflab.measure import precision
    from perflab.models import huggingface as hf
    from perflab.train import data

    p: Any = settings.experiment
    precision.check("experiment.precision", p.precision, devices[:1])
    if settings.model is None or settings.data is None:
        raise ConfigError("model", None, "a model and a data config (the generate preset's defaults)")
    net = models.build(settings.model, data.spec(models.fitted_data(settings.model, settings.data)))
    inner = getattr(net, "inner", net)
    label = settings.model.label
    if hf.is_hf(inner):
        if not (hasattr(inner, "can_generate") and inner.can_generate()):
            seq2seq = getattr(inner.config, "is_encoder_decoder", False)  # a random T5 is a classifier unless asked
            hint = "; model.task=seq2seq-lm builds one that does" if seq2seq else ""
            what = f"a model of {hf.kind(inner)}" + (f" for {hf.task(inner)}" if hf.task(inner) else "")
            problem = f"{type(inner).__name__} does not generate{hint}; it is {what}"
            raise ConfigError("model", label, PROTOCOL, problem=problem)
        if streams_late(devices[0].type):
            raise ConfigError(
                "devices.spec",
                devices[0].name,
                "cpu or cuda:N for a Hugging Face model's generate",
                problem="transformers streams each token one step late there (its DeferredStopCheck): "
                "per-token times would be the next step's",
            )
        longest = hf.max_positions(inner.config)
        target = getattr(inner.config, "max_target_positions", None)  # Whisper's decoder, its prompt audio
        if hf.kind(inner) == "audio features" and target:
            infer.within_positions("experiment.new_tokens", p.new_tokens, target - 1, target)  # the start token
        elif longest and getattr(inner.config, "is_encoder_decoder", False):  # the prompt's positions, the new ones'
            infer.within_positions("experiment.prompt_len", p.prompt_len, longest, longest)
            infer.within_positions("experiment.new_tokens", p.new_tokens, longest - 1, longest)  # the start token
        elif longest:
            said = f"with new_tokens={p.new_tokens} "
            infer.within_positions("experiment.prompt_len", p.prompt_len, longest - p.new_tokens, longest, said)
    elif not callable(getattr(inner, "decode", None)):
        raise ConfigError("model", label, PROTOCOL, problem="it has no decode(ids, cache) method")
    spec = infer.inputs_of(net, settings, p.prompt_len)
    if not spec.tokens and hf.is_hf(inner) and hf.kind(inner) != "audio features":
        problem = f"{type(inner).__name__} generates from {hf.kind(inner)}: perflab's prompts are token ids or audio"
        allowed = "a causal LM, an encoder-decoder of token ids, or one of audio features (Whisper)"
        raise ConfigError("model", label, allowed, problem=problem)
    if not spec.tokens and not hf.is_hf(inner):
        raise ConfigError("data", settings.data.name, "data=tokens (a language model's vocabulary: data.vocab_size)")
    if not hf.is_hf(inner) and spec.shape[0] < p.prompt_len + p.new_tokens:  # built for the data's positions
        raise ConfigError(
            "data.seq_len",
            spec.shape[0],
            f"at least experiment.prompt_len + experiment.new_tokens = {p.prompt_len + p.new_tokens}",
            problem=f"{label} is built for data.seq_len positions, fewer than the prompt and the new tokens",
        )
    try:
        with torch.inference_mode():
            Generator(net.eval(), devices[0]).run(prompt_of(spec, 1, p.prompt_len), p.new_tokens)
    except Exception as err:
        raise ConfigError(
            "model", label, PROTOCOL, problem=f"generating failed: {type(err).__name__}: {first_line(err)}"
        ) from None


def prompt_of(spec: Any, batch: int, prompt_len: int, device: Any = "cpu") -> Any:
    """What a call generates from: ``prompt_len`` random ids of the vocabulary, or the model's
    own input where it is no token ids (Whisper's audio features: its spec's, whole)."""
    import torch

    if spec.tokens:
        return torch.randint(0, spec.classes, (batch, prompt_len), device=device)
    return spec.example(batch, device)


def cache_name(cache: Any) -> str:
    """What a generate call's cache holds, as rows and lines name it: ``KV cache`` (attention's
    keys and values), ``state`` (a recurrent model's: Mamba's, RWKV's), or ``KV cache and state``
    (a hybrid's). transformers 5 keeps a recurrent layer's state in a LinearAttention layer."""
    layers = getattr(cache, "layers", None) or []
    recurrent = sum(type(layer).__name__.startswith("LinearAttention") for layer in layers)
    keyed = sum(hasattr(layer, "keys") for layer in layers)
    if (layers and recurrent == len(layers) and not keyed) or "Mamba" in type(cache).__name__:
        return "state"
    return "KV cache and state" if recurrent else "KV cache"


def tensor_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of every tensor in a KV cache, whatever holds them (tuples, lists, a DynamicCache)."""
    import torch

    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(o, seen) for o in obj)
    if isinstance(obj, dict):
        return sum(tensor_bytes(o, seen) for o in obj.values())
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith("transformers"):
        return sum(tensor_bytes(o, seen) for o in vars(obj).values())
    return 0


def run(ctx: Context) -> None:
    import torch

    from perflab.experiments import infer
    from perflab.measure import bench, flops, precision
    from perflab.measure.devices import on_device

    p, s = ctx.params, ctx.settings
    d = ctx.devices[0]
    assert s.model is not None
    net, loaded = infer.load(ctx, d)
    spec = infer.inputs_of(net, s, p.prompt_len)
    gen = Generator(net, d)
    prompt_len = p.prompt_len if spec.tokens else None  # audio features: the model's own length
    knobs: dict[str, Any] = {
        "model": s.model.label,
        "prompt_len": prompt_len,
        "new_tokens": p.new_tokens,
        "batch": p.batch,
        "input": f"(B, {p.prompt_len}) token ids < {spec.classes}" if spec.tokens else spec.describe(),
        "precision": p.precision,
        "items_unit": "tokens",
        "load_s": loaded["load_s"],
        "generator": "transformers generate (greedy)" if gen.hf else "greedy loop over decode(ids, cache)",
    }
    infer.record_load(ctx, d, loaded, **knobs)
    ids = prompt_of(spec, p.batch, p.prompt_len, d.torch)
    runs: list[list[float]] = []

    def timed(n: int) -> Callable[[], object]:
        def call() -> None:
            t0 = gen.now()
            times, _ = gen.run(ids, n)
            runs.append([t - t0 for t in times])

        return call

    with on_device(d), torch.inference_mode(), precision.applied(p.precision, d.type):
        _, returned = gen.run(ids, p.new_tokens)
        kv_mb = tensor_bytes(kv_cache(returned)) / 2**20
        knobs["cache"] = cache_name(kv_cache(returned))  # kv_cache_mb holds a recurrent model's state too
        # FLOPs of the calls themselves, counted once outside the clock (KV cache and all)
        first_flops, flops_note = flops.estimated("FLOPs", lambda: flops.count(lambda: gen.run(ids, 1)))
        whole_flops, _ = flops.estimated("FLOPs", lambda: flops.count(lambda: gen.run(ids, p.new_tokens)))
        ctx.measure(
            "prefill",
            timed(1),
            [d],
            items=p.batch * (prompt_len or 1),  # prompt tokens, or prompts of audio
            flops=first_flops,
            dtype=p.precision,
            **{**knobs, "items_unit": "tokens" if prompt_len else spec.unit},
            note="; ".join(
                n
                for n in (
                    "time to the first token: a whole call for one token (its setup: generation config, logits "
                    "processors, a new KV cache; the prompt's forward; the first greedy choice; its return); "
                    "items_per_s: prompt tokens/s",
                    flops_note,
                )
                if n
            ),
        )
        runs.clear()
        whole = ctx.measure(
            "generate",
            timed(p.new_tokens),
            [d],
            items=p.batch * p.new_tokens,
            flops=whole_flops,
            dtype=p.precision,
            kv_cache_mb=kv_mb,
            **knobs,
            note="; ".join(n for n in ("the whole call: prefill, then new_tokens - 1 decode steps", flops_note) if n),
        )
    warm = ctx.settings.bench.warmup if len(runs) > ctx.settings.bench.warmup else 0
    steps = [b - a for r in runs[warm:] for a, b in zip(r, r[1:])]
    if not steps:
        ctx.skip("decode", "new_tokens=1: no decode step after the first token", [d])
        return
    stats = bench.stats_of(steps, noise_threshold=ctx.settings.bench.noise_threshold)
    step_flops: dict[str, Any] = {}
    about_flops = flops_note
    if first_flops is not None and whole_flops is not None:
        per_step = (whole_flops - first_flops) / (p.new_tokens - 1)
        tflops = per_step / stats.median / 1e12
        step_flops = {"tflops": tflops, **ctx.utilization(tflops, [d], p.precision, per_step / p.batch)}
        about_flops = "tflops: a step's FLOPs, the whole call's less the first token's, over new_tokens - 1"
    note = (
        f"per-token latency: each decode step of the {whole.n} timed generate calls (with the KV cache); "
        "items_per_s: batch / median step (a typical step's rate; the headline's tokens/s, batch / mean step, "
        "counts every step's time); kv_cache_mb: the cache after prompt_len + new_tokens - 1 tokens (the last "
        "token's keys and values are never written)"
    )
    ctx.record(
        "decode",
        stats,
        devices=[d],
        items_per_s=p.batch / stats.median,
        kv_cache_mb=kv_mb,
        **step_flops,
        **knobs,
        suspect=stats.suspect,
        calls_of="generate",
        note="; ".join(n for n in (note, about_flops) if n),
    )


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Time to first token, and decode's tokens/s as batch / mean step: every timed step's time
    counted, stalls too (optimum-benchmark's whole decode time), beside the median step's rate
    (the row's ``items_per_s``); a flagged row's line says so."""
    from perflab.analysis.table import flags, human_time, per_s, rate
    from perflab.store.rows import number

    def flagged(r: Mapping[str, Any]) -> str:
        return f"  [{flags(r)}]" if flags(r) else ""

    by = {str(r.get("measurement")): r for r in rows if r.get("status") == "ok"}
    lines = []
    if "prefill" in by:
        r = by["prefill"]
        lines.append(
            f"{r.get('model')}: time to first token {human_time(r.get('median_s'))} "
            f"(p99 {human_time(r.get('p99_s'))}) for {number(r.get('batch')) or 0:.0f} "
            + (
                f"x {number(r.get('prompt_len')):.0f} prompt tokens"
                if number(r.get("prompt_len"))
                else "prompt" + ("s" if (number(r.get("batch")) or 0) > 1 else "")
            )
            + (f"; input {r['input']}" if r.get("input") else "")
            + flagged(r)
        )
    if "decode" in by:
        r = by["decode"]
        mean = number(r.get("mean_s"))
        whole = per_s((number(r.get("batch")) or 0) / mean, "tokens/s") if mean else "?"
        lines.append(
            f"decode: {whole} (batch / mean step; {rate(r, 'items_per_s')} at the median step), per token "
            f"p50 {human_time(r.get('p50_s'))}, p90 {human_time(r.get('p90_s'))}, p99 {human_time(r.get('p99_s'))} "
            f"(n={r.get('n')}); {r.get('cache') or 'KV cache'} {number(r.get('kv_cache_mb')) or 0:.3g} MB{flagged(r)}"
        )
    return lines
