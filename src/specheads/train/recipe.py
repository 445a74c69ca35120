"""Reading a recipe into a checked `TrainConfig` (train/config.py): a YAML file, command-line overrides
and a checkpoint's training record.

Command-line overrides are `key=value`, and `eagle3.draft_vocab_size=4096` for a section's key. Method keys
at the top level (`draft_vocab_size: 8192`, as recipes and checkpoints written before the sections have
them) still load, with a message naming their new place. Unknown keys, a key in another method's section,
duplicate keys and empty recipe files are errors naming the file, the key and the fix, so a typo never
trains silently with a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
import warnings
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from specheads.heads.method import Method
from specheads.train.config import (
    RecipeKeyMoved,
    TrainConfig,
    common_fields,
    former_name,
    key_default,
    settings_class,
)


def _coerce(label: str, value: Any, hint: Any) -> Any:
    """Convert a YAML or command-line value to the key's type, or raise naming the key (`label`)."""
    origin = typing.get_origin(hint)
    if origin in (list, typing.List):  # noqa: UP006
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ValueError(f"recipe key {label!r} takes a list, got {value!r}")
        item = (typing.get_args(hint) or (str,))[0]
        try:
            return [item(v) for v in value]
        except (TypeError, ValueError):
            raise ValueError(f"recipe key {label!r} takes a list of {item.__name__}, got {value!r}") from None
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none")):
            if type(None) in typing.get_args(hint):  # a key whose default is "unset" (enable_thinking)
                return None
        if type(value) in kinds:  # already one of them (max_bad_rows: an int count or a float fraction)
            return value
        hint = kinds[0]
    if hint is bool:
        if isinstance(value, str):
            if value.lower() in ("true", "1", "yes", "on"):
                return True
            if value.lower() in ("false", "0", "no", "off"):
                return False
        if isinstance(value, bool):
            return value
        raise ValueError(f"recipe key {label!r} takes true/false, got {value!r}")
    try:
        if hint is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return hint(value)
    except (TypeError, ValueError):
        raise ValueError(f"recipe key {label!r} takes {hint.__name__}, got {value!r}") from None


def _settings_from(method: str, section: dict[str, Any], table: Mapping[str, Method]):
    """`method`'s section dataclass from its keys' values as written (typed here; unknown keys refused)."""
    cls = settings_class(table[method])
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    unknown = [k for k in section if k not in names]
    if unknown:
        raise ValueError(
            f"unknown recipe key {method}.{unknown[0]} (method {method!r} reads {sorted(names)})"
        )
    return cls(**{k: _coerce(f"{method}.{k}", v, hints[k]) for k, v in section.items()})


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """["lr=3e-4", "data=a.jsonl,b.jsonl"] -> {"lr": "3e-4", ...} (typed later, per key)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not key=value")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError as e:
            raise ValueError(f"override {item!r}: the value is not valid YAML ({_first_line(e)})") from None
    return out


def find_recipe(recipe: str | Path) -> Path:
    """A recipe path as given, or else one of the shipped recipes (`recipes/tiny/...`): inside an
    installed wheel (specheads/recipes) or in the source checkout of an editable install."""
    path = Path(recipe)
    if path.is_file():
        return path
    package = Path(__file__).resolve().parents[1]  # src/specheads (the wheel: site-packages/specheads)
    for root in (package, package.parents[1]):
        if not path.is_absolute() and (root / path).is_file():
            return root / path
    raise FileNotFoundError(
        f"recipe {recipe} not found (a file path, or a shipped one like recipes/tiny/medusa.yaml)"
    )


def _first_line(e: yaml.YAMLError) -> str:
    """A YAML error in one line: its problem and where (`line 3, column 5`)."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(e, 'problem', None) or str(e).splitlines()[0]}{where}"


class _RecipeLoader(yaml.SafeLoader):
    """yaml's SafeLoader that refuses a key written twice in one mapping, at any level (yaml's own keeps
    the last silently)."""


class _KeySetTwice(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first: int):
        super().__init__(f"key {key!r} is set twice")
        self.key, self.line, self.first = key, line, first


def _unique_keys_mapping(loader: _RecipeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, typing.Hashable) and key in seen:
            raise _KeySetTwice(key, key_node.start_mark.line + 1, seen[key])
        seen[key] = key_node.start_mark.line + 1
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_RecipeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_keys_mapping)


def read_recipe(path: Path) -> dict[str, Any]:
    """A recipe file's mapping, as written: not valid YAML, a key set twice, no keys at all (an empty file,
    or comments only) or not a mapping are errors naming the file and the line."""
    text = Path(path).read_text()
    try:
        loaded = yaml.load(text, Loader=_RecipeLoader)  # noqa: S506 (a SafeLoader)
    except _KeySetTwice as e:
        raise ValueError(
            f"recipe {path} at line {e.line}: key {e.key!r} is set twice (first at line {e.first}); keep one"
        ) from None
    except yaml.YAMLError as e:
        raise ValueError(f"recipe {path} is not valid YAML: {_first_line(e)}") from None
    if loaded is None:
        raise ValueError(
            f"recipe {path} at line 1: the file sets no keys (it is empty, or comments only); "
            "a recipe names at least its method, e.g. `method: medusa`"
        )
    if not isinstance(loaded, dict):
        raise ValueError(f"recipe {path} must be a mapping of keys to values")
    return loaded


