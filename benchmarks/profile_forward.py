"""Where one target forward's time goes on this machine (JSON out, a markdown table beside it).

Two forwards after a past of --past random tokens, each run --repeats times under torch's profiler:

    generate   one new token through the model with transformers' own cache and no mask: a step of the
               baseline, `generate()`
    tree-N     the decoder's tree forward over a chain of N nodes (--nodes), with its mask, positions, cache
               and the CPU paths it takes (packed weights, grouped attention): a speculative step's forward

For each: the wall time a forward, the ops that took the most time (self time on the host, and on the device
where there is one), and on an accelerator the device's busy share: its kernels' time over the wall time. A
small share means the forward is bound by the host (Python, launches), not by the device.

    python benchmarks/profile_forward.py --target smollm2 --device cuda --dtype bfloat16 --out runs/profile.json

Figures are measured here, never asserted in tests; the machine is named in the JSON with its load average.
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from specheads.builders.named_targets import resolve_target
from specheads.core.atomic import write_json, write_text
from specheads.core.target import FrozenTarget
from specheads.decode.batched_inputs import Layout, batched_tree_inputs
from specheads.decode.decoder import SpeculativeDecoder
from specheads.decode.kv_cache import new_cache
from specheads.decode.step import decoding_attention, timed
from specheads.decode.trees import DraftTree


class _NoDrafter:
    """The decoder's tree forward needs a drafter only for the layers it captures: none here."""

    capture_layers: tuple[int, ...] = ()


def device_time(event) -> float:
    """An op's own microseconds on the device (the attribute's name changed across torch versions)."""
    return getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0))


def top_ops(events, micros, top: int, repeats: int) -> list[dict]:
    """The `top` events by `micros(event)` (their own microseconds over all repeats), per forward."""
    return [
        {"op": e.key, "self_seconds": micros(e) / 1e6 / repeats, "calls": e.count // repeats}
        for e in sorted(events, key=lambda e: -micros(e))[:top]
    ]


def profiled(run, device: torch.device, repeats: int, top: int) -> dict:
    """Wall seconds a call of `run` (the mean of `repeats`, after two untimed calls) and its top ops."""
    timed(lambda: [run() for _ in range(2)], device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        _, seconds = timed(lambda: [run() for _ in range(repeats)], device)
    wall, events = seconds / repeats, prof.key_averages()
    row = {"wall_seconds": wall, "host_ops": top_ops(events, lambda e: e.self_cpu_time_total, top, repeats)}
    if device.type == "cuda":
        busy = sum(device_time(e) for e in events) / 1e6 / repeats
        row["device_busy_seconds"] = busy
        row["device_busy_share"] = busy / wall if wall > 0 else 0.0
        row["device_ops"] = top_ops(events, device_time, top, repeats)
    return row


@torch.no_grad()
def measure(target: FrozenTarget, past: int, nodes: list[int], repeats: int, top: int) -> dict[str, dict]:
    device = target.device
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.vocab_size, (1, past), generator=generator).to(device)
    results = {}

    # the baseline's step: the model itself, one token on transformers' own cache, no mask
    from transformers import DynamicCache  # noqa: PLC0415 -- transformers' own cache, as generate() makes it

    model = target.model
    cache = DynamicCache()
    model(prompt, past_key_values=cache, use_cache=True)
    token = prompt[:, -1:]

    def one_token() -> None:
        model(token, past_key_values=cache, use_cache=True)
        cache.crop(-1)  # back to the past alone (a negative count removes, in every transformers)

    results["generate"] = profiled(one_token, device, repeats, top)

    # the decoder's tree forward over a chain of n nodes, on its own cache
    decoder = SpeculativeDecoder(target, _NoDrafter())
    tree_cache = new_cache()
    target(prompt, past_key_values=tree_cache, logits=False)
    layout = Layout.contiguous(past, device=device)
    for n in nodes:
        tokens = torch.randint(0, target.vocab_size, (1, n), generator=generator).to(device)
        tree = DraftTree(tokens=tokens, parents=(torch.arange(n, device=device) - 1)[None])
        inputs = batched_tree_inputs(tree, layout, past, decoder.mask_dtype, decoder.window)

        def tree_forward(tree=tree, inputs=inputs, n=n) -> None:
            decoder.tree_forward(tree, inputs, tree_cache)
            tree_cache.crop(-n)  # the decoder's cache: back to the past alone

        results[f"tree-{n}"] = profiled(tree_forward, device, repeats, top)
    return results


def markdown(report: dict) -> str:
    lines = ["| forward | wall ms | device busy | top host ops (ms a forward) |", "| --- | --- | --- | --- |"]
    for name, row in report["forwards"].items():
        busy = f"{row['device_busy_share']:.0%}" if "device_busy_share" in row else "–"
        ops = ", ".join(f"{o['op']} {o['self_seconds'] * 1e3:.1f}" for o in row["host_ops"][:4])
        lines.append(f"| {name} | {row['wall_seconds'] * 1e3:.1f} | {busy} | {ops} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--target", required=True, help="HF directory, hub id, or a named target (tiny, smollm2)"
    )
    parser.add_argument("--past", type=int, default=300, help="cached tokens before the profiled forwards")
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 16, 64], help="tree sizes to profile")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--top", type=int, default=12, help="ops listed per forward")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", required=True, help="JSON file (a .md table is written beside it)")
    args = parser.parse_args(argv)
    if args.past < 1 or args.repeats < 1 or any(n < 1 for n in args.nodes):
        parser.error("--past, --repeats and every --nodes must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    target = FrozenTarget.from_pretrained(resolve_target(args.target), dtype=args.dtype)
    target.model.to(args.device)
    with decoding_attention(target.device):  # the decoder's attention backends (decode/step.py)
        forwards = measure(target, args.past, args.nodes, args.repeats, args.top)
    report = {
        "target": args.target,
        "past": args.past,
        "repeats": args.repeats,
        "forwards": forwards,
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "device": args.device,
            "dtype": args.dtype,
            "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
            "load_average_1min": os.getloadavg()[0],
        },
    }
    out = Path(args.out)
    write_json(out, report)
    write_text(out.with_suffix(".md"), markdown(report))
    print(markdown(report), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
