"""`options_from`: the one place a command's parsed flags become the library's typed options."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from specheads.cli import distill as distill_command
from specheads.cli.commands import options_from
from specheads.data.distillation import DistillConfig


def distill_args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    distill_command.add_arguments(parser)
    return parser.parse_args(["--target", "tiny", "--source", "stdlib", "--out", "out", *flags])


def test_each_field_comes_from_its_flag_unless_the_command_gives_it():
    args = distill_args("--temperature", "0.7", "--top-p", "0.9", "--max-new-tokens", "12", "--seed", "3")
    cfg = options_from(DistillConfig, args, long_prompts="skip", max_bad_rows=2)
    given = {"long_prompts": "skip", "max_bad_rows": 2}
    for field in dataclasses.fields(DistillConfig):
        expected = given[field.name] if field.name in given else getattr(args, field.name)
        assert getattr(cfg, field.name) == expected, field.name
    assert (cfg.temperature, cfg.top_p, cfg.max_new_tokens, cfg.seed) == (0.7, 0.9, 12, 3)


def test_a_field_no_flag_holds_and_the_command_does_not_give_is_an_error():
    with pytest.raises(AttributeError, match="long_prompts"):
        options_from(DistillConfig, distill_args(), max_bad_rows=2)