def _section_fields(method: Method) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in fields(settings_class(method))}


def _flat_owners(name: str, table: Mapping[str, Method]) -> list[tuple[str, str]]:
    """(method, key in its section) of every method whose section holds top-level key `name` of old."""
    return [
        (m, f.name) for m, e in table.items() for f in _section_fields(e).values() if former_name(f) == name
    ]


def _place(method: str, key: str, where: str) -> str:
    """Where a method's key goes, written as `where` takes it (a recipe file, or the command line)."""
    return f"{method}.{key}=..." if where == "on the command line" else f"{method}: {{{key}: ...}}"


def _misplaced(owner: str, key: str, where: str, table: Mapping[str, Method]) -> str:
    """The error for `key` in method `owner`'s section, which does not read it, naming its right place."""
    own = _section_fields(table[owner])
    renamed = [f.name for f in own.values() if former_name(f) == key]
    others = [(m, f) for m, f in _flat_owners(key, table) if m != owner]
    others += [(m, key) for m, e in table.items() if m != owner and key in _section_fields(e)]
    if key in {f.name for f in common_fields()}:
        fix = f"every method reads {key!r}: set it at the top level ({key}: ...)"
    elif renamed:
        fix = f"use {_place(owner, renamed[0], where)}"
    elif others:
        methods_of = ", ".join(dict.fromkeys(m for m, _ in others))
        fix = f"{key!r} is read by method {methods_of}: use {_place(*others[0], where)}"
    elif close := difflib.get_close_matches(key, own, n=1):
        fix = f"did you mean {owner}.{close[0]}?"
    else:
        fix = f"method {owner!r} reads {', '.join(own) or 'no keys of its own'}"
    return f"unknown recipe key {owner}.{key} {where}: {fix}"


def _unknown(names: list[str], method: str, where: str, table: Mapping[str, Method]) -> str:
    """The error for top-level keys no method reads, with the nearest known key each."""
    known = {f.name: f.name for f in common_fields()}
    known |= {f"{m}.{k}": f"{m}.{k}" for m, e in table.items() for k in _section_fields(e)}
    known |= {k: f"{method}.{k}" for k in _section_fields(table[method])}
    hints = []
    for name in names:
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r} (did you mean {known[close[0]]!r}?)" if close else repr(name))
    return f"unknown recipe key{'s' if len(names) > 1 else ''} {where}: {', '.join(hints)}"


def _sectioned(
    layers: list[tuple[str, dict[str, Any]]], table: Mapping[str, Method], record: bool = False
) -> dict[str, Any]:
    """The keys `layers` ((where, mapping), later ones overriding) set, as {common key: value, ...,
    method: {its key: value}}: the method first, then each key to its place. A top-level method key (the
    form before sections) moves into the method's section with a RecipeKeyMoved message; one that only
    other methods read, or another method's section, is ignored with a message; unknown keys are errors.
    `table`: the method table (`specheads.methods.methods()`). `record`: a checkpoint's record, read quietly
    (its notes and other methods' keys ignored)."""
    method = TrainConfig.method
    for _, values in layers:
        method = values.get("method", method)
    if not isinstance(method, str) or method not in table:
        raise ValueError(f"bad recipe value: method must be one of {tuple(table)}, got {method!r}")
    common = {f.name for f in common_fields()}
    out: dict[str, Any] = {}
    section: dict[str, Any] = {}
    for where, values in layers:
        sectioned = isinstance(values.get(method), dict)  # a record's flat keys beside it are its notes
        unknown, ignored = [], []
        for name, value in values.items():
            name = str(name)
            owner, dot, key = name.partition(".")
            if name in common:
                out[name] = value
            elif name in table or (dot and owner in table):
                if not dot and value is not None and not isinstance(value, dict):
                    raise ValueError(
                        f"recipe key {name!r} {where} is method {name}'s section: it takes a mapping of "
                        f"that method's keys, e.g. {name}: {{key: value}}"
                    )
                items = {key: value} if dot else (value or {})
                for k, v in items.items():
                    if str(k) not in _section_fields(table[owner]):
                        if record:
                            continue
                        raise ValueError(_misplaced(owner, str(k), where, table))
                    if owner == method:
                        section[str(k)] = v
                    elif owner not in ignored:
                        ignored.append(owner)
            elif moved := _flat_owners(name, table):
                if record and sectioned:
                    continue
                mine = [k for m, k in moved if m == method]
                if mine:
                    section[mine[0]] = value
                    if not record:
                        warnings.warn(
                            RecipeKeyMoved(
                                f"recipe key {name!r} {where} is method {method}'s: use "
                                f"{_place(method, mine[0], where)} (method keys at the top level are deprecated)"
                            ),
                            stacklevel=4,
                        )
                elif not record:
                    first, key = moved[0]
                    f = _section_fields(table[first])[key]
                    hint = typing.get_type_hints(settings_class(table[first]))[key]
                    if _coerce(name, value, hint) != key_default(f):
                        owners = ", ".join(dict.fromkeys(m for m, _ in moved))
                        warnings.warn(
                            f"recipe key {name!r} {where} is read by method {owners} only; method {method!r} "
                            f"ignores it (its place: {_place(first, key, where)})",
                            stacklevel=4,
                        )
            elif not record:
                unknown.append(name)
        if unknown:
            raise ValueError(_unknown(unknown, method, where, table))
        for owner in ignored:
            warnings.warn(
                f"recipe section {owner!r} {where} is read by method {owner} only; method {method!r} ignores it",
                stacklevel=4,
            )
    if section:
        out[method] = section
    return out


