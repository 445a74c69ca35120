"""The method table and the built-in methods, one module each (heads/method.py describes an entry).

This package stands on every floor: an entry names its head class (heads/), its loss and metrics (train/)
and its drafter and calibration (decode/). Importing it registers the built-in entries; installed plugins
(the `specheads.methods` entry-point group) join the first time the table is read (methods/registry.py).
A new built-in method: one module here and one line in `BUILTIN`.
"""

from specheads.heads.method import Method
from specheads.methods.eagle import EAGLE
from specheads.methods.eagle3 import EAGLE3
from specheads.methods.medusa import MEDUSA
from specheads.methods.medusa2 import MEDUSA2
from specheads.methods.registry import (
    ENTRY_POINT_GROUP,
    MethodPluginError,
    forget_plugins,
    load_plugins,
    method_named,
    methods,
    register,
    unregister,
)

BUILTIN = (MEDUSA, MEDUSA2, EAGLE, EAGLE3)

for _entry in BUILTIN:
    register(_entry, replace=True)  # a second import of the package (importlib.reload) keeps one of each

__all__ = [
    "BUILTIN",
    "EAGLE",
    "EAGLE3",
    "ENTRY_POINT_GROUP",
    "MEDUSA",
    "MEDUSA2",
    "Method",
    "MethodPluginError",
    "forget_plugins",
    "load_plugins",
    "method_named",
    "methods",
    "register",
    "unregister",
]
