import os

import pytest
import torch

from helpers import FAMILIES, save_tiny_target, tiny_model, tiny_tokenizer

# Nothing in the suite may reach a hub: fail at once instead of waiting on the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture(autouse=True)
def own_calibrations(tmp_path, monkeypatch):
    """Each test keeps its `--tree auto` calibrations apart (evaluate/calibration_cache.py), subprocesses
    too: a calibration one test made must not stand in for another's."""
    monkeypatch.setenv("SPECHEADS_CALIBRATIONS", str(tmp_path / "calibrations"))


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture
def model(family):
    return tiny_model(family, vocab_size=len(tiny_tokenizer()))


@pytest.fixture(scope="session")
def tiny_target_dirs(tmp_path_factory) -> dict:
    """One saved tiny random target per family, shared by every test of the run."""
    root = tmp_path_factory.mktemp("targets")
    return {f: save_tiny_target(f, root / f) for f in FAMILIES}


@pytest.fixture
def one_thread():
    """One torch thread for the test: tiny matrices gain nothing from a second thread, and on a busy
    2-core machine each op then pays for thread hand-offs (a forward can take ~100x longer).

    Files of tiny-model tests take it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
