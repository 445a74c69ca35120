"""The `specheads` console script: one subcommand per workflow.

Each subcommand lives with the code it runs and is also runnable on its own with `python -m`.

From the command line an error ends the command with one line, `specheads COMMAND: error: ...` naming the
file or key at fault, and exit code 1; `--debug` (before or after the command) shows the traceback instead.
Called from Python with an argument list, `main(argv)` raises the error for its caller to handle.
"""

from __future__ import annotations

import argparse
import sys

from specheads.version import __version__


def main(argv: list[str] | None = None) -> int:
    from specheads import quickstart
    from specheads.evaluate import compare, evaluate
    from specheads.heads.formats import cli as formats_cli
    from specheads.train import cache_cli, loop
    from specheads.train.builders import tiny_draft, tiny_target
    from specheads.train.data import distillation as distill

    parser = argparse.ArgumentParser(
        prog="specheads", description="Train and prove speculative-decoding draft heads."
    )
    parser.add_argument("--version", action="version", version=f"specheads {__version__}")
    debug_help = "on an error, show the traceback instead of one line"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    debug_flag = argparse.ArgumentParser(add_help=False)  # also accepted after the command
    debug_flag.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # (name, help, module with add_arguments and run), in the order a user meets them
    commands = [
        ("tiny-target", "build the embedded default target offline", tiny_target),
        ("tiny-draft", "build a small assistant model in the target's tokens", tiny_draft),
        ("distill", "self-distillation: the target regenerates a dataset's answers", distill),
        ("cache", "precompute the target's hidden states for offline training", cache_cli),
        ("train", "train draft heads from a YAML recipe", loop),
        ("eval", "speculative decoding against the target's own generate()", evaluate),
        ("compare", "heads beside generate(), prompt lookup and assisted generation", compare),
        ("export", "write native heads in a serving-engine layout", formats_cli),
        ("quickstart", "the embedded default end to end", quickstart),
    ]
    for name, help_text, module in commands:
        p = sub.add_parser(
            name,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=[debug_flag],
        )
        module.add_arguments(p)
        p.set_defaults(run=module.run)

    p = sub.add_parser(
        "import-heads",
        help="read an official engine checkpoint into a native one",
        description=formats_cli.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[debug_flag],
    )
    formats_cli.add_import_arguments(p)
    p.set_defaults(run=formats_cli.run_import)

    args = parser.parse_args(argv)
    if args.debug or argv is not None:
        return args.run(args)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print(f"specheads {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every error ends as one line; --debug shows the traceback
        print(f"specheads {args.command}: error: {error_line(e)}", file=sys.stderr)
        return 1


def error_line(e: BaseException) -> str:
    """What the user reads of an error: the message of the errors the toolkit raises on purpose (bad
    input, missing or corrupt files), the exception's type as well for anything else (a bug's clue)."""
    message = str(e).strip() or repr(e)
    if isinstance(e, (ValueError, OSError, LookupError, TypeError)):
        return message
    return f"{type(e).__name__}: {message} (run with --debug for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
