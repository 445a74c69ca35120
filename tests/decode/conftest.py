"""Fixtures for the decoder tests (helpers live in decode_helpers.py)."""

import pytest

from specheads.decode import StaticTree

from decode_helpers import OracleDrafter, greedy_continuation


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every decoder test runs on one thread (tests/conftest.py: one_thread)."""
    yield


@pytest.fixture
def oracle():
    """oracle(model, prompt, tree, n_new, miss=..., seed=...) -> OracleDrafter over the greedy truth."""

    def make(model, prompt, tree: StaticTree, n_new: int, miss=0.25, seed=0) -> OracleDrafter:
        truth = greedy_continuation(model, prompt, n_new + tree.max_depth + 1)
        return OracleDrafter(prompt, truth, tree, model.config.vocab_size, miss=miss, seed=seed)

    return make
