"""The memory estimate printed before training (train/memory.py): against the allocator's measured peak
over real training steps, and the refusal of a run that cannot fit, with `--force` to train anyway."""

import json
from pathlib import Path

import pytest
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from specheads.cli import main as cli_main
from specheads.methods import method_named, methods
from specheads.train import loop, memory
from specheads.train.memory import MemoryEstimateError, estimate_memory, read_target_config
from specheads.train.recipe import load_config

from helpers import tiny_model, tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
LENGTH = 64  # max_length; every text is 6 windows of it, so every batch is full and every position a label

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def wide_vocab_target(tmp_path_factory) -> Path:
    """A tiny random Llama (4 layers of 64) with a 16,384-token vocabulary: the heads' projections, their
    optimizer state and the logits, not the target, are what a step holds."""
    path = tmp_path_factory.mktemp("wide") / "target"
    tiny_model("llama", vocab_size=16384).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def full_rows(tmp_path_factory) -> Path:
    """Texts of exactly 6 x LENGTH one-byte tokens: windows that fill max_length, no short remainder."""
    path = tmp_path_factory.mktemp("rows") / "letters.jsonl"
    words = ["abcdefghij", "klmnopqrst", "uvwxyzabcd", "jihgfedcba"]
    texts = [(words[i % 4] * 40)[i % 7 : i % 7 + 6 * LENGTH] for i in range(64)]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def overrides(target: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"target={target}",
        f"data={data}",
        "eval_fraction=0",
        "eval_data=[]",
        "loss_on=all",
        f"max_length={LENGTH}",
        "batch_size=4",
        "max_steps=2",  # the second step holds the optimizer state the first one made
        "warmup_steps=1",
        "log_every=1",
        "report_to=none",
        f"output_dir={out}",
        *extra,
    ]


def allocator_peak(run) -> int:
    """The most bytes the CPU allocator held at once during run(), counted from its own allocation and free
    events (torch's profiler with profile_memory): every tensor, parameters and optimizer state included."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        run()
    events = []

    def walk(node):
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(
    "recipe, extra",
    [
        ("medusa.yaml", ()),  # 4 heads, each its own 16,384 x 64 projection; target-top1 labels
        ("eagle3.yaml", ("eagle3.draft_vocab_size=8192",)),  # 5 steps of training-time test, Muon
    ],
)
def test_the_estimate_is_within_a_quarter_of_the_measured_peak(
    wide_vocab_target, full_rows, tmp_path, recipe, extra
):
    cfg = load_config(
        REPO / "recipes" / "tiny" / recipe,
        overrides(wide_vocab_target, full_rows, tmp_path / "run", *extra),
        methods=methods(),
    )
    method = method_named(cfg.method)
    estimate = estimate_memory(cfg, method, read_target_config(str(wide_vocab_target)))
    measured = allocator_peak(lambda: loop.train(cfg, method, progress=False))
    assert json.loads((tmp_path / "run" / "train_summary.json").read_text())["completed"]
    # what the comparison is about: the heads, their optimizer state and the logits, not the target
    assert estimate.target_weights < 0.15 * measured
    assert estimate.head_parameters + estimate.optimizer_state + estimate.activations > 0.8 * measured
    assert abs(estimate.peak - measured) / measured <= 0.25, (estimate, measured)


def test_zero_and_offline_split_what_they_split(wide_vocab_target):
    cfg = load_config(REPO / "recipes" / "tiny" / "medusa.yaml", [], methods=methods())
    config = read_target_config(str(wide_vocab_target))
    one = estimate_memory(cfg, method_named("medusa"), config)
    sharded = estimate_memory(cfg, method_named("medusa"), config, processes=4, zero_stage=3)
    assert sharded.target_weights == one.target_weights // 4
    assert sharded.optimizer_state == one.optimizer_state // 4 and sharded.gradients == one.gradients // 4
    assert sharded.head_parameters == one.head_parameters // 4
    heads = 4 * (16384 * 64 + 64 * 64 + 64)  # each head: its projection and one residual block
    assert one.trainable_parameters == heads and one.optimizer_state == 2 * 4 * heads
    offline = load_config(
        REPO / "recipes" / "tiny" / "medusa.yaml", ["mode=offline", "cache_dir=unused"], methods=methods()
    )
    # offline, only the embedding, the final norm and the lm_head are loaded
    assert estimate_memory(offline, method_named("medusa"), config).target_weights == (2 * 16384 + 1) * 64 * 4


@pytest.mark.parametrize(
    "recipe, keys",
    [
        ("medusa.yaml", ["medusa.share_lm_head=true", "medusa.num_heads=2", "batch_size=", "max_length="]),
        ("eagle3.yaml", ["eagle3.draft_vocab_size=", "eagle3.ttt_steps=", "batch_size=", "max_length="]),
    ],
)
def test_a_run_that_cannot_fit_is_refused_naming_the_keys_that_shrink_it(
    wide_vocab_target, full_rows, tmp_path, capsys, recipe, keys
):
    out = tmp_path / "run"
    impossible = overrides(wide_vocab_target, full_rows, out, "batch_size=4096", "max_length=4096")
    with pytest.raises(MemoryEstimateError) as refused:
        cli_main(["train", str(REPO / "recipes" / "tiny" / recipe), *impossible, "--no-progress"])
    message = str(refused.value)
    assert "this run needs about" in message and "pass --force to try anyway" in message
    for key in keys:
        assert key in message, (key, message)
    assert "memory estimate a process on cpu" in capsys.readouterr().out  # the table came first
    assert not out.exists()  # refused before anything was written


def test_force_trains_a_run_the_estimate_refuses(wide_vocab_target, full_rows, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(memory, "available_memory", lambda device: 1)  # a device with no room at all
    argv = [
        "train",
        str(REPO / "recipes" / "tiny" / "medusa.yaml"),
        *overrides(wide_vocab_target, full_rows, tmp_path / "run", "max_steps=1"),
        "--no-progress",
    ]
    with pytest.raises(MemoryEstimateError, match="1 byte|0.0 MB available"):
        cli_main(argv)
    assert cli_main([*argv, "--force"]) == 0
    printed = capsys.readouterr().out
    assert "heads' parameters" in printed and "activations and logits" in printed and "peak" in printed
    assert (tmp_path / "run" / "train_summary.json").is_file()
