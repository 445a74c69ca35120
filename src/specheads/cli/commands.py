"""The command-line entry points: one module a `specheads` subcommand, each an `add_arguments(parser)` and a
`run(args) -> exit code` over the library functions it calls. Nothing below this package parses argv.

cli/__init__.py builds the console script from `COMMANDS`; `python -m specheads.train` (the form `accelerate
launch -m` uses) runs the `train` command. Every command that loads or trains a model takes `--threads N`
(cli/threads.py; `main` sets torch's threads around its `run`).
"""

import argparse
import dataclasses
import importlib
from types import ModuleType
from typing import Any, TypeVar

Options = TypeVar("Options")

# (name, help, module of this package with add_arguments and run), in the order a user meets them. The
# modules are imported by `load`, only for the command that runs: `specheads --help` imports none, and a
# command imports its own (torch, datasets, transformers...) and not every other's.
COMMANDS = [
    ("tiny-target", "build the embedded default target offline", "tiny_target"),
    ("tiny-draft", "build a small assistant model in the target's tokens", "tiny_draft"),
    ("seed-prompts", "chat prompts to train on, disjoint from MT-Bench and Spec-Bench", "seed_prompts"),
    ("distill", "self-distillation: the target regenerates a dataset's answers", "distill"),
    ("cache", "precompute the target's hidden states for offline training", "cache"),
    ("train", "train draft heads from a YAML recipe", "train"),
    ("eval", "speculative decoding against the target's own generate()", "eval"),
    ("compare", "heads beside generate(), prompt lookup and assisted generation", "compare"),
    ("export", "write native heads in a serving-engine layout", "export"),
    ("import-heads", "read an official engine checkpoint into a native one", "import_heads"),
    ("quickstart", "the embedded default end to end", "quickstart"),
]


def load(name: str) -> ModuleType:
    """The module of command `name` (its add_arguments and run)."""
    module = next((m for n, _, m in COMMANDS if n == name), None)
    if module is None:
        raise LookupError(f"no command {name!r}; the commands are {', '.join(n for n, _, _ in COMMANDS)}")
    return importlib.import_module(f"specheads.cli.{module}")


def options_from(cls: type[Options], args: argparse.Namespace, **given: Any) -> Options:
    """The typed options `cls` (a dataclass of the library, one field a flag) from parsed arguments: the
    one place a command's Namespace becomes what the library takes. `given`: the fields no flag holds as
    it is (a value the command derives from its flags)."""
    return cls(
        **{
            f.name: given[f.name] if f.name in given else getattr(args, f.name)
            for f in dataclasses.fields(cls)
        }
    )
