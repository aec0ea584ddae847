"""What each column of a results row is, once: how a file's cell is read, its unit, which
direction is better, and where it stands in the row. Rows, loading, compare, the terminal,
the report and the plots all read this table.

A column not listed here is still written and loaded (an experiment's own figures, ``cfg.*``
keys); a rate a user's experiment adds (``*_per_s``) counts as higher-is-better.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["text", "float", "int", "flag", "category", "time", ""]
# How a number of the column is written, by every table, line and page (perflab.analysis.table.shown):
# "time": seconds in s/ms/us/ns (12.3 ms); "rate": in its unit, a tiny one in a smaller prefix
# (25.1 MFLOP/s); "count": a whole count with its unit, thousands separated (46,676 images/s);
# "": a plain number (4 significant digits, 46,676 from ten thousand on).
Format = Literal["time", "rate", "count", ""]


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind = ""  # how a CSV cell is read back ("": as pandas guesses)
    unit: str = ""
    better: Literal["higher", "lower", ""] = ""  # "": not a figure to judge
    rate: bool = False  # work per median second: each raw sample implies a value too
    per_sample: bool = False  # a statistic of the raw samples' seconds: A/B judges it sample by sample
    lead: bool = False  # one of the leading columns, in this table's order
    exact: bool = False  # deterministic: the same code counts the same, whatever the load (judged by a tolerance)
    format: Format = ""  # how its numbers are written (see Format)


def _c(
    name: str,
    kind: Kind = "",
    unit: str = "",
    better: str = "",
    rate: bool = False,
    lead: bool = False,
    exact: bool = False,
    format: str | None = None,
    per_sample: bool = False,
) -> Column:
    """A column; its format, unless given, follows its unit: seconds a time, items/s a count,
    another unit per second a rate, else a plain number."""
    if format is None:
        format = "time" if unit == "s" else "count" if unit.startswith("items/s") else "rate" if "/s" in unit else ""
    return Column(name, kind, unit, better, rate, per_sample, lead, exact, format)  # type: ignore[arg-type]


COLUMNS: dict[str, Column] = {
    c.name: c
    for c in (
        # What a row is; the leading columns, in order.
        _c("row_id", "text", lead=True),
        _c("run_id", "text", lead=True),
        _c("sweep_id", "text", lead=True),
        _c("job_num", "int", lead=True),
        _c("experiment", "category", lead=True),
        _c("measurement", "text", lead=True),
        _c("repeat", lead=True),
        # Which of bench.processes' fresh processes measured the row (1..K): a replicate, neither a
        # config key (so no identity that keeps replicas apart) nor volatile (done marks hold it).
        _c("process", "int", lead=True),
        _c("rank", "int", lead=True),
        _c("status", "category", lead=True),
        _c("error", "text", lead=True),
        _c("suspect", "text", lead=True),
        _c(
            "busy", "flag", lead=True
        ),  # the machine was too busy for a clean figure (instruments.machine.busy_reason; suspect says why)
        _c("note", "text", lead=True),
        _c("devices", "text", lead=True),
        _c("device_name", "text", lead=True),
        _c("fallback", "text", lead=True),
        _c("beside", "text", lead=True),
        # The measured figures.
        _c("n", "int", lead=True),
        _c("median_s", "float", "s", "lower", lead=True, per_sample=True),
        _c("mean_s", "float", "s", "lower", lead=True, per_sample=True),
        _c("std_s", "float", "s", lead=True),
        _c("min_s", "float", "s", "lower", lead=True, per_sample=True),
        _c("max_s", "float", "s", lead=True),
        _c("iqr_s", "float", "s", lead=True),
        _c("p50_s", "float", "s", "lower", lead=True, per_sample=True),
        _c("p90_s", "float", "s", "lower", lead=True, per_sample=True),
        _c("p99_s", "float", "s", "lower", lead=True, per_sample=True),
        # CPU seconds of the process's threads per call (median of the samples'), beside the wall
        # time, host work whose threads do not spin (one, or OMP_WAIT_POLICY=passive): judged
        # instead of it where the machine was busy (compare, ab)
        _c("cpu_median_s", "float", "s", "lower"),
        _c("tail_note", "text", lead=True),  # a p90 / p99 of too few samples to be a tail (bench.PERCENTILES)
        _c("noisy", "flag", lead=True),
        _c("warmup_n", "int", lead=True),
        _c("warmup_first_s", "float", "s", lead=True),
        _c("timer", "category", lead=True),
        _c("calls_per_sample", "int", lead=True),
        # bench.profile: what its profiled pass took, after the timed samples (a warm-up call, the
        # calls, the trace written, the operators reduced): its cost beside n x calls x mean_s
        _c("profile_s", "float", "s"),
        _c("num_threads", "int", lead=True),
        _c("items_per_s", "float", "items/s", "higher", rate=True, lead=True),
        _c("tflops", "float", "TFLOP/s", "higher", rate=True, lead=True),
        _c("gbps", "float", "GB/s", "higher", rate=True, lead=True),
        _c("pct_of_peak", "float", "%", "higher", lead=True),
        _c("mfu", "float", "%", "higher", lead=True),
        _c("mfu_note", "text"),  # why a row has no MFU (its datasheet peak a floor it rose above)
        _c("bus_gbps", "float", "GB/s (bus)", "higher", rate=True),
        _c("per_device_items_per_s", "float", "items/s per device", "higher", rate=True),
        # bench.instructions: instructions per call under callgrind, and their spread over its repeats
        _c("instructions", "float", "instructions", "lower", exact=True),
        _c("instructions_spread_pct", "float", "%"),
        _c("seconds", "float", "s"),
        _c("intensity", "float", "FLOP/byte"),
        _c("test_acc", "float", "", "higher"),
        _c("train_acc", "", "", "higher"),
        _c("concurrency", "", "x", "higher"),
        _c("overlap_speedup", "", "x", "higher"),
        _c("speedup_vs_eager", "", "x", "higher"),
        _c("peak_tflops", "", "TFLOP/s", "higher"),
        _c("forward_s", "float", "s", "lower"),  # a training step's phases, seconds per step (perflab.train.optim)
        _c("backward_s", "float", "s", "lower"),
        _c("optimizer_s", "float", "s", "lower"),
        _c("optimizer", "text"),
        _c("load_s", "float", "s", "lower"),  # +experiment=infer / generate: the model built and moved
        _c("kv_cache_mb", "float", "MB", "lower"),  # +experiment=generate: the KV cache after prompt + new - 1 tokens
        # What the instruments read around the samples (perflab.measure.instruments: each names
        # its columns here). Energy: RAPL / NVML over the samples, or why a row has none.
        _c("joules_per_call", "float", "J", "lower"),
        _c("joules_per_item", "float", "J/item", "lower"),
        _c("energy_note", "text"),
        # Memory (MB; each cell read as pandas reads it, as before): the peak RSS, CUDA's per device.
        *(_c(name) for name in ("rss_before_mb", "rss_peak_mb", "cuda_allocated_peak_mb", "cuda_reserved_peak_mb")),
        _c("cuda_peaks_mb"),
        # The machine (instruments.machine): others' CPU share, our threads' wait, PSI (%), load.
        *(_c(name) for name in ("others_cpu_pct", "waited_pct", "cpu_pressure_pct", "load_before", "load_after")),
        _c("cpus"),
        # The GPUs (instruments.gpu, NVML): lowest clocks (MHz), highest temperature (C) and power (W).
        *(_c(name) for name in ("gpu_sm_clock_mhz", "gpu_mem_clock_mhz", "gpu_temp_c", "gpu_power_w")),
        _c("epoch", "int"),
        _c("epochs", "int"),
        _c("phase", "category"),
        _c("timestamp", "time"),
        _c("cuda_available", "flag"),
        _c("input_bound", "flag"),
        # Where and what: the machine, the software, the code under test, the job's place.
        *(
            _c(name, "text")
            for name in (
                *("config_hash", "torch", "cuda", "python", "cpu", "hostname", "git_sha", "perflab_version"),
                *("subject", "subject_time", "cpu_model", "cpu_governor", "cpu_boost", "kernel", "omp_wait_policy"),
                *("mkl", "onednn", "cudnn", "cuda_driver", "gpu_model", "gpu_throttle", "run_dir"),
                *("slurm_job_id", "slurm_array_task_id", "slurm_node", "slurm_nodes", "log", "trace"),
                *("checkpoint", "precision", "run_outcome"),
                "model_digest",  # a model folder's contents (environment.model_contents): part of a point
            )
        ),
    )
}

# Latency percentiles of every timed row (perflab.measure.bench.Stats), by column. The q-th
# percentile of n samples has (1 - q) x n of them beyond it: with fewer than 1 / (1 - q) samples
# (10 for p90, 100 for p99) it is an interpolation between the largest, said in ``tail_note``.
PERCENTILES = {"p50_s": 50, "p90_s": 90, "p99_s": 99}
# A row's spread (IQR / median) of fewer samples says little (of 3: "0.0%" when two agree): from
# this many it is shown (the job's table, the report) and judged (``noisy``); below, unknown ("?").
FEW_FOR_SPREAD = 5
LEADING = tuple(c.name for c in COLUMNS.values() if c.lead)
RATES = frozenset(c.name for c in COLUMNS.values() if c.rate)
# Statistics of a row's seconds whose raw samples are the seconds themselves (compare and ab test
# whether their distribution moved, sample by sample).
PER_SAMPLE = frozenset(c.name for c in COLUMNS.values() if c.per_sample)
# Read back as such whatever a file's cell holds (a damaged cell reads as missing).
TEXT = tuple(c.name for c in COLUMNS.values() if c.kind == "text")
FLOATS = tuple(c.name for c in COLUMNS.values() if c.kind == "float")
INTS = tuple(c.name for c in COLUMNS.values() if c.kind == "int")
FLAGS = tuple(c.name for c in COLUMNS.values() if c.kind == "flag")
CATEGORIES = tuple(c.name for c in COLUMNS.values() if c.kind == "category")
# The raw samples as the index keeps them (samples.csv less what its row already says), by
# column: how each is typed when written, so that no reader guesses (a sample's ``i``, its
# place in its phase, is no results column).
SAMPLES: dict[str, Kind] = {"row_id": "text", "phase": "text", "i": "int", "seconds": "float"}
# A profiled measurement's operators as operators.csv holds them and the index keeps them, by
# column: the row's keys, then a line per operator (perflab.measure.operators says what each is).
OPERATORS: dict[str, Kind] = {
    "row_id": "text",
    "run_id": "text",
    "process": "text",
    "experiment": "text",
    "measurement": "text",
    "median_s": "float",
    "operator": "text",
    "kind": "text",
    "device": "text",
    "calls": "float",
    "self_s": "float",
    "share": "float",
    "profiled_s": "float",
}
# Figures a comparison can judge by default (a user's own rates judge too: *_per_s).
JUDGED = frozenset(c.name for c in COLUMNS.values() if c.better)
# Judged by a tolerance, not by a test between processes (perflab.analysis.verdicts).
EXACT = frozenset(c.name for c in COLUMNS.values() if c.exact)


def higher_is_better(metric: str) -> bool:
    column = COLUMNS.get(metric)
    return column.better == "higher" if column and column.better else metric.endswith("_per_s")


def format_of(column: str) -> Format:
    """How the column's numbers are written ("": a plain number; a user's ``*_per_s``: a count)."""
    found = COLUMNS.get(column)
    return found.format if found else "count" if column.endswith("_per_s") else ""


def unit_of(metric: str, items: str = "items") -> str:
    """The metric's unit ("" where it has none); item rates in the rows' own items (tokens/s)."""
    found = COLUMNS[metric].unit if metric in COLUMNS else ""
    return found.replace("items", items, 1) if found.startswith("items") else found
