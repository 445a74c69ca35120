"""train/host_memory.py: within `keep_freed_memory` glibc serves a large block from its heap (no mmap), what
the process started with comes back after the outermost hold, and training is the same with it as without."""

import ctypes
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from test_train_cli import args

from specheads.cli import main as cli_main
from specheads.heads import load_heads
from specheads.methods import methods
from specheads.train import host_memory, loop
from specheads.train.host_memory import glibc, keep_freed_memory

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny" / "medusa.yaml"
BLOCK = 64 << 20  # over glibc's largest mmap threshold (32 MiB): served by mmap under its defaults


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",  # bytes in mmapped blocks
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",  # free bytes in the heaps, their top included
            "keepcost",
        )
    ]


def mallinfo() -> MallInfo2:
    libc = glibc()
    libc.mallinfo2.restype = MallInfo2
    return libc.mallinfo2()


def mmapped_by_a_block() -> tuple[int, int]:
    """The mmapped bytes a tensor adds while it lives (torch allocates through malloc), and its size. It is
    larger than all the free memory the heaps hold (after earlier tests a freed block may stay free inside a
    heap, and glibc serves from there first), so under glibc's defaults only an mmap can serve it."""
    before = mallinfo()
    size = before.fordblks + BLOCK
    block = torch.empty(size, dtype=torch.uint8)
    during = mallinfo().hblkhd
    del block
    return during - before.hblkhd, size


def recording(real, seen: list):
    """`real` (keep_freed_memory) that appends (enabled, took) to `seen` each time a command holds it."""

    @contextmanager
    def held(enabled=True):
        with real(enabled) as took:
            seen.append((enabled, took))
            yield took

    return held


needs_glibc = pytest.mark.skipif(
    glibc() is None or not hasattr(glibc(), "mallinfo2"), reason="glibc >= 2.33 only (mallinfo2)"
)


@needs_glibc
def test_a_large_block_comes_from_the_heap_within_and_from_mmap_after():
    added, size = mmapped_by_a_block()
    assert added >= size  # glibc's defaults
    with keep_freed_memory() as took:
        assert took is True
        assert mmapped_by_a_block()[0] == 0
    added, size = mmapped_by_a_block()
    assert added >= size  # restored


@needs_glibc
def test_holds_nest_and_only_the_outermost_restores():
    with keep_freed_memory() as outer:
        with keep_freed_memory() as inner:
            assert outer is inner is True
        assert mmapped_by_a_block()[0] == 0  # the inner hold's end left the outer one's setting
        with keep_freed_memory(enabled=False) as off:
            assert off is False
        assert mmapped_by_a_block()[0] == 0
    added, size = mmapped_by_a_block()
    assert added >= size


@needs_glibc
def test_it_restores_what_the_user_gave_glibc_not_the_defaults(monkeypatch):
    monkeypatch.setenv(
        "GLIBC_TUNABLES", "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1125899906842624"
    )
    try:
        with keep_freed_memory():
            pass
        assert mmapped_by_a_block()[0] == 0  # the user's mmap_max=0 is back, not glibc's 65536
    finally:
        glibc().mallopt(host_memory.M_MMAP_MAX, host_memory.DEFAULT_MMAP_MAX)
        glibc().mallopt(host_memory.M_TRIM_THRESHOLD, host_memory.DEFAULT_TRIM_THRESHOLD)
    added, size = mmapped_by_a_block()
    assert added >= size


def test_what_the_process_started_with_reads_tunables_then_the_malloc_variables():
    default = (host_memory.DEFAULT_MMAP_MAX, host_memory.DEFAULT_TRIM_THRESHOLD)
    assert host_memory.started_with({}) == default
    tunables = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1125899906842624"
    assert host_memory.started_with({"GLIBC_TUNABLES": tunables}) == (0, -1)  # past an int: never trim
    aliases = {"MALLOC_MMAP_MAX_": "7", "MALLOC_TRIM_THRESHOLD_": "0x1000"}
    assert host_memory.started_with(aliases) == (7, 4096)
    both = {**aliases, "GLIBC_TUNABLES": "glibc.malloc.mmap_max=3:glibc.cpu.x86_rep_movsb_threshold=1"}
    assert host_memory.started_with(both) == (3, 4096)
    assert (
        host_memory.started_with({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=lots", "MALLOC_MMAP_MAX_": "-2"})
        == default
    )


def test_disabled_it_changes_nothing():
    with keep_freed_memory(enabled=False) as took:
        assert took is False
        if glibc() is not None and hasattr(glibc(), "mallinfo2"):
            added, size = mmapped_by_a_block()
            assert added >= size


def test_train_holds_it_as_the_recipe_says_and_trains_the_same(
    tiny_target_dirs, text_data, tmp_path, monkeypatch
):
    seen = []
    monkeypatch.setattr(loop, "keep_freed_memory", recording(loop.keep_freed_memory, seen))
    heads = []
    for keep in ("true", "false"):
        out = tmp_path / keep
        extra = ("max_steps=4", "eval_every=4", f"keep_host_memory={keep}")
        assert (
            cli_main(["train", *args(tiny_target_dirs["qwen3"], text_data, out, *extra), "--no-progress"])
            == 0
        )
        heads.append(load_heads(out, methods=methods())[0].state_dict())
    assert [enabled for enabled, _ in seen] == [True, False]
    assert seen[1][1] is False and (glibc() is None or seen[0][1] is True)
    assert all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])


def test_cache_and_distill_hold_it_as_told_and_write_the_same(
    tiny_target_dirs, text_data, tmp_path, monkeypatch
):
    """`specheads cache` holds it as the recipe's keep_host_memory says, `distill` as --[no-]keep-host-memory
    says; either way they write the same shards and answers."""
    seen = []
    monkeypatch.setattr(host_memory, "keep_freed_memory", recording(host_memory.keep_freed_memory, seen))
    target = tiny_target_dirs["llama"]
    written = {}
    for keep in ("true", "false"):
        cache = tmp_path / f"cache-{keep}"
        recipe = [RECIPE, f"target={target}", f"data={text_data}", "eval_data=[]", f"keep_host_memory={keep}"]
        assert cli_main(["cache", *map(str, recipe), "--out", str(cache), "--no-progress"]) == 0
        flag = "--keep-host-memory" if keep == "true" else "--no-keep-host-memory"
        answers = tmp_path / f"distill-{keep}"
        distill = ["--source", text_data, "--target", target, "--max-new-tokens", "4", "--max-rows", "6"]
        assert cli_main(["distill", *map(str, distill), "--out", str(answers), flag, "--no-progress"]) == 0
        written[keep] = {
            f"{kind}/{p.relative_to(folder).as_posix()}": p.read_bytes()
            for kind, folder in (("cache", cache), ("distill", answers))
            for p in sorted(folder.rglob("*"))
            if p.is_file() and p.suffix in (".safetensors", ".jsonl")
        }
    assert [enabled for enabled, _ in seen] == [True, True, False, False]  # cache, distill; then both off
    assert all(took is False for _, took in seen[2:]) and (
        glibc() is None or seen[0][1] is seen[1][1] is True
    )
    assert written["true"] and written["true"].keys() == written["false"].keys()
    assert any(k.endswith(".safetensors") for k in written["true"]) and any(
        k.endswith(".jsonl") for k in written["true"]
    )
    assert all(written["true"][k] == written["false"][k] for k in written["true"]), "the outputs differ"
