"""Fixtures for the evaluation tests."""

import json

import pytest
import torch
from compare_helpers import QUESTIONS, SOURCES

from specheads.core.target import FrozenTarget
from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads, save_heads

from helpers import target_with_heldout, tiny_model, tiny_tokenizer


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every evaluation test runs on one thread (tests/conftest.py: one_thread)."""
    yield


@pytest.fixture(scope="module")
def compare_setup(tiny_target_dirs, tmp_path_factory) -> dict:
    """The tiny llama target (with held-out files), Medusa and EAGLE heads, two drafts, questions."""
    root = tmp_path_factory.mktemp("compare")
    target_dir = target_with_heldout(tiny_target_dirs["llama"], root, SOURCES)

    target = FrozenTarget.from_pretrained(str(target_dir))
    torch.manual_seed(0)
    medusa = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=3))
    save_heads(medusa.init_lm_heads_from(target.lm_head), root / "medusa", target.record())
    from specheads.heads import layer_config_from

    save_heads(EagleHead(EagleConfig(layer_config_from(target.config))), root / "eagle", target.record())
    # A second, smaller random model of the same tokenizer: the assistant.
    tokenizer = tiny_tokenizer()
    tiny_model("llama", seed=1, vocab_size=len(tokenizer), num_hidden_layers=1).save_pretrained(
        root / "draft"
    )
    tokenizer.save_pretrained(root / "draft")
    (root / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return {"root": root, "target": target_dir, "questions": root / "questions.jsonl"}


@pytest.fixture(autouse=True, scope="module")
def compare_keep_threads():
    """`--threads` sets torch's thread count for the process: give later tests theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
