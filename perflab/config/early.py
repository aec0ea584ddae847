"""A command line's config mistake (a bad value, an unknown key), found without Hydra.

Importing Hydra and composing with it take most of a refusal's half second; the mistake is in
the overrides the user typed. So the front door builds the config Hydra would compose as plain
data (the preset's YAML, then the overrides, typed as OmegaConf types them) and checks it with
the one :func:`perflab.config.schema.validate`, in the job's order. It answers only where it
is sure Hydra would compose exactly that: ``+experiment=NAME`` from perflab's own presets (or a
declared experiment on its Config's defaults) whose defaults list names only the experiment's
schema or another such preset, and overrides ``section.key=value`` of a plain scalar under
experiment, devices, bench, results or ``seed``. Anything else (a sweep, ``${...}``, a
list, a model or data section, a key Hydra itself refuses) is None: Hydra composes as before.
``perflab +experiment=NAME --help`` prints the same plain config (:func:`composed`).
"""

from __future__ import annotations

import re
import typing
from dataclasses import MISSING as MISSING_FIELD
from dataclasses import fields, is_dataclass
from typing import Any, Sequence

from perflab.config import registry
from perflab.config.install import check_torch_pair
from perflab.config.schema import MISSING, OPTIONAL_SECTIONS, SECTIONS, PerflabConfig, default_of, validate
from perflab.errors import ConfigError
from perflab.store import files

# Hydra's override grammar, the part read here: an int, a float, true/false, null, an unquoted
# word or path. Anything else (quotes, lists, sweeps, 1e3, inf, 1_000, ${...}) is Hydra's to parse.
INT = re.compile(r"-?(0|[1-9][0-9]*)")
FLOAT = re.compile(r"-?(0|[1-9][0-9]*)\.[0-9]+")
WORD = re.compile(r"[A-Za-z_/][A-Za-z0-9_/.-]*")
KEY = re.compile(r"(\+?)([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?")
RESERVED = ("true", "false", "null", "inf", "nan")  # Hydra reads these in any case
SCHEMA = "/schema/experiment@experiment"
SHARED = tuple(n for n in SECTIONS if n not in OPTIONAL_SECTIONS)  # every experiment's, typed alike
UNSURE = object()


def refusal(experiment: str, overrides: Sequence[str]) -> str | None:
    """The one line the job would refuse ``+experiment=NAME overrides`` with, or None where
    there is none, or where only composing with Hydra can tell."""
    found = composed(experiment, overrides)
    if found is None:
        return None
    data, config = found
    try:
        check_torch_pair()  # the job's order (perflab.job.execute.check)
        validate(data, config)
    except ConfigError as err:
        return err.line()
    return None


def composed(experiment: str, overrides: Sequence[str]) -> tuple[dict[str, Any], type] | None:
    """The config Hydra composes for ``+experiment=NAME overrides``, as plain data (every key,
    in the schema's order, unresolved), and the experiment's Config; None where unsure."""
    found = preset(experiment)
    if found is None:
        return None
    name, data = found
    try:
        config = registry.get(name).hooks.Config
    except ConfigError:
        return None
    if not is_dataclass(config) or any(not f.init for f in fields(config)) or not _typed_all(data, config):
        return None  # a field OmegaConf sets after __init__ (init=False): composing tells
    for override in overrides:
        if not _apply(data, config, override):
            return None
    full: dict[str, Any] = {}
    for f in fields(PerflabConfig):
        schema = _schema(f.name, config)
        if schema is None:
            full[f.name] = data.pop(f.name, f.default)
            continue
        values = data.pop(f.name, {})
        full[f.name] = {g.name: values.pop(g.name, _or_missing(default_of(g))) for g in fields(schema)} | values
        if any(is_dataclass(v) or isinstance(v, dict) for v in full[f.name].values()):
            return None  # a nested config: OmegaConf's to compose
    if any("${" in str(v) for v in full["experiment"].values()):
        return None  # an experiment's default that interpolates: its checks see it resolved
    return full | data, config  # and the top-level keys added with +


def _or_missing(default: Any) -> Any:
    return MISSING if default is MISSING_FIELD else default


