"""User-facing errors: one line naming the key, the value and what is allowed."""

from __future__ import annotations

import argparse
import difflib
import re
from typing import Any, Iterable, NoReturn, Sequence


class ConfigError(Exception):
    """A bad value in the configuration. Reported as one line, exit code 2."""

    def __init__(self, key: str, value: Any, allowed: str, problem: str = "") -> None:
        self.key, self.value, self.allowed, self.problem = key, value, allowed, problem
        super().__init__(self.line())

    def line(self) -> str:
        """``key=value: [problem;] allowed: ...`` -- what a user needs to fix it."""
        problem = f" {self.problem};" if self.problem else ""
        return f"{self.key}={format_value(self.value)}:{problem} allowed: {self.allowed}"

    def under(self, prefix: str) -> "ConfigError":
        """The same error with its key placed under a config section (``size`` -> ``experiment.size``)."""
        return type(self)(f"{prefix}.{self.key}", self.value, self.allowed, self.problem)


class KeyOnly(ConfigError):
    """A mistake named by its key (or a file) alone, with no value to show: a field with no
    default that nothing set, a preset that cannot be used. ``key: problem; allowed: ...``"""

    def line(self) -> str:
        return f"{self.key}: {self.problem}; allowed: {self.allowed}"


class MissingDevice(ConfigError):
    """The config asks for a device this machine does not have (may become a ``skipped`` row)."""


def format_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def one_line(exc: BaseException) -> str:
    """Turn a Hydra/OmegaConf composition error into a single readable line."""
    if isinstance(exc, ConfigError):
        return exc.line()
    text, cause = str(exc), exc.__cause__
    if hasattr(exc, "problem_mark"):  # yaml's MarkedYAMLError: a preset that is not YAML
        return yaml_line(exc)
    inside = re.match(r"In '([^']+)': \w+ raised while composing config:", text)
    if inside and exc.__context__ is not None:  # Hydra's wrapper of a mistake in a config file
        return f"In '{inside.group(1)}': {one_line(exc.__context__)}"
    missing = re.search(r"Could not find '([^']+)/([^']+)'", text)
    if missing:
        group, name = missing.groups()
        options = [o for o in re.findall(r"^\t(\S+)$", text, flags=re.M) if not o.startswith("_")]
        hint = "; pip install 'perflab[launchers]' adds joblib and submitit_slurm" if group == "hydra/launcher" else ""
        return f"{group}={name}: unknown {group}; allowed: {', '.join(options) or 'see conf/' + group}{hint}"
    shadow = re.search(r"'experiment/([^']+)' is validated against ConfigStore schema with the same name", text)
    if shadow:  # a user's preset named like an experiment that has no preset of its own
        name = shadow.group(1)
        problem, allowed = preset_named_like(name)
        return f"experiment/{name}.yaml: {problem}; allowed: {allowed}"
    override = re.search(r"Could not override '([^']+)'.*?use \+\S+?=(.*)$", text, flags=re.S)
    parent = getattr(cause, "parent_node", None)
    if override and parent is not None and hasattr(parent, "keys"):
        key, value = override.group(1), override.group(2).strip()
        at = parent._get_full_key(None) if hasattr(parent, "_get_full_key") else None
        return unknown_key(key, value, [str(k) for k in parent if k != "hydra"], at).line()
    unparsed = getattr(exc, "override", None)
    if unparsed is not None:  # Hydra's grammar could not read the override at all
        key, _, value = str(unparsed).lstrip("+~").partition("=")
        return (
            f"{unparsed}: cannot be read ({first_line(text)}); allowed: {key}=VALUE in Hydra's override "
            "syntax: lists and dicts closed ([a,b], {k:v}), text with , = [ ] { } ( ) or spaces in quotes"
        )
    source = cause if getattr(cause, "full_key", None) else exc
    key = getattr(source, "full_key", None)
    merging = re.search(r"Error merging override (\S+)", text)
    node: Any = getattr(source, "parent_node", None)
    section = _section_keys(node, key, getattr(source, "key", None))
    if key and merging and section:  # devices=[cuda:3], bench=5, devices=null: a value for a whole section
        given = merging.group(1).lstrip("+")
        value = given.partition("=")[2]
        return (
            f"{given}: {key} is a group of keys, not one value; allowed: {key}.KEY=VALUE with KEY one of "
            f"{', '.join(section)} (e.g. {key}.{section[0]}={value})"
        )
    if key and merging and "is not Optional" in str(source):
        return f"{merging.group(1).lstrip('+')}: {key} cannot be null; allowed: a value of its type"
    if key and merging and "does not support deletion" in str(source):
        try:
            now = node.get(getattr(source, "key", None)) if hasattr(node, "get") else None
        except Exception:
            now = None
        return f"{merging.group(1)}: a key of the schema cannot be removed; allowed: {key}=VALUE" + (
            f" (it is {now} now)" if now is not None else ""
        )
    if key:
        message = first_line(str(source))
        if re.match(r"Key '[^']*' not in ", message) and hasattr(node, "keys"):  # a key the schema lacks
            unknown = unknown_key(key, None, [str(k) for k in node if k != "hydra"])
            return f"{key}: {unknown.problem}; allowed: {unknown.allowed}"
        wrong_type = re.search(
            r"Value '(.*)' (?:of type '\w+' could not be converted to|is not a valid) (\w+)", message
        )
        if wrong_type:
            wanted = TYPE_WORDS.get(wrong_type.group(2), wrong_type.group(2).lower())
            return f"{key}={wrong_type.group(1)}: allowed: {wanted}"
        if "is not a ListConfig, list or tuple" in message:
            value = getattr(source, "value", None)
            return f"{key}{'=' + str(value) if value is not None else ''}: allowed: a list, e.g. {key}=[a,b]"
        return f"{key}: {message}"
    gone = re.search(r"Could not delete from config. '([^']+)' does not exist", text)
    if gone:
        return f"~{gone.group(1)}: no such key here, and a key of the schema cannot be removed; allowed: KEY=VALUE"
    return " ".join(first_line(part) for part in (text, str(cause or "")) if part).strip()


