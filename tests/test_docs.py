"""README.md and the guides in docs/ say what runs: every command they show parses as written.

From the fenced code blocks of README.md and docs/*.md (the guides, not the folders beside them), every
`specheads ...`, `python -m specheads ...` and `accelerate launch ... -m specheads.train ...` line is read
(continuation lines joined, comments dropped) and parsed by the parser of the subcommand it names, built as
the console script builds it (`specheads.cli.commands.load(name).add_arguments`): an unknown subcommand or
flag, a missing required flag or a value outside a flag's choices fails here. `key=value` overrides of
`train` and `cache` must be recipe keys (`TrainConfig`'s fields). `accelerate launch`'s own flags are
parsed by accelerate's own launch parser.

Also: README stays within 15 KB and links the install, train-your-model and export guides near its top, and
every relative link of README and the guides points to a file of the repository.
"""

import argparse
import ast
import dataclasses
import importlib
import re
import shlex
from pathlib import Path

import pytest

from specheads.cli.commands import COMMANDS, load
from specheads.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_LIMIT = 15 * 1024
FIRST_SCREEN = 60  # lines of README where a newcomer finds the guides
FIRST_GUIDES = ("docs/install.md", "docs/train-your-model.md", "docs/export.md")
RECIPE_COMMANDS = ("train", "cache")  # commands whose positional key=value words are recipe keys


class ParseError(Exception):
    pass


class StrictParser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of printing usage and exiting."""

    def error(self, message):
        raise ParseError(message)


def fenced_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, logical line) of the fenced code blocks of a Markdown file, continuations joined."""
    out, inside, pending, start = [], False, "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        text = line.strip()
        if text.startswith("$ "):
            text = text[2:]
        if not pending:
            start = number
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        out.append((start, pending + text))
        pending = ""
    return out


LAUNCH = re.compile(
    r"(^|&&|\|\||;|\|)\s*([A-Z_][A-Z0-9_]*=\S*\s+)*(specheads|python3? -m specheads|accelerate launch)\b"
)


def commands_in(line: str) -> list[list[str]]:
    """The specheads invocations of one shell line, as argv lists starting at the launcher word."""
    if not LAUNCH.search(line):
        return []  # not a shell line that runs specheads (a TOML or text block, a diagram)
    words = shlex.split(line, comments=True)
    found, current = [], []
    for word in [*words, "&&"]:
        if word in ("&&", "||", ";", "|"):
            # a command may be preceded by environment assignments (OMP_NUM_THREADS=1 specheads ...)
            while current and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", current[0]):
                current.pop(0)
            if current and is_specheads(current):
                found.append(current)
            current = []
        else:
            current.append(word)
    return found