def recipe_values(
    recipe: str | Path | None, overrides: list[str] | dict[str, Any] = (), *, methods: Mapping[str, Method]
) -> dict[str, Any]:
    """The keys a recipe and its overrides set, as written, in sections: {common key: value, ...,
    method: {its key: value}} (unknown keys rejected; not yet typed or checked): what a caller reads to
    adjust a recipe that this machine would refuse (the quickstart's AdamW fallback). `methods`: the method
    table (`specheads.methods.methods()`), which names each method's section."""
    layers = []
    if recipe is not None:
        layers.append((f"in {recipe}", read_recipe(find_recipe(recipe))))
    overrides = parse_overrides(list(overrides)) if not isinstance(overrides, dict) else dict(overrides)
    layers.append(("on the command line", overrides))
    return _sectioned(layers, methods)


def _config_from(values: dict[str, Any], table: Mapping[str, Method]) -> TrainConfig:
    hints = typing.get_type_hints(TrainConfig)
    method = values.get("method", TrainConfig.method)
    typed = {
        f.name: _coerce(f.name, values[f.name], hints[f.name]) for f in common_fields() if f.name in values
    }
    cfg = TrainConfig(**typed, settings=dict(values.get(method, {})))
    check_method(cfg, table)
    return cfg


def check_method(cfg: TrainConfig, methods: Mapping[str, Method]) -> None:
    """What `cfg` needs the method table for (`methods`, as `specheads.methods.methods()` gives it): its
    method is one of them; its section (`cfg.settings`: None for the defaults, a mapping of the section's
    keys, or the method's settings object) becomes the method's settings object; and the method takes the
    recipe's optimizer and mode, and its own checks pass."""
    if cfg.method not in methods:
        raise ValueError(f"bad recipe value: method must be one of {tuple(methods)}, got {cfg.method!r}")
    method = methods[cfg.method]
    cls = settings_class(method)
    if cfg.settings is None:
        cfg.settings = cls()
    elif isinstance(cfg.settings, dict):
        cfg.settings = _settings_from(cfg.method, cfg.settings, methods)
    elif type(cfg.settings) is not cls:
        raise ValueError(
            f"bad recipe value: method {cfg.method!r} reads its keys from a {cls.__name__}, "
            f"got {type(cfg.settings).__name__}"
        )
    checks = [
        (
            cfg.optimizer == "adamw" or method.objective is None,
            f"method {cfg.method!r} builds its own optimizer (AdamW over the heads and its adapters): "
            f"optimizer {cfg.optimizer!r} is not available for it, use 'adamw'",
        ),
        (
            not method.online_only or cfg.mode == "online",
            f"method {cfg.method!r} {method.online_only}, so it cannot read them from a cache: use mode 'online'",
        ),
        *method.check_recipe(cfg),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(f"bad recipe value: {message}")


def load_config(
    recipe: str | Path | None, overrides: list[str] | dict[str, Any] = (), *, methods: Mapping[str, Method]
) -> TrainConfig:
    """Read a YAML recipe (or none: defaults), apply overrides (`key=value`, `method.key=value`), type and
    check every value against the method table `methods` (`specheads.methods.methods()`)."""
    return _config_from(recipe_values(recipe, overrides, methods=methods), methods)


def config_from_record(record: dict[str, Any], *, methods: Mapping[str, Method]) -> TrainConfig:
    """The recipe a training record holds (a checkpoint's state, or the heads' config.json "training"),
    in sections or in the flat form written before them, read quietly: the record's notes (the resolved
    target, the step, the last evaluation, ...) and keys no method reads are left aside."""
    return _config_from(_sectioned([("in the training record", dict(record))], methods, record=True), methods)