def preset(name: str) -> tuple[str, dict[str, Any]] | None:
    """(the experiment's name, the values its preset sets) as Hydra composes them, for a
    preset of perflab's own that names only its schema (or such a preset) and plain values."""
    path = registry.config_dir() / "experiment" / f"{name}.yaml"
    if not path.is_file():
        return (name, {"experiment": {"name": name}}) if name in registry.declared() else None
    import yaml

    try:
        text = files.read_text(path)
        data = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):
        return None
    if not text.startswith("# @package _global_") or not isinstance(data, dict):
        return None
    defaults = data.pop("defaults", None)
    if not isinstance(defaults, list) or len(defaults) != 2 or defaults[1] != "_self_":
        return None
    first = defaults[0]
    if isinstance(first, dict) and list(first) == [SCHEMA] and isinstance(first[SCHEMA], str):
        base: tuple[str, dict[str, Any]] | None = (first[SCHEMA], {"experiment": {"name": first[SCHEMA]}})
    elif isinstance(first, str) and first.startswith("/experiment/"):
        base = preset(first.removeprefix("/experiment/"))
    else:
        return None
    if base is None or not all(isinstance(v, dict) or k == "seed" for k, v in data.items()):
        return None
    experiment, merged = base
    for section, values in data.items():
        if isinstance(values, dict):
            merged[section] = {**merged.get(section, {}), **values}
        else:
            merged[section] = values
    if merged.get("experiment", {}).get("name") != experiment:
        return None
    return experiment, merged


def _typed_all(data: dict[str, Any], config: type) -> bool:
    """Give the preset's values the types OmegaConf gives them; False where unsure."""
    for section, values in data.items():
        schema = _schema(section, config)
        if section == "seed" and not isinstance(values, bool) and isinstance(values, int):
            continue
        if schema is None or not isinstance(values, dict):
            return False
        for key, value in values.items():
            typed = _typed(schema, key, value)
            if typed is UNSURE:
                return False
            values[key] = typed
    return True


def _apply(data: dict[str, Any], config: type, override: str) -> bool:
    """Set ``override`` in ``data`` as Hydra would; False where unsure (Hydra then says it)."""
    text, _, raw = override.partition("=")
    key = KEY.fullmatch(text)
    value = _value(raw)
    if key is None or value is UNSURE:
        return False
    plus, section, name = key.groups()
    if name is None:  # a top-level key: seed, or an unknown one added with +
        if section in (f.name for f in fields(PerflabConfig)):
            typed = _typed(PerflabConfig, section, value) if section == "seed" and not plus else UNSURE
            if typed is UNSURE:
                return False
            data[section] = typed
            return True
        if not plus or section in data:
            return False
        data[section] = value
        return True
    schema = _schema(section, config)
    if schema is None:
        return False
    known = {f.name for f in fields(schema)} | set(data.get(section, {}))  # and those added with +
    if section == "experiment" and name == "name":
        return False  # perflab.job.execute.check_overrides says it
    if (name in known) == bool(plus):  # + to a key that is there, or none to one that is not: Hydra's words
        return False
    typed = value if plus else _typed(schema, name, value)
    if typed is UNSURE:
        return False
    data.setdefault(section, {})[name] = typed
    return True


def _schema(section: str, config: type) -> Any:
    return config if section == "experiment" else SECTIONS[section] if section in SHARED else None


def _value(raw: str) -> Any:
    """An override's value as Hydra parses it, or UNSURE."""
    if INT.fullmatch(raw):
        return int(raw)
    if FLOAT.fullmatch(raw):
        return float(raw)
    if raw in ("true", "false"):
        return raw == "true"
    if raw == "null":
        return None
    if WORD.fullmatch(raw) and raw.lower() not in RESERVED:
        return raw
    return UNSURE


def _typed(schema: Any, name: str, value: Any) -> Any:
    """``value`` as OmegaConf stores it in field ``name`` (an int in a float field: a float),
    or UNSURE where OmegaConf would convert it some other way, or refuse it in its own words."""
    try:
        hint = typing.get_type_hints(schema).get(name)
    except Exception:  # a hint that does not resolve: composing says what it makes of it
        return UNSURE
    return _as(hint, value)


def _as(hint: Any, value: Any) -> Any:
    if isinstance(value, str) and value == MISSING:
        return UNSURE
    if hint is Any:
        return value
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union and type(None) in args and len(args) == 2:
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    if typing.get_origin(hint) is list and len(typing.get_args(hint)) == 1 and isinstance(value, list):
        items = [_as(typing.get_args(hint)[0], v) for v in value]  # a preset's list, typed item by item
        return UNSURE if any(i is UNSURE for i in items) else items
    if hint is bool:
        return value if isinstance(value, bool) else UNSURE
    if isinstance(value, bool):
        return UNSURE
    if hint is int and isinstance(value, int):
        return value
    if hint is float and isinstance(value, (int, float)):
        return float(value)
    if hint is str and isinstance(value, str):
        return value
    return UNSURE
