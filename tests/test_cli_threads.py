"""`--threads N` through the real console script: every command that loads or trains a model takes it, from
one definition (cli/threads.py), and its run sees torch at N threads, given back afterwards."""

import argparse

import pytest
import torch

from specheads.cli import commands
from specheads.cli import main as cli_main
from specheads.cli.threads import add_threads_argument

# the commands that load or train a model; seed-prompts only writes text
COMPUTING = {
    "tiny-target": [],
    "tiny-draft": ["--target", "t"],
    "distill": ["--source", "s", "--target", "t", "--out", "o"],
    "cache": ["r.yaml"],
    "train": ["r.yaml"],
    "eval": ["--target", "t", "--heads", "h", "--prompts", "p", "--out", "o"],
    "compare": ["--target", "t", "--prompts", "p", "--out", "o"],
    "export": ["--heads", "h", "--format", "medusa", "--out", "o"],
    "import-heads": ["--format", "medusa", "--checkpoint", "c", "--target", "t", "--out", "o"],
    "quickstart": [],
}


def threads_action(module):
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return next((a for a in parser._actions if "--threads" in a.option_strings), None)


def test_every_computing_command_takes_the_one_threads_flag():
    reference = argparse.ArgumentParser()
    add_threads_argument(reference)
    (one,) = [a for a in reference._actions if "--threads" in a.option_strings]
    names = {name for name, _, _ in commands.COMMANDS}
    assert set(COMPUTING) == names - {"seed-prompts"}  # a new command is listed here, or here left out
    for name, _, _ in commands.COMMANDS:
        action = threads_action(commands.load(name))
        if name not in COMPUTING:
            assert action is None, name
            continue
        assert action is not None, f"{name} has no --threads"
        # the helper's flag, not a copy: the same parsing and help
        assert (action.type, action.default, action.help) == (one.type, one.default, one.help), name


@pytest.mark.parametrize("name", sorted(COMPUTING))
def test_the_run_sees_the_threads_and_the_caller_gets_its_own_back(name, monkeypatch):
    module = commands.load(name)
    seen = []
    monkeypatch.setattr(module, "run", lambda args: seen.append(torch.get_num_threads()) or 0)
    before = torch.get_num_threads()
    wanted = 3 if before != 3 else 2
    assert cli_main([name, *COMPUTING[name], "--threads", str(wanted)]) == 0
    assert seen == [wanted] and torch.get_num_threads() == before
    assert cli_main([name, *COMPUTING[name]]) == 0  # without the flag: torch's own count
    assert seen == [wanted, before]


def test_a_thread_count_below_one_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        cli_main(["train", "r.yaml", "--threads", "0"])
    assert "--threads: must be >= 1, got 0" in capsys.readouterr().err
