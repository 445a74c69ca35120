"""The consumers' packages, installed apart once for the whole test run (consumer_env.py)."""

from pathlib import Path

import pytest

from consumer_env import build, env_dir


@pytest.fixture(scope="session")
def consumer_env() -> Path:
    """The directory holding the consumers' packages (built on first use, then cached)."""
    out = env_dir()
    if not (out / "PINS").is_file():
        build(out)
    return out
