"""docs/recipes.md, written from the recipe's dataclasses: every key, its default and its meaning.

    python -m specheads.methods.recipe_docs > docs/recipes.md

The common keys come from TrainConfig, each method's from its settings class (`Method.settings_class`), and
each key's meaning from its `help` (train/config.recipe_key); a test checks the committed page against this.
"""

from __future__ import annotations

import dataclasses
import json

from specheads.methods.registry import methods
from specheads.train.config import common_fields, former_name, key_default, settings_class

COMMAND = "python -m specheads.methods.recipe_docs > docs/recipes.md"

INTRO = f"""# Recipe keys

<!-- Written by `{COMMAND}` from the recipe's dataclasses
(src/specheads/train/config.py, and each method's module under src/specheads/methods/): edit those. -->

A recipe is a YAML file: the keys every method reads at the top level, and the method's own keys in a
section named after it.

```yaml
method: eagle3
target: meta-llama/Llama-3.1-8B-Instruct
lr: 1.0e-4
eagle3:
  layers: [2, 16, 29]
  draft_vocab_size: 32000
```

Any key can be overridden after the recipe on the command line, `key=value` for a common key and
`method.key=value` for one of the method's (`specheads train recipes/tiny/eagle3.yaml max_steps=50
eagle3.ttt_steps=3`); a list takes `a,b,c` or `[a, b, c]`. An unknown key, a key in another method's
section, a key set twice and an empty file are errors that name the file and the key. Recipes written
before the sections set the method's keys at the top level (`draft_vocab_size: 32000`): they still load,
with a message naming each key's place; the table gives a key's former name where it differs.
The shipped recipes are under recipes/ (`recipes/<target>/<method>.yaml`).
"""


def _value(value) -> str:
    """A default as a recipe writes it."""
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        return f"`[{', '.join(str(v) for v in value)}]`"
    return f"`{json.dumps(value)}`"


def _rows(fields: list[dataclasses.Field], renamed: bool = False) -> list[str]:
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]
    for f in fields:
        meaning = f.metadata.get("help", "").replace("|", "\\|")
        if renamed and former_name(f) != f.name:
            meaning += f" (formerly `{former_name(f)}`)"
        rows.append(f"| `{f.name}` | {_value(key_default(f))} | {meaning} |")
    return rows


def markdown() -> str:
    """The whole page."""
    lines = [INTRO, "## Common keys", "", "Read by every method.", "", *_rows(common_fields())]
    for name, method in methods().items():
        cls = settings_class(method)
        if not dataclasses.fields(cls):
            continue  # a method that reads no keys of its own
        about = " ".join((cls.__doc__ or "").split())
        lines += ["", f"## `{name}:`", "", about, "", *_rows(list(dataclasses.fields(cls)), renamed=True)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
