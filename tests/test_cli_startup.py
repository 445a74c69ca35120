"""`specheads --help` imports no command and no torch; a command imports its own module and no other
command's (argparse would otherwise build, and import, every subcommand on every call: ~5 s)."""

import subprocess
import sys

PROBE = """
import contextlib, io, sys
from specheads.cli import main
with contextlib.redirect_stdout(io.StringIO()):  # the help text
    try:
        main({argv!r})
    except SystemExit:
        pass
loaded = sorted(
    m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("specheads.cli.") and m != "specheads.cli.commands"
)
print(" ".join(loaded), "torch" in sys.modules)
"""


def probe(argv: list[str]) -> tuple[list[str], bool]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[:-1], out[-1] == "True"


def test_top_level_help_imports_no_command_and_no_torch():
    assert probe(["--help"]) == ([], False)
    assert probe(["--version"]) == ([], False)


def test_a_command_imports_only_its_own_module():
    commands, _ = probe(["seed-prompts", "--help"])
    assert commands == ["seed_prompts"]
    commands, torch_loaded = probe(["eval", "--help"])
    assert "eval" in commands and not {"train", "compare", "distill", "quickstart"} & set(commands)
    assert torch_loaded  # eval's own imports need it
