"""`compare` and `eval` decode every method, the peers and the baseline too, under the decoders' attention
backends (decode/step.py: decoding_attention; on CUDA, SDPA without cuDNN's per-shape plans)."""

import pytest
from compare_helpers import compare_args, compare_cli
from test_tree_auto_cli import eval_args, make_setup

from specheads.cli import main as cli
from specheads.evaluate import compare
from specheads.evaluate import run as eval_run

from helpers import record_decoding_attention

pytestmark = pytest.mark.usefixtures("one_thread")


def test_compare_decodes_every_method_under_it(compare_setup, tmp_path, monkeypatch):
    entered = record_decoding_attention(monkeypatch, compare)
    heads = ["--heads", str(compare_setup["root"] / "medusa"), "--tree", "chain-4"]
    argv = compare_args(compare_setup, tmp_path / "out", compare_setup["questions"], *heads)
    argv += ["--peers", "generate,prompt-lookup", "--warmup", "0", "--max-turns", "1", "--num-prompts", "1"]
    assert compare_cli(argv) == 0
    assert entered == ["cpu"]  # once, around the calibration and every method's decoding


@pytest.fixture(scope="module")
def setup(tiny_target_dirs, tmp_path_factory) -> dict:
    return make_setup(tiny_target_dirs, tmp_path_factory)


def test_eval_decodes_the_heads_and_the_baseline_under_it(setup, tmp_path, monkeypatch):
    entered = record_decoding_attention(monkeypatch, eval_run)
    assert cli(eval_args(setup, tmp_path / "out", "medusa", "--tree", "chain-4", "--num-prompts", "1")) == 0
    assert entered == ["cpu"]