def is_specheads(argv: list[str]) -> bool:
    if argv[0] == "specheads":
        return True
    if argv[0] in ("python", "python3") and argv[1:2] == ["-m"]:
        return argv[2:3] in (["specheads"], ["specheads.train"])
    return argv[:2] == ["accelerate", "launch"] and ("specheads.train" in argv or "specheads" in argv)


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser `specheads NAME` runs with (cli/__init__.py), --debug included."""
    names = [n for n, _, _ in COMMANDS]
    if name not in names:
        raise ParseError(f"no subcommand {name!r}; the commands are {names}")
    parser = StrictParser(prog=f"specheads {name}")
    parser.add_argument("--debug", action="store_true")
    load(name).add_arguments(parser)
    return parser


def check_subcommand(name: str, args: list[str]) -> None:
    parsed = command_parser(name).parse_args(args)
    if name in RECIPE_COMMANDS:
        keys = {f.name for f in dataclasses.fields(TrainConfig)}
        for item in parsed.overrides:
            key = item.split("=", 1)[0]
            if "=" not in item or key not in keys:
                raise ParseError(f"{key!r} is not a recipe key (key=value)")


def check(argv: list[str]) -> str:
    """Parse one invocation; return the subcommand it runs."""
    if argv[0] == "specheads" or argv[2] == "specheads":
        rest = argv[1:] if argv[0] == "specheads" else argv[3:]
        if rest and rest[0] in ("--help", "-h", "--version"):
            return rest[0]
        check_subcommand(rest[0], rest[1:])
        return rest[0]
    if argv[0] in ("python", "python3"):  # python -m specheads.train
        check_subcommand("train", argv[3:])
        return "train"
    from accelerate.commands.launch import launch_command_parser

    launch = launch_command_parser()
    launch.error = StrictParser.error.__get__(launch)
    parsed = launch.parse_args(argv[2:])
    if parsed.module and parsed.training_script == "specheads" and parsed.training_script_args:
        rest = parsed.training_script_args  # -m specheads cache / eval / compare, several processes
        check_subcommand(rest[0], rest[1:])
        return rest[0]
    if not parsed.module or parsed.training_script != "specheads.train":
        raise ParseError("accelerate launch must run `-m specheads.train` or `-m specheads COMMAND`")
    check_subcommand("train", parsed.training_script_args)
    return "train"


def doc_commands() -> list[tuple[str, list[str]]]:
    return [
        (f"{page.relative_to(ROOT)}:{number}", argv)
        for page in PAGES
        for number, line in fenced_lines(page)
        for argv in commands_in(line)
    ]


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line number, source) of the ```python blocks of a Markdown file."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = line.strip()
        if current is None and fence == "```python":
            current, start = [], number + 1
        elif current is not None and fence.startswith("```"):
            blocks.append((start, "\n".join(current)))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_python_examples_parse_and_import_what_exists(page):
    """Every ```python block is valid Python, and every name it imports from specheads exists."""
    for start, source in python_blocks(page):
        tree = ast.parse(source, filename=f"{page.name}:{start}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specheads"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), (
                        f"{page.name}:{start}: {node.module} has no {alias.name}"
                    )


def test_the_guides_exist():
    names = {p.name for p in DOCS}
    for guide in ("install", "train-your-model", "data", "evaluate", "export", "design"):
        assert f"{guide}.md" in names, f"docs/{guide}.md is missing"


def test_every_command_parses_as_written():
    commands = doc_commands()
    where = {w.split(":")[0] for w, _ in commands}
    assert "README.md" in where and len(commands) >= 20, commands
    bad = []
    for location, argv in commands:
        try:
            check(argv)
        except (ParseError, LookupError) as e:
            bad.append(f"{location}: {shlex.join(argv)}\n    {e}")
    assert not bad, "commands that do not parse:\n" + "\n".join(bad)


def test_readme_shows_every_workflow():
    shown = {location.split(":")[0]: set() for location, _ in doc_commands()}
    for location, argv in doc_commands():
        shown[location.split(":")[0]].add(check(argv))
    assert {"quickstart", "distill", "train", "export", "eval", "compare"} <= shown["README.md"], shown
    unshown = {n for n, _, _ in COMMANDS} - set().union(*shown.values())
    assert not unshown, f"subcommands no page shows: {unshown}"


def test_the_checker_refuses_what_does_not_run():
    with pytest.raises(ParseError, match="no subcommand"):
        check(["specheads", "trian", "recipe.yaml"])
    with pytest.raises(ParseError, match="unrecognized arguments: --no-such-flag"):
        check(
            [
                "specheads",
                "eval",
                "--target",
                "T",
                "--heads",
                "H",
                "--prompts",
                "P",
                "--out",
                "O",
                "--no-such-flag",
            ]
        )
    with pytest.raises(ParseError, match="required"):
        check(["specheads", "export", "--heads", "H", "--out", "O"])
    with pytest.raises(ParseError, match="invalid choice"):
        check(["specheads", "export", "--heads", "H", "--format", "gguf", "--out", "O"])
    with pytest.raises(ParseError, match="'max_stpes' is not a recipe key"):
        check(["python", "-m", "specheads.train", "r.yaml", "max_stpes=3"])
    check(
        [
            "accelerate",
            "launch",
            "--config_file",
            "c.yaml",
            "--num_processes",
            "2",
            "-m",
            "specheads.train",
            "r.yaml",
            "lr=1e-4",
        ]
    )
    with pytest.raises(ParseError):
        check(["accelerate", "launch", "--num_procs", "2", "-m", "specheads.train", "r.yaml"])
    assert commands_in("OMP_NUM_THREADS=1 specheads eval --x 1 # note") == [["specheads", "eval", "--x", "1"]]
    assert commands_in('pip install "torch==2.13.0" -e ".[dev]" && specheads quickstart') == [
        ["specheads", "quickstart"]
    ]


def test_readme_is_short():
    size = README.stat().st_size
    assert size <= README_LIMIT, (
        f"README.md is {size} bytes; keep it within {README_LIMIT} (move detail to docs/)"
    )


def test_readme_links_the_first_guides_on_its_first_screen():
    top = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN])
    for guide in FIRST_GUIDES:
        assert f"]({guide}" in top, f"README's first {FIRST_SCREEN} lines do not link {guide}"


def test_readme_keeps_the_two_commands_ci_reads():
    lines = README.read_text().splitlines()
    install = [line for line in lines if re.match(r"^pip install .*# \(1\)", line)]
    tests = [line for line in lines if re.match(r"^python -m pytest.*# \(2\)", line)]
    assert len(install) == 1 and len(tests) == 1, (install, tests)
    assert lines.index(install[0]) < lines.index(tests[0]) < 20


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links in code are code
    return [
        target
        for target in LINK.findall(text)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")
    ]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_points_to_a_file(page):
    links = relative_links(page)
    missing = [t for t in links if not (page.parent / t.split("#", 1)[0]).resolve().exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"
    for target in links:
        assert (page.parent / target.split("#")[0]).resolve().is_relative_to(ROOT), target


def script_commands() -> list[tuple[str, str, list[str]]]:
    """(page, script path, its --flags) of every `python scripts/NAME.py ...` line in a fenced block."""
    found = []
    for page in PAGES:
        for number, line in fenced_lines(page):
            if not re.match(r"python3? scripts/", line):
                continue
            words = shlex.split(line, comments=True)
            if len(words) > 1 and words[0] in ("python", "python3") and words[1].startswith("scripts/"):
                flags = [w.split("=")[0] for w in words[2:] if w.startswith("--")]
                found.append((f"{page.relative_to(ROOT)}:{number}", words[1], flags))
    return found


def test_every_documented_script_takes_the_flags_shown():
    """The documented scripts exist and their --help names every flag the guides give them."""
    import subprocess
    import sys

    shown = script_commands()
    assert {script for _, script, _ in shown} >= {"scripts/bench_decode.py", "scripts/bench_batched.py"}
    helps: dict[str, str] = {}
    for where, script, flags in shown:
        assert (ROOT / script).is_file(), f"{where}: {script} does not exist"
        if script not in helps:
            run = [sys.executable, str(ROOT / script), "--help"]
            helps[script] = subprocess.run(run, capture_output=True, text=True, check=True, cwd=ROOT).stdout
        missing = [f for f in flags if f not in helps[script]]
        assert not missing, f"{where}: {script} takes no {missing}"
