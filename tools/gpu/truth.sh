#!/usr/bin/env bash
# Issue #32's runs on a machine with a CUDA GPU, one phase per command (a lent GPU machine runs
# 10 minutes a command, 30 in all: plan the phases, run them in this order):
#
#   tools/gpu/truth.sh tests    the whole suite, GPU tests included          -> tests.log
#   tools/gpu/truth.sh book     the book's GPU workloads at small sizes       -> rows.tar.gz, book.log
#   tools/gpu/truth.sh timing   CUDA events against torch.utils.benchmark and against a synchronized
#                               wall clock (perflab ab: interleaved), DDP's code path on
#                               the one GPU (one process)                    -> rows.tar.gz, timing.log
#
# Writes under $OUT (the device tool's folder), else ./gpu-out; the GPU's identity (model,
# driver, clocks, power limit) in gpu.csv beside the rows. On a machine without CUDA it says so
# and exits 0 having measured nothing: GPU numbers are never faked. Where perflab's own
# dependencies are missing (the lent machine lacks Hydra), wheels carried in .whl/
# (../shared/tools/device-prep.sh) are installed into .site/ first.
set -uo pipefail
phase=${1:?usage: tools/gpu/truth.sh tests|book|timing}
case "$phase" in
tests | book | timing) ;;
*)
  echo "tools/gpu/truth.sh: phase $phase: allowed: tests, book, timing" >&2
  exit 2
  ;;
esac
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target "$PWD/.site" .whl/*.whl
  export PYTHONPATH="$PWD/.site:$PWD"
fi
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "tools/gpu/truth.sh: no CUDA device here: nothing measured" >&2
  exit 0
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,clocks.sm,power.limit --format=csv >"$out/gpu.csv"
store="$out/rows"
perflab() { echo "== perflab $*"; python3 -m perflab "$@" "results.store=$store" 2>&1 | tail -n 30; }
gpu=devices.spec=[cuda:0]

case "$phase" in
tests)
  timeout 560 python3 -m pytest -q -p no:cacheprovider -rfEs 2>&1 | tee "$out/tests.log" | tail -n 60
  ;;
book)
  {
    for dtype in bfloat16 float32; do
      perflab +experiment=matmul "$gpu" experiment.size=8192 experiment.dtype=$dtype
    done
    perflab +experiment=async_compute "$gpu"
    perflab +experiment=auto_parallel "$gpu"
    perflab +experiment=hardware "$gpu"
    perflab +experiment=compile "$gpu"
    perflab -m +experiment=train "$gpu" model=lenet trainer.epochs=2 trainer.batch_size=256,1024
    # the book's loop (fp32, eager) against channels_last + bf16 + compile (the 3x goal)
    perflab -m +experiment=train "$gpu" model=resnet18 trainer.epochs=1 trainer.batch_size=128,256
    perflab +experiment=train "$gpu" model=resnet18 trainer.epochs=1 trainer.batch_size=256 \
      model.channels_last=true trainer.precision=bf16-mixed trainer.compile=true
    perflab +experiment=infer "$gpu" model=torchvision model.arch=resnet18 data.shape=[3,224,224]
    perflab +experiment=generate "$gpu"
  } 2>&1 | tee "$out/book.log"
  tar -czf "$out/rows.tar.gz" -C "$out" rows && rm -rf "$store"
  ;;
timing)
  {
    python3 -m perflab ab +experiment=matmul "$gpu" experiment.size=4096 experiment.dtype=bfloat16 \
      --base bench.timer=cuda_event --new bench.timer=torch_utils_benchmark --budget 3 --out "$store/timer_ab"
    python3 -m perflab ab +experiment=matmul "$gpu" experiment.size=1024 \
      --base bench.timer=cuda_event --new bench.timer=wall_sync --budget 2 --out "$store/sync_ab"
    # DDP's code path on the one GPU (perflab refuses a GPU listed twice: one process, NCCL)
    perflab +experiment=train model=lenet strategy=ddp "$gpu" trainer.epochs=1
  } 2>&1 | tee "$out/timing.log"
  tar -czf "$out/rows.tar.gz" -C "$out" rows && rm -rf "$store"
  ;;
esac
