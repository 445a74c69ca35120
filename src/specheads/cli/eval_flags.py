"""The flags `specheads eval` and `specheads compare` share, defined once: both decode prompts with heads
against the target and write a results folder, so the target, the results folder, the prompt selection and
how the target is loaded read the same in both."""

from __future__ import annotations

import argparse

from specheads.core.target import DTYPES


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
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="load a custom architecture: run the Python code the target's directory or hub repository "
        "ships (transformers' trust_remote_code; read it first, it runs with your permissions)",
    )


def add_target_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        required=True,
        help='HF directory or hub id of the target, or a named one ("tiny", "smollm2")',
    )


def add_overwrite_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results --out holds (refused without it): once every input is checked and --out "
        "locked, they are set aside, and go when the new run has kept its first prompt (an error before "
        "that puts them back)",
    )


def add_prompt_filter_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts (default: all)")
    p.add_argument("--category", default=None, help="only questions of this category")


def add_target_loading_arguments(p: argparse.ArgumentParser, defaults: type, attn_help: str) -> None:
    """--dtype, --device, --attn and --trust-remote-code, their defaults those of the options class
    `defaults`; `attn_help` opens --attn's help."""
    p.add_argument("--dtype", default=defaults.dtype, choices=[*sorted(DTYPES), "auto"])
    p.add_argument("--device", default=defaults.device, help="cpu (default) or cuda[:i]")
    p.add_argument(
        "--attn",
        default=defaults.attn,
        choices=["auto", "sdpa", "eager"],
        help=f"{attn_help}; auto: sdpa, or eager where transformers refuses sdpa",
    )
    add_trust_remote_code_argument(p)


def add_device_map_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device-map",
        default=None,
        choices=["auto"],
        help="auto: spread a target too large for one device over the GPUs (each process's share of them "
        "when launched as several); default: the whole target on --device",
    )
