"""perflab's training step next to a minimal hand-written loop: tokens/s of the same small causal
transformer (examples/userpkg's TinyTransformer) on the same token sequences, with the same
seed, batches, optimizer, threads and process, in interleaved rounds (perflab first, then the
hand loop, then the other way round ...). Each side's figure is the median epoch after its
first (warm-up) epoch, as tokens per second of wall time and per CPU second (the process's
CPU time over the timed pass: perflab's ``train_cpu_s``, ``time.process_time`` for the hand
loop), which other work on a shared machine disturbs far less. Goal (issue 19): perflab /
hand-written >= 0.97.

    python benchmarks/training_overhead.py [--rounds 6] [--out benchmarks/results/training_overhead.csv]

The machine may be shared with other work: both sides run one intra-op thread (with two
threads on a busy 2-core machine, whichever side the scheduler favours wins by up to 4x),
and the script prints each round, the spread of the ratio over the rounds and the machine's
load, so a noisy result shows as noisy.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch.nn import functional as F

import perflab
from perflab.train import data

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "userpkg"))
os.environ["PYTHONPATH"] = str(ROOT / "examples" / "userpkg")

VOCAB, SEQ, D_MODEL, LAYERS = 256, 64, 64, 2
SEQUENCES, BATCH, EPOCHS, LR, SEED = 512, 32, 3, 0.05, 0
TRAIN = [
    "model._target_=userpkg.models.TinyTransformer",
    f"+model.d_model={D_MODEL}",
    f"+model.n_layers={LAYERS}",
    "data=tokens",
    f"data.vocab_size={VOCAB}",
    f"data.seq_len={SEQ}",
    f"data.train_size={SEQUENCES}",
    "data.test_size=64",
    "data.on_device=true",  # both sides index tensors in memory: the comparison is of the step
    f"trainer.batch_size={BATCH}",
    f"trainer.epochs={EPOCHS}",
    f"trainer.lr={LR}",
    "trainer.checkpoint_every=0",
    "results.table=false",
    f"seed={SEED}",
]


def perflab_tokens_per_s() -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second) of perflab's training, after epoch 1."""
    df = perflab.run("train", TRAIN)
    epochs = df[df["measurement"] == "epoch"].iloc[1:]
    per_cpu = statistics.median(epochs["items_per_s"] * epochs["train_s"] / epochs["train_cpu_s"])
    return float(df[df["measurement"] == "train"]["items_per_s"].iloc[0]), per_cpu


def hand_written_tokens_per_s() -> tuple[float, float]:
    """The loop a user would write: same model, data, batches and SGD; nothing else."""
    from userpkg.models import TinyTransformer

    torch.manual_seed(SEED)
    model = TinyTransformer(VOCAB, SEQ, d_model=D_MODEL, n_layers=LAYERS)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    inputs, targets = data.token_sequences(SEQUENCES, SEQ, VOCAB, SEED, split=0).tensors
    batches = data.Batches(data.token_sequences(SEQUENCES, SEQ, VOCAB, SEED, split=0), BATCH, seed=SEED)
    times, cpu = [], []
    for epoch in range(EPOCHS):
        order = batches.index_batches(epoch)
        t0, c0 = time.perf_counter(), time.process_time()
        model.train()
        for idx in order:
            x, y = inputs[idx], targets[idx]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    tokens = len(order) * BATCH * SEQ
    return tokens / statistics.median(times[1:]), tokens / statistics.median(cpu[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "training_overhead.csv")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the same for both sides, and steadier on a shared machine
    ours, hand, ours_cpu, hand_cpu, loads = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        for r in range(args.rounds):
            for side in ("perflab", "hand") if r % 2 == 0 else ("hand", "perflab"):
                wall, per_cpu = perflab_tokens_per_s() if side == "perflab" else hand_written_tokens_per_s()
                (ours if side == "perflab" else hand).append(wall)
                (ours_cpu if side == "perflab" else hand_cpu).append(per_cpu)
            loads.append(os.getloadavg()[0])
            print(
                f"round {r + 1}: perflab {ours[-1]:,.0f} tokens/s, hand-written {hand[-1]:,.0f} tokens/s, "
                f"ratio {ours[-1] / hand[-1]:.3f}; per CPU second {ours_cpu[-1]:,.0f} vs {hand_cpu[-1]:,.0f}, "
                f"ratio {ours_cpu[-1] / hand_cpu[-1]:.3f} (load {loads[-1]:.1f}, {os.cpu_count()} CPUs)"
            )
    ratios = [a / b for a, b in zip(ours, hand)]
    ratio = statistics.median(ours) / statistics.median(hand)
    print(
        f"median: perflab {statistics.median(ours):,.0f}, hand-written {statistics.median(hand):,.0f} tokens/s: "
        f"ratio {ratio:.3f} (goal >= 0.97); the rounds' own ratios (each pair side by side): median "
        f"{statistics.median(ratios):.3f}, {min(ratios):.3f} .. {max(ratios):.3f}; {torch.get_num_threads()} threads, "
        f"load {min(loads):.1f} .. {max(loads):.1f} on {os.cpu_count()} CPUs"
    )
    cpu_ratios = [a / b for a, b in zip(ours_cpu, hand_cpu)]
    cpu_ratio = statistics.median(ours_cpu) / statistics.median(hand_cpu)
    print(
        f"per CPU second: perflab {statistics.median(ours_cpu):,.0f}, hand-written {statistics.median(hand_cpu):,.0f} "
        f"tokens: ratio {cpu_ratio:.3f} (goal >= 0.97); the rounds' own ratios: median "
        f"{statistics.median(cpu_ratios):.3f}, {min(cpu_ratios):.3f} .. {max(cpu_ratios):.3f}"
    )
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        f.write(
            "timestamp,host,round,perflab_tokens_per_s,hand_written_tokens_per_s,round_ratio,load_1min,"
            "ratio_of_medians,median_round_ratio,perflab_tokens_per_cpu_s,hand_written_tokens_per_cpu_s,"
            "cpu_round_ratio,cpu_ratio_of_medians\n"
        )
        for i, (a, b, load, c, d) in enumerate(zip(ours, hand, loads, ours_cpu, hand_cpu)):
            f.write(
                f"{when},{platform.node()},{i + 1},{a},{b},{a / b},{load},{ratio},{statistics.median(ratios)},"
                f"{c},{d},{c / d},{cpu_ratio}\n"
            )
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
