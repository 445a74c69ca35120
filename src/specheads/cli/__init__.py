"""The `specheads` console script: one subcommand per workflow.

Each subcommand is a module of this package (its arguments and its `run`), over library functions.

From the command line an error ends the command with one line, `specheads COMMAND: error: ...` naming the
file or key at fault, and exit code 1; `--debug` (before or after the command) shows the traceback instead.
Called from Python with an argument list, `main(argv)` raises the error for its caller to handle.
"""

from __future__ import annotations

import argparse
import sys

from specheads.cli.commands import COMMANDS, load
from specheads.version import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="specheads", description="Train and prove speculative-decoding draft heads."
    )
    parser.add_argument("--version", action="version", version=f"specheads {__version__}")
    debug_help = "on an error, show the traceback instead of one line"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    debug_flag = argparse.ArgumentParser(add_help=False)  # also accepted after the command
    debug_flag.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Only the command being run is imported and given its arguments (the first word that is not an
    # option: the options before it take no value); the others are listed by name and help alone.
    chosen = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    for name, help_text, _ in COMMANDS:
        if name != chosen:
            sub.add_parser(name, help=help_text)
            continue
        module = load(name)
        p = sub.add_parser(
            name,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=[debug_flag],
        )
        module.add_arguments(p)
        p.set_defaults(run=module.run)

    args = parser.parse_args(argv)
    from specheads.cli.threads import torch_threads  # imports torch: after --help and usage errors

    if args.debug or argv is not None:
        with torch_threads(getattr(args, "threads", None)):
            return args.run(args)
    try:
        with torch_threads(getattr(args, "threads", None)):
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
    from specheads.core.atomic import DiskFullError, is_disk_full  # lazy: --help starts without it

    message = str(e).strip() or repr(e)
    if is_disk_full(e) and not isinstance(e, DiskFullError):  # not written through core/atomic
        where = f" writing {e.filename}" if getattr(e, "filename", None) else ""
        return f"the disk is full (no space left on device{where}): free space or write elsewhere ({message})"
    if isinstance(e, (ValueError, OSError, LookupError, TypeError)):
        return message
    return f"{type(e).__name__}: {message} (run with --debug for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
