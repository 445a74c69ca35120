"""PNG plots of a `specheads compare` run, drawn with matplotlib's Agg canvas (no display needed).

Each plot reads the method entries of results.json (evaluate/compare.py) and nothing else, so a run can
be re-plotted from its results.json alone:

    acceptance_per_depth.png   accept_rate_per_depth per method (the methods that draft)
    accept_lengths.png         the share of steps emitting n tokens, per method (τ is its mean)
    tokens_per_second.png      tokens/s per method, its speedup over the baseline written beside it
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

PLOTS = {
    "acceptance_per_depth": "acceptance_per_depth.png",
    "accept_lengths": "accept_lengths.png",
    "tokens_per_second": "tokens_per_second.png",
}


def check_matplotlib() -> None:
    """Raise before any decoding when matplotlib is missing (plots come last)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError("the plots need matplotlib: `pip install matplotlib`, or pass --no-plots") from e


def save_png(figure, path: Path, **savefig) -> None:
    """Write `figure` to `path` as a 256-colour PNG: a third of the size of matplotlib's RGBA for the same
    picture (line plots use a few dozen colours), so plots kept in the repository stay small. Written
    whole or not at all: a temporary file beside `path`, then renamed."""
    from PIL import Image  # lazy: plots only (pillow is matplotlib's own dependency)

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", **savefig)
    with Image.open(buffer) as image:
        palette = image.convert("RGB").quantize(
            256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
        )
    partial = path.with_name(path.name + ".partial")
    palette.save(partial, format="PNG", optimize=True)
    partial.replace(path)


def _colors(methods: list[dict[str, Any]]) -> dict[str, str]:
    """One colour per method, the same in every plot (matplotlib's cycle, in the results' order)."""
    return {m["name"]: f"C{i % 10}" for i, m in enumerate(methods)}


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: plots only
    from matplotlib.figure import Figure  # lazy: plots only

    figure = Figure(figsize=(width, height), dpi=120, layout="constrained")
    FigureCanvasAgg(figure)  # an explicit Agg canvas: no pyplot, no global backend state
    return figure


def plot_acceptance_per_depth(methods: list[dict[str, Any]], path: Path) -> None:
    figure = _figure(6.4, 4.0)
    ax = figure.add_subplot()
    colors = _colors(methods)
    for m in methods:  # each up to the deepest its drafts reached: past it the rate is 0 by construction
        rates = [r or 0.0 for r in m["accept_rate_per_depth"][: m["deepest_draft"]]]
        if rates:
            x = range(1, len(rates) + 1)
            ax.plot(x, rates, marker="o", markersize=3, color=colors[m["name"]], label=m["name"])
    ax.set(
        xlabel="draft depth d",
        ylabel="share of steps accepting ≥ d draft tokens",
        ylim=(0, 1.02),
        title="Acceptance per draft position",
    )
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small")
    save_png(figure, path)


def plot_accept_lengths(methods: list[dict[str, Any]], path: Path) -> None:
    figure = _figure(7.2, 4.0)
    ax = figure.add_subplot()
    colors = _colors(methods)
    shown = [m for m in methods if m["steps"]]
    longest = max((len(m["accept_length_counts"]) for m in shown), default=1)
    width = 0.8 / max(1, len(shown))
    for i, m in enumerate(shown):
        counts = m["accept_length_counts"]
        shares = [c / m["steps"] for c in counts]
        x = [n + 1 + (i - (len(shown) - 1) / 2) * width for n in range(len(counts))]
        label = f"{m['name']} (τ {m['mean_accept_length']:.2f})"
        ax.bar(x, shares, width=width, color=colors[m["name"]], label=label)
    ax.set(
        xlabel="tokens emitted by a step (accepted draft tokens + bonus)",
        ylabel="share of steps",
        title="Accept length distribution",
        xticks=range(1, longest + 1),
    )
    ax.grid(axis="y", alpha=0.3)
    if shown:
        ax.legend(fontsize="small")
    save_png(figure, path)


def plot_tokens_per_second(methods: list[dict[str, Any]], path: Path, baseline: str) -> None:
    figure = _figure(6.4, 0.9 + 0.45 * len(methods))
    ax = figure.add_subplot()
    names = [m["name"] for m in methods]
    speeds = [m["tokens_per_second"] or 0.0 for m in methods]
    colors = _colors(methods)
    bars = ax.barh(names, speeds, color=[colors[n] for n in names])
    labels = [f"{m['speedup']:.2f}x" if m["speedup"] else "–" for m in methods]
    ax.bar_label(bars, labels=labels, padding=3, fontsize="small")
    ax.invert_yaxis()  # the first method on top, as in the tables
    ax.set(xlabel="new tokens / s (prefill included)", title=f"Throughput, speedup over {baseline}")
    ax.set_xlim(0, max(speeds, default=1.0) * 1.2 or 1.0)
    ax.grid(axis="x", alpha=0.3)
    save_png(figure, path)


def write_plots(methods: list[dict[str, Any]], out: Path, baseline: str) -> dict[str, str]:
    """Draw every plot into `out`; {kind: file name}."""
    plot_acceptance_per_depth(methods, out / PLOTS["acceptance_per_depth"])
    plot_accept_lengths(methods, out / PLOTS["accept_lengths"])
    plot_tokens_per_second(methods, out / PLOTS["tokens_per_second"], baseline)
    return dict(PLOTS)
