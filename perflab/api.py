"""The Python way in: ``perflab.run("matmul", ["experiment.size=512"])`` runs one job exactly
as ``perflab +experiment=matmul experiment.size=512`` does and returns its rows.

>>> import perflab
>>> df = perflab.run("quick/matmul")
>>> df[["measurement", "median_s", "tflops"]]
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import sys
import threading
from pathlib import Path
from typing import Iterator, Sequence

from perflab.config.composition import compose, experiment_name, output_error
from perflab.errors import ConfigError, Refused
from perflab.job.logs import LogFile

log = logging.getLogger("perflab")


def run(experiment: str, overrides: Sequence[str] | str = (), *, sweep_dir: str | Path | None = None, job_num: int = 0):
    """Run one job and return its rows as a pandas DataFrame.

    ``experiment`` is a preset name (``matmul``, ``quick/train``, ``lenet_scratch`` ...);
    ``overrides`` are the command line's ``key=value`` items: a list of strings, or one string
    split as a shell splits a command line (``"experiment.size=512 bench.repeats=3"``). The
    rows are also on disk, in the run dir (``df.attrs["run_dir"]``), like any run's. Every
    refusal (a bad value, key, preset or config dir, an experiment module that does not import)
    raises :class:`perflab.errors.Refused` with the one-line reason, before anything runs; a
    crash inside the experiment is an ``error`` row, as on the command line
    (``df.attrs["outcome"]`` says what came of it).

    ``sweep_dir``: run the job as point ``job_num`` of that sweep dir (``<sweep_dir>/<job_num>``),
    as a ``-m`` sweep runs its points: a point completed before (same config) is reused, not
    measured again (``outcome`` ``done``), and a point being measured elsewhere is waited for.
    """
    import pandas as pd

    from perflab.job.ending import Place
    from perflab.job.execute import check_overrides, check_values, execute
    from perflab.results import load
    from perflab.store import tree
    from perflab.store.rows import RESULTS

    overrides = as_overrides(overrides)
    cfg, run_dir, choice = compose(experiment, overrides)
    try:  # what the schema refutes, before the run dir (placed by results.store) is made
        check_overrides(overrides)
        check_values(cfg)
    except ConfigError as err:
        raise Refused(err.line()) from None
    point = Path(sweep_dir) if sweep_dir is not None else None
    place = Place(
        run_dir=point / str(job_num) if point else run_dir,
        experiment=experiment_name(choice, cfg),
        overrides=tuple(overrides),
        sweep_dir=point,
        job_num=job_num if point else 0,
    )
    run_dir = place.run_dir
    try:  # a folder that holds a run already (or the store itself) is never written into
        tree.check_run_dir("sweep_dir" if point else "hydra.run.dir", run_dir, Path(str(cfg.results.store)))
    except ConfigError as err:
        raise Refused(err.line()) from None
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise Refused(output_error(err, [f"results.store={cfg.results.store}", *overrides])) from None
    _save_config(cfg, overrides, run_dir)
    with _job_log(run_dir):
        result = execute(cfg, place)
    if result.outcome == "refused":
        raise Refused(result.error)
    found = (run_dir / RESULTS).is_file() or result.outcome == "done"  # a reused point: the rows it stands on
    df = load(run_dir) if found else pd.DataFrame()  # typed as load() types them
    df.attrs.update(outcome=result.outcome, run_dir=str(run_dir))
    return df


def as_overrides(overrides: Sequence[str] | str) -> list[str]:
    """``run()``'s overrides as a list of ``key=value`` strings: one string is split as a shell
    splits a command line; anything else but strings is refused."""
    allowed = "allowed: a list of key=value strings, e.g. ['experiment.size=512', 'bench.repeats=3']"
    if isinstance(overrides, str):
        try:
            return shlex.split(overrides)
        except ValueError as err:  # an unclosed quote
            raise Refused(f"overrides={overrides!r}: cannot be split as a command line ({err}); {allowed}") from None
    try:
        given = list(overrides)
    except TypeError:
        raise Refused(f"overrides={overrides!r} ({type(overrides).__name__}): not a list; {allowed}") from None
    wrong = next((o for o in given if not isinstance(o, str)), None)
    if wrong is not None:
        raise Refused(f"overrides: {wrong!r} ({type(wrong).__name__}) is not a key=value string; {allowed}")
    return given


def _save_config(cfg, overrides: Sequence[str], run_dir: Path) -> None:
    """``.hydra/config.yaml`` and ``overrides.yaml``, as a CLI run leaves them."""
    from omegaconf import OmegaConf

    folder = run_dir / ".hydra"
    folder.mkdir(exist_ok=True)
    OmegaConf.save(cfg, folder / "config.yaml")
    OmegaConf.save(OmegaConf.create(list(overrides)), folder / "overrides.yaml")


@contextlib.contextmanager
def _job_log(run_dir: Path) -> Iterator[None]:
    """The job's messages to ``<run dir>/perflab.log``, and to stdout if nothing else shows them;
    only this thread's (two jobs share a process in ``perflab ab``: perflab.job.together)."""
    handlers: list[logging.Handler] = [LogFile(run_dir / "perflab.log")]
    handlers[0].setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    if not logging.getLogger().handlers:
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(logging.Formatter("%(message)s"))
        handlers.append(console)
    thread = threading.get_ident()
    for h in handlers:
        h.addFilter(lambda record: record.thread == thread)
    level = log.level
    log.setLevel(logging.INFO)
    for h in handlers:
        log.addHandler(h)
    try:
        yield
    finally:
        for h in handlers:
            log.removeHandler(h)
            h.close()
        log.setLevel(level)
