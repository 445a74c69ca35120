"""Fixtures shared by the training tests."""

import json
from pathlib import Path

import pytest

from specheads.builders.tiny_target import ensure_tiny_target

from helpers import SMALL_TINY_TARGET


@pytest.fixture(scope="module")
def text_data(tmp_path_factory) -> Path:
    """Cyclic text: every byte determines the next ones, so heads reading h_t can learn t+2+k."""
    path = tmp_path_factory.mktemp("data") / "cycles.jsonl"
    words = ["abcdefghij", "0123456789", "klmnopqrst", "uvwxyz!?.,"]
    rows = [{"text": (words[i % 4] * 8)[i % 7 :]} for i in range(64)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="session")
def small_tiny_target(tmp_path_factory) -> Path:
    """The embedded tiny target at test size (helpers.SMALL_TINY_TARGET), built once per test run."""
    path, _, _ = ensure_tiny_target(
        SMALL_TINY_TARGET, tmp_path_factory.mktemp("tiny") / "target", progress=False
    )
    return path


@pytest.fixture(scope="session")
def llama_dir(tiny_target_dirs) -> Path:
    """The tiny random Llama target, saved once per run (tests/conftest.py's `tiny_target_dirs`)."""
    return tiny_target_dirs["llama"]
