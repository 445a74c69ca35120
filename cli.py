"""The `specheads` console script: one subcommand per workflow.

Each subcommand lives with the code it runs and is also runnable on its own with `python -m`.
"""

from __future__ import annotations

import argparse
import sys

from specheads.version import __version__


def main(argv: list[str] | None = None) -> int:
    from specheads.decode import evaluate
    from specheads.train import loop, tiny_target

    parser = argparse.ArgumentParser(
        prog="specheads", description="Train and prove speculative-decoding draft heads."
    )
    parser.add_argument("--version", action="version", version=f"specheads {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "tiny-target", help="build the embedded default target offline", description=tiny_target.__doc__
    )
    tiny_target.add_arguments(p)
    p.set_defaults(run=tiny_target.run)

    p = sub.add_parser("train", help="train draft heads from a YAML recipe", description=loop.__doc__)
    loop.add_arguments(p)
    p.set_defaults(run=loop.run)

    from specheads.heads.formats import cli as formats_cli

    p = sub.add_parser(
        "export", help="write native heads in a serving-engine layout", description=formats_cli.__doc__
    )
    formats_cli.add_arguments(p)
    p.set_defaults(run=formats_cli.run)

    p = sub.add_parser(
        "import-heads",
        help="read an official engine checkpoint into a native one",
        description=formats_cli.__doc__,
    )
    formats_cli.add_import_arguments(p)
    p.set_defaults(run=formats_cli.run_import)

    p = sub.add_parser(
        "eval", help="speculative decoding against the target's own generate()", description=evaluate.__doc__
    )
    evaluate.add_arguments(p)
    p.set_defaults(run=evaluate.run)

    from specheads import quickstart

    p = sub.add_parser("quickstart", help="the embedded default end to end", description=quickstart.__doc__)
    quickstart.add_arguments(p)
    p.set_defaults(run=quickstart.run)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
