"""Fixtures for the evaluation tests."""

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every evaluation test runs on one thread (tests/conftest.py: one_thread)."""
    yield
