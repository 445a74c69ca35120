"""The built-in methods, one module each: the entries of the method table (heads/methods.py).

This package stands on every floor: an entry names its head class (heads/), its loss and metrics
(train/) and its drafter and calibration (decode/). Nothing below imports it by name; the table loads
`BUILTIN` the first time it is read. A new method: one module here and one line below.
"""

from specheads.methods.eagle import EAGLE
from specheads.methods.eagle3 import EAGLE3
from specheads.methods.medusa import MEDUSA
from specheads.methods.medusa2 import MEDUSA2

BUILTIN = (MEDUSA, MEDUSA2, EAGLE, EAGLE3)

__all__ = ["BUILTIN", "EAGLE", "EAGLE3", "MEDUSA", "MEDUSA2"]