def preset_named_like(name: str, experiment: bool = True) -> tuple[str, str]:
    """What is wrong with a user's preset named like an experiment (whose defaults are its
    Config's: Hydra takes one for the other, or recurses into a preset that lists itself) or
    like one of perflab's presets (found first, so never used), and what to do: (problem, allowed)."""
    leaf = name.rpartition("/")[2]
    problem = (
        f"a preset named like the experiment {name}, whose defaults are its Config's"
        if experiment
        else f"a preset named like perflab's own preset {name}, which +experiment={name} runs in its place"
    )
    return problem, f"a preset of another name ({leaf}_big.yaml, its defaults list starting with - {name})"


def yaml_line(err: Any) -> str:
    """A YAML syntax error as one line: the file, the line yaml stopped at, what it expected."""
    mark = err.problem_mark
    where = f"{mark.name}, line {mark.line + 1}" if mark is not None else "a config file"
    if "<stream end>" in str(err.problem):  # yaml reached the end looking for what closes an earlier line
        where += " (its end: a list or mapping opened before is not closed)"
    said = "; ".join(str(x) for x in (err.problem, err.context) if x)
    return (
        f"{where}: not valid YAML ({said}); allowed: YAML with every list and mapping closed "
        "([1, 2], {a: 1}) and a space after each key's colon"
    )


def _section_keys(node: Any, full_key: str | None, key: Any) -> list[str]:
    """The keys under ``full_key`` when it names a section (DevicesConfig ...), else []: from
    the section itself (a merge into it failed) or from its parent (a value put in its place)."""
    if not full_key or not hasattr(node, "keys"):
        return []
    try:
        inner: Any = node.get(key) if key is not None and hasattr(node, "get") else None
        if hasattr(inner, "keys"):
            return [str(k) for k in inner]
        if key is None and full_key.rpartition(".")[2] not in [str(k) for k in node]:  # node is the section
            return [str(k) for k in node]
    except Exception:  # a value that does not resolve: not a section mistake
        pass
    return []


def did_you_mean(word: object, known: Iterable[str], prefix: str = "", suffix: str = "") -> str:
    """``; did you mean PREFIX<the closest known name>SUFFIX?``, or nothing when none is close
    (difflib's measure): one wording for every name a user can mistype."""
    close = difflib.get_close_matches(str(word), list(known), n=1)
    return f"; did you mean {prefix}{close[0]}{suffix}?" if close else ""


# OmegaConf's type names as a user reads them.
TYPE_WORDS = {"Integer": "an integer", "Float": "a number", "bool": "true or false"}


def unknown_key(key: str, value: Any, known: Sequence[str], at: str | None = None) -> ConfigError:
    """A key no schema has (``bench.repeat``), with a did-you-mean and the keys beside it.
    ``at``: where ``known`` are the keys (``""``: the top level), when that is not the key's own
    section: ``benchh.repeats`` is a mistyped group ``benchh`` (did you mean bench.repeats?)."""
    section, _, name = key.rpartition(".")
    if at is not None and section != at:  # a section on the way is what is unknown
        rest = key[len(at) + 1 :] if at else key
        first, _, tail = rest.partition(".")
        hint = did_you_mean(first, known, prefix=f"{at}." if at else "", suffix=f".{tail}")
        where = at or "the top level"
        return ConfigError(key, value, f"the keys under {where}: {', '.join(known)}", problem=f"unknown key{hint}")
    hint = did_you_mean(name, known, prefix=f"{section}." if section else "")
    where = section or "the top level"
    if not known:  # an empty mapping such as hydra.launcher.additional_parameters: keys are added
        return ConfigError(key, value, f"a new key under {where}, added with a +: +{key}=...", problem="unknown key")
    return ConfigError(key, value, f"the keys under {where}: {', '.join(known)}", problem=f"unknown key{hint}")


def first_line(text: str | BaseException) -> str:
    """The first non-blank line of a message or an exception's text."""
    text = str(text)
    return next((line.strip() for line in text.splitlines() if line.strip()), text.strip())


def paragraph(text: str | BaseException) -> str:
    """A message's first paragraph as one line: a library's sentence wrapped over several lines
    (Hydra's), without what follows a blank line or its ``full_key:`` trailer."""
    lines = []
    for line in str(text).strip().splitlines():
        if not line.strip() or line.strip().startswith("full_key:"):
            break
        lines.append(line.strip())
    return " ".join(lines)


class Refused(ValueError):
    """``perflab.run()`` refused a job for a bad value; ``str()`` is the one-line reason."""


class OneLineParser(argparse.ArgumentParser):
    """argparse for perflab's commands: a mistake is one line and exit code 2, without the
    usage block argparse prints first (``--help`` still shows it). No prefix of a flag stands
    for it (``--pl`` is not ``--plot``): a mistyped flag gets a did-you-mean instead."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        unknown = message.partition("unrecognized arguments: ")[2].split()
        flag = next((a.partition("=")[0] for a in unknown if a.startswith("-")), None)
        hint = did_you_mean(flag, self._option_string_actions) if flag else ""
        self.exit(2, f"{self.prog}: error: {message}{hint} (see --help)\n")
