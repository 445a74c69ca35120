"""The flags of every command that loads the target (train, cache, distill, eval, compare), defined once: the
target's own code, its chat template and how it is placed on the devices."""

from __future__ import annotations

import argparse


def true_or_false(value: str) -> bool:
    """A flag's true/false value."""
    if value.lower() in ("true", "1", "yes", "on"):
        return True
    if value.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def add_chat_template_arguments(p: argparse.ArgumentParser, what: str = "the prompts") -> None:
    """--chat-template FILE and --enable-thinking true|false: the template `what` is rendered with."""
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help=f"the chat template {what} is rendered with, a .jinja file: for a base model, which has "
        "none, or to replace the target's own",
    )
    p.add_argument(
        "--enable-thinking",
        default=None,
        type=true_or_false,
        metavar="true|false",
        help="a thinking model's switch, passed to its chat template (Qwen3: false renders an empty <think> "
        "block); default: the template's own",
    )


def add_trust_remote_code_argument(p: argparse.ArgumentParser) -> None:
    """--trust-remote-code: the target may run the modelling code its folder or hub repository ships."""
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="load a custom architecture: run the Python code the target's directory or hub repository "
        "ships (transformers' trust_remote_code; read it first, it runs with your permissions)",
    )


def add_device_map_argument(p: argparse.ArgumentParser, without: str = "one device") -> None:
    """--device-map auto: a target sharded over the GPUs (eval, compare, cache); `without`: where the whole
    target goes when the flag is not given."""
    p.add_argument(
        "--device-map",
        default=None,
        choices=["auto"],
        help="auto: spread a target too large for one device over the GPUs (each process's share of them "
        f"when launched as several); default: the whole target on {without}",
    )
