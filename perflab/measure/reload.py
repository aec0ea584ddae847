"""Load a saved model in a fresh process and run it: ``python -m perflab.measure.reload KIND MODEL INPUT OUTPUT``.

Used by the ``compile`` experiment to prove a TorchScript file or a ``torch.export`` program
works without the code that made it. Prints ``{"load_s": ...}`` as JSON.
"""

from __future__ import annotations

import json
import sys
import time

import torch


def main(kind: str, model_path: str, input_path: str, output_path: str) -> None:
    t0 = time.perf_counter()
    model = torch.jit.load(model_path) if kind == "torchscript" else torch.export.load(model_path).module()
    load_s = time.perf_counter() - t0
    x = torch.load(input_path, weights_only=True)
    with torch.no_grad():
        torch.save(model(x), output_path)
    print(json.dumps({"load_s": load_s}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
