"""The `specheads` console script: one subcommand per workflow.

Each subcommand lives with the code it runs and is also runnable on its own with `python -m`.
"""

from __future__ import annotations

import argparse
import sys

from specheads.version import __version__


def main(argv: list[str] | None = None) -> int:
    from specheads import quickstart
    from specheads.evaluate import compare, evaluate
    from specheads.heads.formats import cli as formats_cli
    from specheads.train import cache_cli, distill, loop, tiny_draft, tiny_target

    parser = argparse.ArgumentParser(
        prog="specheads", description="Train and prove speculative-decoding draft heads."
    )
    parser.add_argument("--version", action="version", version=f"specheads {__version__}")
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
        )
        module.add_arguments(p)
        p.set_defaults(run=module.run)

    p = sub.add_parser(
        "import-heads",
        help="read an official engine checkpoint into a native one",
        description=formats_cli.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    formats_cli.add_import_arguments(p)
    p.set_defaults(run=formats_cli.run_import)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
