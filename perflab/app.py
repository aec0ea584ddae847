"""The command line: ``perflab +experiment=NAME [key=value ...]`` (a Hydra app).

A thin wrapper: Hydra composes the config (and, with ``-m``, runs one job per sweep point on
the chosen launcher); each job goes through :func:`perflab.job.execute.execute`, the same path as
``perflab.run()``. A user mistake is one line on stderr and exit code 2. ``perflab`` alone
lists the experiments; neither that, ``--help`` nor a config mistake imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Sequence

from perflab.config import registry
from perflab.config.composition import (
    check_search_path,
    config_dirs,
    experiment_name,
    experiments_allowed,
    output_error,
)
from perflab.config.session import CURRENT, Session
from perflab.errors import ConfigError, did_you_mean
from perflab.job.stop import terminate_as_interrupt

log = logging.getLogger("perflab")


def cli() -> None:
    """The ``perflab`` console script (and ``python -m perflab``)."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # the reader of our output went away (perflab ... | head)
        from perflab.job.logs import quiet_stdout

        quiet_stdout()
        code = 0
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if not args:
            print(registry.listing())
            return 0
        if args[0] in ("--version", "-V") or "--version" in args:  # perflab's, never Hydra's "Hydra 1.3.8"
            print(version_line())
            return 0
        if args[0] in SUBCOMMANDS:
            return int(importlib.import_module(SUBCOMMANDS[args[0]]).main(args[1:]) or 0)
        # experiment=NAME (as lightning-hydra-template users type it) is +experiment=NAME: no default to override
        flags, overrides = flags_apart(["+" + a if a.startswith("experiment=") else a for a in args])
        args = [*flags, *overrides]  # Hydra's parser takes no override after a flag's value
        check_search_path(searchpath(args))  # the user's config dirs, before Hydra reads (or recurses into) them
        mistake = front_door_mistake(args)
        if mistake:
            return usage_error(mistake)
        if "--help" in args or "-h" in args:
            return help_text([a for a in args if a not in ("--help", "-h")])
        chosen_experiments_work(args)  # the chosen one imports and fits the contract, or one line and nothing runs
    except ConfigError as err:  # an experiment that does not register (ExperimentError), a config dir
        return usage_error(err.line())
    multirun = any(a in ("-m", "--multirun") for a in args)
    if not multirun and any(a.lstrip("+").startswith("launcher=") for a in args):
        launcher = next(a for a in args if a.lstrip("+").startswith("launcher="))
        return usage_error(
            f"{launcher}: a launcher runs sweeps; allowed: add -m (perflab -m {launcher} ...), "
            "or leave the launcher out to run here"
        )
    store = next((a.partition("=")[2] for a in args if a.lstrip("+").startswith("results.store=")), None)
    if store is not None and not store.strip():  # Hydra would make ${results.store}/runs: /runs, before our checks
        return usage_error("results.store=: allowed: a directory path (empty would put runs/ at the filesystem's root)")
    from perflab.job import processes

    replicated = processes.conduct(args)  # bench.processes=K: the command in K fresh processes
    if replicated is not None:
        return replicated
    refused = checked_before_hydra(args)  # (a process of K refuses in its own words, as any run)
    if refused is not None:
        return usage_error(refused)
    session = Session()
    token = CURRENT.set(session)
    saved_argv = sys.argv
    sys.argv = ["perflab", *args]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # errors reach us whole, to be made one line here
    logging.captureWarnings(True)  # library warnings go to the job's log file, not the terminal
    terminate = terminate_as_interrupt()
    try:
        import hydra

        from perflab.config.composition import composing_errors, explain, register, users_mistake
        from perflab.job import sweep

        register()
        app = hydra.main(config_path=str(registry.config_dir()), config_name="config", version_base="1.3")(_task)
        try:
            app()
        except composing_errors() as err:
            if not users_mistake(err):
                raise  # ours or a plugin's: a bug, not a user mistake
            sweep.discard_if_empty(session.sweep_dir)  # refused before any point ran
            line = explain(err, searchpath(args))
            return usage_error(_absent_section(args) or _sweep_without_m(err) or _placed_by(line, args))
        except OSError as err:
            if session.running:
                raise  # a job's own: a bug, not a folder Hydra could not make
            line = output_error(err, args)  # Hydra could not make (or write into) the run / sweep dir
            _discard_made(session, args)
            swept = session.sweep_dir
            ran = swept is not None and swept.is_dir() and bool(sweep.job_dirs(swept))
            if swept is not None and ran and session.sweep_exit is None:
                sweep.finish(swept, session.unsaved)  # the points that ran still get their summary
            code = usage_error(line)
            return max(1, session.sweep_exit or 0) if ran else code  # a sweep stopped part-way: 1, as documented
        except sweep.Refused as refused:  # a bad value in some point: nothing ran
            sweep.discard_if_empty(session.sweep_dir)
            return usage_error(str(refused))
        except KeyboardInterrupt:
            print("perflab: interrupted; the rows already measured are saved", file=sys.stderr)
            if session.sweep_dir is not None and session.sweep_exit is None:
                sweep.finish(session.sweep_dir)
            return 130
        return session.exit_code()
    finally:
        sys.argv = saved_argv
        CURRENT.reset(token)
        terminate()


