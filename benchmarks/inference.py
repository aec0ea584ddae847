"""perflab's inference and generation figures next to torch.utils.benchmark's, on the same
models in the same process, in interleaved rounds (perflab first, then torch's, then the other
way round ...): a timm ResNet-18 forward (batch 1, 3x224x224, eval, inference_mode) and a small
GPT-2's prefill (time to first token) and decode (seconds per token). The figure compared is
the best sample (min) of each side, which other work on a shared machine disturbs least, and
the median beside it. Goal (issue 30): perflab / torch.utils.benchmark within +-3 % on best
samples. Decode per token: perflab times each token; torch.utils.benchmark's side is (the whole
generate - the prefill) / the decode steps, an average over a call's tokens, so its "best" is no
single token's: compare decode's medians. optimum-benchmark is not installed here (and has no
offline install): not compared.

    python benchmarks/inference.py [--rounds 3] [--out benchmarks/results/inference.csv]

Both sides run one intra-op thread; the script prints each round and the machine's load.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch.utils import benchmark as tub

import perflab

ROOT = Path(__file__).resolve().parents[1]
GPT2 = {"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 1000, "n_positions": 512}
PROMPT, NEW = 64, 16
QUIET = ["results.table=false", "bench.warmup=3", "bench.repeats=30", "bench.min_time_s=0.5"]


def perflab_side(folder: str) -> dict[str, tuple[float, float]]:
    """(best, median) seconds: ResNet-18's forward, GPT-2's prefill, and its decode per token."""
    rows = perflab.run(
        "infer", ["model=timm", "model.arch=resnet18", "data.shape=[3,224,224]", "experiment.batches=[1]", *QUIET]
    )
    forward = rows[rows["measurement"] == "forward batch 1"].iloc[0]
    gen = perflab.run(
        "generate",
        ["model=hf", f"model.name={folder}", f"experiment.prompt_len={PROMPT}", f"experiment.new_tokens={NEW}", *QUIET],
    ).set_index("measurement")
    return {
        "resnet18 forward": (forward["min_s"], forward["median_s"]),
        "gpt2 prefill": (gen.loc["prefill", "min_s"], gen.loc["prefill", "median_s"]),
        "gpt2 decode per token": (gen.loc["decode", "min_s"], gen.loc["decode", "median_s"]),
    }


def torch_side(folder: str) -> dict[str, tuple[float, float]]:
    import timm
    from transformers import AutoModelForCausalLM

    def timed(fn, min_run_time: float = 1.0) -> tub.Measurement:
        with torch.inference_mode():
            fn()  # its own warm-up
            return tub.Timer(stmt="fn()", globals={"fn": fn}, num_threads=1).blocked_autorange(
                min_run_time=min_run_time
            )

    def best_median(m: tub.Measurement) -> tuple[float, float]:
        return min(m.times), m.median

    net = timm.create_model("resnet18", pretrained=False).eval()
    x = torch.randn(1, 3, 224, 224)
    forward = timed(lambda: net(x))
    lm = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    ids = torch.randint(0, GPT2["vocab_size"], (1, PROMPT))
    args = {"do_sample": False, "pad_token_id": 0, "attention_mask": torch.ones_like(ids)}
    prefill = timed(lambda: lm.generate(ids, max_new_tokens=1, min_new_tokens=1, **args))
    whole = timed(lambda: lm.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, **args))
    # decode per token: (the whole call - the prefill) / the decode steps, on each side's best and median
    per_token = tuple((w - p) / (NEW - 1) for w, p in zip(best_median(whole), best_median(prefill)))
    return {
        "resnet18 forward": best_median(forward),
        "gpt2 prefill": best_median(prefill),
        "gpt2 decode per token": per_token,  # type: ignore[dict-item]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "inference.csv"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoConfig, AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)
        folder = str(Path(work) / "gpt2")
        config = AutoConfig.for_model("gpt2", **GPT2, bos_token_id=0, eos_token_id=0)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(folder)
        found: dict[str, dict[str, list[tuple[float, float]]]] = {"perflab": {}, "torch.utils.benchmark": {}}
        for r in range(args.rounds):
            sides = [("perflab", perflab_side), ("torch.utils.benchmark", torch_side)]
            for name, side in sides if r % 2 == 0 else sides[::-1]:
                for what, figures in side(folder).items():
                    found[name].setdefault(what, []).append(figures)
                    best, median = figures[0] * 1e3, figures[1] * 1e3
                    print(f"round {r + 1} {name:22} {what:22} best {best:8.3f} ms, median {median:8.3f} ms")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        "when,what,perflab_best_s,torch_best_s,ratio_best,perflab_median_s,torch_median_s,ratio_median,"
        "rounds,load,machine"
    ]
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for what in found["perflab"]:
        ours, theirs = found["perflab"][what], found["torch.utils.benchmark"][what]
        best = (min(b for b, _ in ours), min(b for b, _ in theirs))
        median = (statistics.median(m for _, m in ours), statistics.median(m for _, m in theirs))
        print(
            f"{what:22} perflab / torch.utils.benchmark: best {best[0] / best[1]:.3f}, "
            f"median {median[0] / median[1]:.3f} ({args.rounds} rounds, load {load})"
        )
        lines.append(
            f"{when},{what},{best[0]:.6g},{best[1]:.6g},{best[0] / best[1]:.4f},{median[0]:.6g},{median[1]:.6g},"
            f"{median[0] / median[1]:.4f},{args.rounds},{load},{platform.node()}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = not out.exists()
    with out.open("a") as f:
        f.write("\n".join(lines if header else lines[1:]) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
