"""The method table: name -> `Method` entry (heads/method.py), read by every command.

Training (train/), decoding (decode/), evaluation (evaluate/) and export (heads/formats/) never name a method
and never read this table: each takes the entry it needs, or the table where it chooses by a checkpoint's
method name, as a parameter, and the commands (cli/) pass `methods()`.

The table is filled two ways, both without loading any module of ours by name:
- the built-in methods: `specheads.methods` imports its modules and registers their entries;
- third-party methods: each entry point of the `specheads.methods` group (an installed distribution's
  `entry_points.txt`, `[specheads.methods]` then `name = module:ENTRY`) loads to a `Method`, registered the
  first time the table is read. A user's method package registers without editing this one.
A program may also `register(...)` an entry itself before a command runs.
"""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint, entry_points

from specheads.heads.method import Method

ENTRY_POINT_GROUP = "specheads.methods"

_TABLE: dict[str, Method] = {}
_PLUGINS: list[str] = []  # the names the entry points registered, once they are loaded
_PLUGINS_LOADED = False


class MethodPluginError(ValueError):
    """An installed method plugin (an entry point of the `specheads.methods` group) that cannot be used."""


def register(method: Method, *, replace: bool = False) -> Method:
    """Add `method` to the table (a second entry of one name is an error unless `replace`)."""
    if not isinstance(method, Method):
        raise TypeError(f"register takes a specheads Method entry, got {type(method).__name__}")
    if method.name in _TABLE and not replace:
        raise ValueError(f"method {method.name!r} is already registered")
    _TABLE[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove an entry (tests that register a method of their own)."""
    _TABLE.pop(name, None)


def methods() -> dict[str, Method]:
    """The table: name -> entry, the built-in ones first, then the installed plugins'."""
    load_plugins()
    return dict(_TABLE)


def method_named(name: str, what: str = "method") -> Method:
    """The entry for `name`, or a ValueError naming the known ones."""
    table = methods()
    if name not in table:
        raise ValueError(f"{what} must be one of {tuple(table)}, got {name!r}")
    return table[name]


def _where(point: EntryPoint) -> str:
    dist = point.dist
    who = f"distribution {dist.name} {dist.version}" if dist is not None else "an unknown distribution"
    return f"method plugin {point.name!r} ({point.value}, entry point group {ENTRY_POINT_GROUP!r} of {who})"


def plugin_entries() -> list[tuple[EntryPoint, Method]]:
    """Each installed entry point of the `specheads.methods` group with the `Method` it loads to.

    Raises:
        MethodPluginError: an entry point that fails to import or is not a `Method` (naming it and its
            distribution; uninstalling or fixing that distribution is the fix).
    """
    found = []
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        try:
            entry = point.load()
        except Exception as e:  # noqa: BLE001 - any failure of a third party's module is its error
            raise MethodPluginError(
                f"{_where(point)} failed to load: {type(e).__name__}: {e}; fix or uninstall that distribution"
            ) from e
        if not isinstance(entry, Method):
            raise MethodPluginError(
                f"{_where(point)} loads to a {type(entry).__name__}, not a specheads.heads.method.Method; "
                "point it at the method's entry"
            )
        found.append((point, entry))
    return found


def load_plugins() -> None:
    """Register the installed plugins' methods, once (`methods()` calls it). A plugin of a name already in
    the table is an error naming both."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    loaded = plugin_entries()  # all of them or none: a failing one leaves the table as it was
    names: set[str] = set()
    for point, entry in loaded:
        if entry.name in _TABLE or entry.name in names:
            raise MethodPluginError(
                f"{_where(point)} registers method {entry.name!r}, which is already registered; rename it"
            )
        names.add(entry.name)
    for _, entry in loaded:
        _TABLE[entry.name] = entry
        _PLUGINS.append(entry.name)
    _PLUGINS_LOADED = True


def forget_plugins() -> None:
    """Drop the plugins' entries, so that the next read of the table loads the entry points again (after
    a distribution is installed or removed in a running process)."""
    global _PLUGINS_LOADED
    importlib.invalidate_caches()  # importlib.metadata's view of sys.path too
    for name in _PLUGINS:
        _TABLE.pop(name, None)
    _PLUGINS.clear()
    _PLUGINS_LOADED = False
