"""A training step reads nothing back from the device that the target's own forward does not, except the
one read of the label positions (data/packing.py, label_positions).

On a GPU every such read (`.item()`, `float(t)`, `int(t)`, a `nonzero` or a boolean-mask index) waits for
all the work queued before it, so the host cannot queue ahead. Before the losses kept their sums on the
device, an EAGLE-3 step of the tiny recipe made 38 of them beyond the target's, Medusa 18 and EAGLE 7. On
the CPU these ops show in the profiler as they would on a GPU; Adam's reads of its step counts are left
out (they live on the host, also on a GPU, unless the optimizer is `capturable`).
"""

from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from specheads.data.packing import label_positions, shift_loss_mask
from specheads.methods import method_named, methods
from specheads.train import loop, prepare
from specheads.train.distributed import make_accelerator
from specheads.train.hidden_cache import target_output
from specheads.train.recipe import load_config

REPO = Path(__file__).resolve().parents[2]
READS = ("aten::_local_scalar_dense", "aten::nonzero")  # item() / float() / int() / bool(); nonzero

pytestmark = pytest.mark.usefixtures("one_thread")


def host_reads(prof) -> Counter:
    def in_optimizer(event) -> bool:
        while event is not None:
            if event.name.startswith("Optimizer.step"):
                return True
            event = event.cpu_parent
        return False

    return Counter(e.name for e in prof.events() if e.name in READS and not in_optimizer(e))


@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle3"])
def test_a_step_between_logs_reads_the_device_once_beyond_the_targets_forward(method, text_data, tmp_path):
    overrides = {
        "data": [str(text_data)],
        "output_dir": str(tmp_path / "run"),
        "max_steps": 4,
        "batch_size": 4,
        "max_length": 48,
        "eval_fraction": 0,
        "report_to": "none",
    }
    cfg = load_config(REPO / "recipes" / "tiny" / f"{method}.yaml", overrides, methods=methods())
    accelerator = make_accelerator(cfg)
    run = loop.set_up(cfg, method_named(cfg.method), accelerator)
    batches = prepare.train_batches(cfg, run.train_rows, run.collate, accelerator, start=0)
    window = loop.metric_sums(cfg, run.method, accelerator.device)
    timing = {"target": loop.TargetClock("cpu"), "step": 0.0, "labels": 0}
    loop.train_step(cfg, accelerator, run, batches, window, timing, 1)  # lazy state made on the first
    with profile(activities=[ProfilerActivity.CPU]) as step:
        grad_norm = loop.train_step(cfg, accelerator, run, batches, window, timing, 2)
        loop.stop_requested(accelerator, loop.StopOnSignal())
    objective = getattr(run.model, "module", run.model)
    with profile(activities=[ProfilerActivity.CPU]) as forward, torch.no_grad():
        target_output(
            run.target, next(batches), capture=objective.capture_layers, logits=objective.needs_logits
        )

    expected = host_reads(forward) + Counter({"aten::nonzero": 1})
    assert host_reads(step) == expected
    # what the step left on the device is what a log reads: two batches' labels and metric sums
    assert isinstance(grad_norm, torch.Tensor) and torch.isfinite(grad_norm)
    assert window.dtype == torch.float64 and window.sum() > 0
    assert isinstance(timing["labels"], torch.Tensor) and timing["labels"] > 0
    assert timing["target"].seconds() > 0  # on the CPU the host's clock times the target's forwards


class StandInEvent:
    """A CUDA event's stand-in on a shared clock: the stream has run `clock[0]` ms when it is recorded;
    waiting on it is counted in `clock[1]`."""

    def __init__(self, clock: list):
        self.clock, self.at = clock, None

    def record(self):
        self.at = self.clock[0]

    def elapsed_time(self, end) -> float:
        assert self.at is not None and end.at is not None, "elapsed_time of an event never recorded"
        return end.at - self.at

    def synchronize(self):
        self.clock[1] += 1


def test_on_a_gpu_the_target_clock_reads_stream_events_once_not_the_hosts_clock():
    """On a GPU the host's clock around a forward measures its launches: the clock brackets each forward
    with two events on the stream and waits on them once, when its seconds are read."""
    clock = [0.0, 0]  # stream milliseconds, waits
    timer = loop.TargetClock("cuda", event=lambda: StandInEvent(clock))

    def forward(ms):  # queues `ms` of stream work, returns at once
        def run():
            clock[0] += ms
            return ms

        return run

    assert [timer.time(forward(ms)) for ms in (30.0, 50.0, 20.0)] == [30.0, 50.0, 20.0]
    clock[0] += 1000.0  # the heads' work between forwards is not the target's
    assert clock[1] == 0  # timing the forwards waited for nothing
    assert timer.seconds() == pytest.approx(0.1)
    assert clock[1] == 1
    timer.time(forward(5.0))
    assert timer.seconds() == pytest.approx(0.105) and clock[1] == 2  # read again: the new pair only
    assert timer.seconds() == pytest.approx(0.105) and clock[1] == 2  # nothing new: nothing to wait for


def test_label_positions_are_each_offsets_nonzero_in_order():
    torch.manual_seed(0)
    loss_mask = (torch.rand(3, 11) > 0.3).long()
    # two packed documents in row 1: positions restart, so labels across the boundary are not valid
    position_ids = torch.arange(11).repeat(3, 1)
    position_ids[1, 6:] = torch.arange(5)
    offsets = [1, 2, 5, 10, 11, 14]  # the last two past the rows' length: no positions
    got = label_positions(loss_mask, position_ids, offsets)
    assert len(got) == len(offsets)
    for offset, (b, t) in zip(offsets, got):
        want_b, want_t = (shift_loss_mask(loss_mask, position_ids, offset) > 0).nonzero(as_tuple=True)
        assert torch.equal(b, want_b) and torch.equal(t, want_t)
    assert [len(b) for b, _ in got][-2:] == [0, 0]
    assert len(got[0][0]) > len(got[2][0]) > 0
