"""optimum-benchmark's side of benchmarks/inference.py, run by the Python of the venv it is
installed in (``--optimum-python``), offline: prints one JSON object, each workload's raw
samples in seconds. Its own process, so its imports and settings stay out of the others'.
``torch``: inference.py's torch.utils.benchmark side in this venv (its transformers), to tell
optimum-benchmark's harness from the transformers version it needs.

    python _optimum_side.py {gpt2 FOLDER PROMPT NEW | resnet18 FOLDER} THREADS WARMUP MIN_TIME_S
    python _optimum_side.py torch FOLDER
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    import torch
    from optimum_benchmark import Benchmark, BenchmarkConfig, InferenceConfig, InlineConfig, PyTorchConfig

    what, *rest = sys.argv[1:]
    if what == "torch":
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:0] = [here, os.path.dirname(here)]  # inference.py and the perflab it imports
        import inference  # its constants: the same prompt, tokens, threads, warm-up and time

        torch.set_num_threads(inference.THREADS)
        print("OPTIMUM-JSON " + json.dumps(inference.torch_lm(rest[0])))
        return
    if what == "gpt2":
        folder, prompt, new, threads, warmup, min_time = rest
        backend = PyTorchConfig(model=folder, device="cpu", task="text-generation", library="transformers")
        shapes = {"batch_size": 1, "sequence_length": int(prompt)}
        kwargs = {"max_new_tokens": int(new), "min_new_tokens": int(new)}
    else:
        folder, threads, warmup, min_time = rest
        backend = PyTorchConfig(model=folder, device="cpu", task="image-classification", library="timm")
        shapes, kwargs = {"batch_size": 1}, {}
    torch.set_num_threads(int(threads))  # its inter_op_num_threads is what sets intra-op threads (0.6.0)
    scenario = InferenceConfig(
        latency=True,
        memory=False,
        duration=float(min_time),
        iterations=1,
        warmup_runs=int(warmup),
        input_shapes=shapes,
        generate_kwargs=kwargs,
    )
    config = BenchmarkConfig(name=what, launcher=InlineConfig(), scenario=scenario, backend=backend)
    report = Benchmark.launch(config)
    targets = ["prefill", "generate", "decode", "per_token"] if what == "gpt2" else ["forward"]
    out = {t: list(getattr(report, t).latency.values) for t in targets}
    out["num_threads"] = torch.get_num_threads()
    print("OPTIMUM-JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