def checked_before_hydra(args: Sequence[str]) -> str | None:
    """A single run's bad value or key, found by composing its config once with Hydra's compose
    API and checking it as the job would (:func:`perflab.job.execute.check`'s order): its line,
    or None. Only a plain ``+experiment=NAME key=value ...`` is checked here (no flag, no sweep,
    no hydra or launcher key); a config that does not compose is left to hydra.main, which
    says why, as is a sweep (its points are checked before any runs: ``job.sweep``)."""
    if any(a.startswith("-") for a in args):
        return None
    chosen = [a.partition("=")[2] for a in args if a.startswith("+experiment=")]
    overrides = [a for a in args if not a.startswith("+experiment=")]
    if len(chosen) != 1 or sweeping(overrides):
        return None
    if any(a.lstrip("+~").startswith(("hydra.", "hydra/", "launcher")) for a in overrides):
        return None
    if any("${hydra:" in a for a in overrides):
        return None  # resolved only inside hydra.main (HydraConfig)
    return checked_by_composing(chosen[0], overrides)


def checked_by_composing(experiment: str, overrides: Sequence[str]) -> str | None:
    """:func:`checked_before_hydra`'s answer from the config Hydra composes (its compose API)."""
    from perflab.config.composition import compose
    from perflab.config.install import check_torch_pair
    from perflab.config.schema import resolve_all
    from perflab.errors import Refused
    from perflab.job.execute import check_overrides, check_values

    try:
        cfg = compose(experiment, overrides)[0]
    except Refused:
        return None  # hydra.main's own path says it, in its words
    try:
        check_overrides(overrides)  # the job's order: this refusal is said over a resolving one
        resolve_all(cfg)
        check_torch_pair()
        check_values(cfg)
    except ConfigError as err:
        return None if "HydraConfig" in str(err) else err.line()  # a preset's ${hydra:...}: Hydra's
    return None


def help_text(args: Sequence[str]) -> int:
    """``--help``: what perflab is, the choices of each group, and every key of the composed
    config with its value. (Hydra's own help lists config groups by composing each of them,
    seconds of work; this is the same content in a fraction of that.)"""
    from omegaconf import OmegaConf

    from perflab.config.composition import compose

    experiment = next((a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("experiment=")), None)
    print(registry.listing() if experiment is None else f"perflab +experiment={experiment}: every key and its value")
    if experiment is None:
        return 0
    groups = {
        g: ", ".join(sorted(p.stem for p in (registry.config_dir() / g).glob("*.yaml")))
        for g in ("model", "data", "strategy", "launcher")
    }
    overrides = [a for a in flags_apart(searchpath(args))[1] if not a.lstrip("+").startswith("experiment=")]
    swept = sweeping(overrides)
    try:
        cfg = compose(experiment, [o for o in overrides if o not in swept])[0]
    except ValueError as err:
        return usage_error(str(err))
    groups = {g: c for g, c in groups.items() if g == "launcher" or cfg.get(g) is not None}  # what it has
    if swept:
        print(f"Swept (with -m, one job per value), shown without: {' '.join(swept)}")
    print("\nGroups (choose with group=NAME): " + "; ".join(f"{g}: {c}" for g, c in groups.items()))
    print("Keys and defaults: perflab/config/schema.py. Hydra's own flags: --hydra-help.\n")
    print(OmegaConf.to_yaml(cfg, resolve=False), end="")
    return 0


def sweeping(overrides: Sequence[str]) -> list[str]:
    """The overrides Hydra would sweep (``a=1,2``, ``a=range(3)``), by its own parser; none when
    they do not parse (composing says why)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # a mistake in an override: the compose that follows is refused in one line
        return []
    return [str(o.input_line) for o in parsed if o.is_sweep_override()]


def searchpath(args: Sequence[str]) -> list[str]:
    """``--config-dir DIR`` (Hydra's flag, which composing a config alone does not take) as the
    override that says the same: ``hydra.searchpath=[file://DIR]``."""
    out, dirs, rest = [], [], iter(args)
    for a in rest:
        if a in ("--config-dir", "-cd"):
            dirs.append(next(rest, ""))
        elif a.startswith("--config-dir="):
            dirs.append(a.partition("=")[2])
        else:
            out.append(a)
    if dirs:
        out.append("hydra.searchpath=[" + ",".join(f"file://{Path(d).resolve()}" for d in dirs) + "]")
    return out


def _task(cfg) -> str:
    """One Hydra job (one point of a sweep)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from perflab.cluster import slurm
    from perflab.job.ending import Place, discard
    from perflab.job.execute import execute

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    if OmegaConf.is_missing(cfg.experiment, "name"):
        discard(out_dir)
        mine = str(registry.config_dir())
        theirs = [Path(s.path) for s in hc.runtime.config_sources if s.schema == "file" and s.path != mine]
        print(registry.listing(theirs))
        return "listed"
    multirun = str(hc.mode) == "RunMode.MULTIRUN"
    place = Place(
        run_dir=out_dir,
        experiment=experiment_name(hc.runtime.choices.get("experiment"), cfg),
        sweep_dir=Path(hc.sweep.dir) if multirun else None,
        job_num=hc.job.num if multirun else 0,
        parallel_jobs=int(hc.launcher.get("n_jobs", 1) or 1) if "joblib" in str(hc.launcher.get("_target_")) else 1,
        overrides=tuple(str(o) for o in OmegaConf.to_container(hc.overrides.task, resolve=False) or ()),  # ${..} kept
        helper=slurm.helper_task(),
    )
    session = CURRENT.get()
    if session is not None and place.sweep_dir is not None:
        session.sweep_dir = place.sweep_dir
    if session is not None:
        session.running = True  # until the job returns: an OSError it lets out is no folder of Hydra's
    result = execute(cfg, place)
    if session is not None:
        session.running = False
    if result.outcome == "refused":
        print(f"perflab: error: {result.error}", file=sys.stderr)
    if session is not None:
        session.outcomes.append(result.outcome)
        session.exit_codes.append(result.exit_code)
    return result.outcome


def _discard_made(session: Session, args: Sequence[str]) -> None:
    """Remove the run or sweep folders this command made that hold nothing of a job (Hydra
    made them, then could not write its config): no empty run is left to mislead."""
    from perflab.job import sweep
    from perflab.job.ending import discard

    overrides = dict(a.lstrip("+").split("=", 1) for a in args if "=" in a)
    store = Path(overrides.get("results.store", "outputs"))
    for uid in session.uids:
        try:
            for run_dir in store.glob(f"runs/*_{uid}"):
                discard(run_dir)
            for sweep_dir in store.glob(f"sweeps/*_{uid}"):
                for job in sweep.job_dirs(sweep_dir):
                    discard(job)
                sweep.discard_if_empty(sweep_dir)
        except OSError:  # a store this machine cannot even look into: nothing was made there
            pass


def _placed_by(line: str, args: Sequence[str]) -> str:
    """A run or sweep folder that does not resolve names the key that placed it there: the
    folders are ``${results.store}/...``, so ``results.store=${oc.env:NOPE}`` fails as hydra.run.dir."""
    folder, sep, why = line.partition(": ")
    store = next((a.partition("=")[2] for a in args if a.lstrip("+").startswith("results.store=")), None)
    if sep and folder in ("hydra.run.dir", "hydra.sweep.dir") and store is not None and "${" in store:
        return f"results.store={store}: {why}; allowed: a value, or a ${{...}} that resolves"
    return line


# ``perflab NAME ...``: the commands beside running a job (each also ``python -m perflab.NAME``).
SUBCOMMANDS = {
    "compare": "perflab.compare",
    "results": "perflab.results",
    "report": "perflab.report",
    "history": "perflab.history",
    "chapter": "perflab.chapter",
    "ab": "perflab.ab",
}
# Hydra's own flags (Hydra 1.3's ``--hydra-help``; hydra.main parses them to run): those that
# take no value, those that take the next word (--info may), the values some allow, and the
# ones of which Hydra runs one.
SWITCHES = (
    *(("--help", "-h"), ("--hydra-help",), ("--version",), ("--resolve",)),
    *(("--run", "-r"), ("--multirun", "-m"), ("--shell-completion", "-sc")),
)
VALUED = (
    *(("--config-path", "-cp"), ("--config-name", "-cn"), ("--config-dir", "-cd"), ("--cfg", "-c")),
    *(("--package", "-p"), ("--info", "-i"), ("--experimental-rerun",)),
)
CHOICES = {
    "--cfg": ("job", "hydra", "all"),
    "--info": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath"),
}
ONE_OF = ("run", "multirun", "cfg", "info", "shell_completion")
FLAGS_WITH_VALUE = tuple(name for names in VALUED for name in names)


def chosen_experiments_work(args: Sequence[str]) -> None:
    """Raise the one line of a chosen experiment (``+experiment=NAME``, or each of a sweep's
    list) that cannot be used; a broken experiment of another package is not this job's concern."""
    for arg in args:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "experiment":
            for name in value.split(","):
                registry.check_chosen(name.strip())


def version_line() -> str:
    """perflab's version and the torch beside it, read from package metadata (no torch import)."""
    from importlib import metadata

    from perflab import __version__

    def of(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"perflab {__version__} (torch {of('torch')}, torchvision {of('torchvision')}, hydra {of('hydra-core')})"


def front_door_mistake(args: Sequence[str]) -> str | None:
    """The line for what people type first and Hydra answers in its own words: a bare word (an
    experiment's name, a command), a mistyped flag, ``+experiments=``, a misspelt preset, a
    second experiment."""
    flag = flag_mistake(args)
    if flag is not None:
        return flag
    for arg in flags_apart(args)[1]:
        if arg.startswith("~") or "=" in arg:  # ~key: Hydra's way to remove a key
            continue
        presets = preset_names()
        if arg in presets:
            return f"{arg}: an experiment is chosen with a key; allowed: perflab +experiment={arg}"
        hint = did_you_mean(arg, [*presets, *SUBCOMMANDS])
        return (
            f"{arg}: not a command or a key=value{hint}; allowed: perflab +experiment=NAME [key=value ...], "
            f"perflab {'|'.join(SUBCOMMANDS)} ..., perflab --help"
        )
    keys = [arg.lstrip("+~").partition("=")[0] for arg in args if "=" in arg and not arg.startswith("-")]
    chosen = [a.lstrip("+").partition("=")[2] for a in args if a.lstrip("+").startswith("experiment=")]
    if len(chosen) > 1:  # Hydra answers in its config-file syntax ("override experiment: ...")
        return (
            f"+experiment={chosen[1]}: a second experiment (+experiment={chosen[0]} is given); allowed: one "
            "+experiment=NAME per command (one command for each experiment)"
        )
    for arg in args:
        key, _, value = arg.lstrip("+~").partition("=")
        dirs = config_dirs(searchpath(args))  # None where the search path holds pkg://: Hydra says it
        if key == "experiment" and not value.strip():
            return f"{arg.lstrip('+')}: no experiment named; allowed: {experiments_allowed()}"
        if key == "experiment" and dirs is not None and value not in preset_names(dirs):
            hint = did_you_mean(value, preset_names(dirs))
            return f"experiment={value}: unknown experiment{hint}; allowed: {experiments_allowed()}"
    if "experiment" not in keys:
        from dataclasses import fields

        from perflab.config.schema import PerflabConfig
        from perflab.errors import unknown_key

        known = [f.name for f in fields(PerflabConfig)]
        for arg in args:
            key = arg.lstrip("+~").partition("=")[0]
            if "=" in arg and not arg.startswith("-") and key.split(".")[0] not in (*known, "hydra", "launcher"):
                return unknown_key(key, arg.partition("=")[2], known, at="").line()
        if any(k.split(".")[0] not in ("hydra", "launcher") for k in keys):
            return "experiment: missing; allowed: +experiment=NAME before the other keys (perflab lists the names)"
    return None


def flag_mistake(args: Sequence[str]) -> str | None:
    """A flag that is neither perflab's nor Hydra's (``--versio``, ``-mm``: argparse would take a
    prefix of a flag, or merge short ones), a flag's bad value (``--cfg nope``) or flags Hydra
    runs one of (``-m --cfg job``): one line, before Hydra's parser prints its usage block."""
    if {a for a in args if a.startswith("-")} <= {"--help", "-h"}:
        return None
    known = [name for names in (*SWITCHES, *VALUED) for name in names]
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.partition("=")[0]
        if name in FLAGS_WITH_VALUE and "=" not in arg:
            skip = True
        if not arg.startswith("-") or name in known or arg == "-":
            continue
        hint = did_you_mean(name, known)
        return f"{arg}: not a flag of perflab{hint}; allowed: {', '.join(MAIN_FLAGS)} (perflab --help)"
    try:
        flags = hydra_flags().parse_known_args(list(args))[0]
    except argparse.ArgumentError as err:
        return f"{err} (see perflab --hydra-help)"
    if sum(bool(getattr(flags, one)) for one in ONE_OF) > 1:
        return "Only one of --run, --multirun, --cfg, --info and --shell_completion can be specified"
    return None


def hydra_flags() -> argparse.ArgumentParser:
    """Hydra's command-line flags (Hydra 1.3's ``--hydra-help``), as a parser that raises on a
    mistake instead of printing its usage and exiting; hydra.main parses them again to run."""
    parser = argparse.ArgumentParser(prog="perflab", add_help=False, allow_abbrev=False, exit_on_error=False)
    for names in SWITCHES:
        parser.add_argument(*names, action="store_true")
    for names in VALUED:
        optional = {"nargs": "?", "const": "all"} if names[0] == "--info" else {}
        parser.add_argument(*names, choices=CHOICES.get(names[0]), **optional)  # type: ignore[arg-type]
    return parser


# The flags people use (every one of Hydra's is taken: perflab --hydra-help lists them).
MAIN_FLAGS = ("-m/--multirun", "--help", "--version", "--cfg job", "--config-dir DIR", "--hydra-help")


def preset_names(config_dirs: Sequence[Path] = ()) -> list[str]:
    """Every ``+experiment=`` choice: perflab's presets and their ``quick/`` variants, every
    declared experiment (a user's runs on its Config's defaults), and the presets of the user's
    own config dirs."""
    quick = sorted(p.stem for p in (registry.config_dir() / "experiment" / "quick").glob("*.yaml"))
    theirs = [name for folder in config_dirs for name in registry.presets(folder)]
    return [*registry.choices(), *(f"quick/{q}" for q in quick), *theirs]


def flags_apart(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Hydra's flags (``-m``, ``--cfg job``, with their values), and the ``key=value`` items."""
    flags, rest, it = [], [], iter(args)
    for arg in it:
        if arg in FLAGS_WITH_VALUE:
            flags += [arg, next(it, "")]
        elif arg.startswith("-"):
            flags.append(arg)
        else:
            rest.append(arg)
    return flags, rest


def _sweep_without_m(err: BaseException) -> str | None:
    """``key=a,b`` without ``-m``: a sweep asked of a single run (Hydra: "Ambiguous value")."""
    found = re.search(r"Ambiguous value for argument '([^']+)'", str(err))
    if not found:
        return None
    return f"{found.group(1)}: several values make a sweep; allowed: add -m (perflab -m ...), or give one value"


def usage_error(line: str) -> int:
    one = line.replace("\r", "\\r").replace("\n", "\\n")  # a value with a newline in it stays on one line
    print(f"perflab: error: {one}", file=sys.stderr)
    return 2


def _absent_section(args: Sequence[str]) -> str | None:
    """See :func:`perflab.config.composition.absent_section`; the experiment and overrides from the command line."""
    from perflab.config.composition import absent_section

    experiment = next((a.partition("=")[2] for a in args if a.lstrip("+").startswith("experiment=")), None)
    if experiment is None:
        return None
    overrides = [a for a in args if "=" in a and not a.lstrip("+").startswith(("experiment=", "hydra"))]
    return absent_section(experiment, overrides)
