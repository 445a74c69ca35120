"""`specheads quickstart` end to end on a minimal budget: target, heads, one comparison, one table."""

import argparse
import json
from pathlib import Path

import pytest

from specheads.cli import main as cli_main
from specheads.methods import methods

METHODS = ("medusa", "eagle", "eagle3")


def test_quickstart_runs_end_to_end_and_reuses_what_it_built(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "qs"
    argv = ["quickstart", "--out", str(out), "--minutes", "0.01", "--max-steps", "2", "--assisted"]
    argv += ["--num-prompts", "2", "--max-new-tokens", "8", "--tiny-max-files", "40", "--no-progress"]
    assert cli_main(argv) == 0
    printed = capsys.readouterr().out
    assert "tiny target built" in printed and "tiny draft built" in printed
    report = (out / "report.md").read_text()
    results = json.loads((out / "compare" / "results.json").read_text())
    names = [m["name"] for m in results["methods"]]
    assert names == ["generate", "prompt-lookup", "assisted", *METHODS]
    for m in results["methods"]:
        assert f"| {m['name']} |" in printed and f"| {m['name']} |" in report
        assert m["identical_to_baseline"] == "2/2" and m["mean_accept_length"] >= 1.0 and m["speedup"] > 0
    for method in METHODS:
        assert f"training {method} heads" in printed
    # fixed trees, not EAGLE's calibrated default: the quickstart's figures are compared across machines
    trees = {m["name"]: m["settings"]["tree"]["name"] for m in results["methods"] if m["name"] in METHODS}
    assert trees["eagle"] == trees["eagle3"] == "dynamic-32" and trees["medusa"].startswith("medusa-")
    assert not any("calibration" in m["settings"] for m in results["methods"] if m["name"] in METHODS)
    assert "## Which figures vary between machines" in report and "do not apply" in report  # not defaults
    for plot in results["plots"].values():
        assert (out / "compare" / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A second run reuses the target, the draft and the heads.
    assert cli_main(argv) == 0
    printed = capsys.readouterr().out
    assert "tiny target reused" in printed and "tiny draft reused" in printed
    assert all(f"reusing {method} heads" in printed for method in METHODS)


def test_report_says_which_figures_vary_and_by_how_much(monkeypatch):
    """At the default settings the report sets each figure beside the ranges measured over fresh builds on
    each machine (README's tables) and marks a τ outside all of them; at other settings it says the ranges
    do not apply."""
    from specheads.cli import quickstart

    defaults = argparse.ArgumentParser()
    quickstart.add_arguments(defaults)
    args = defaults.parse_args([])
    machines = [
        {"builds": 3, "machine": "CPU A", "short": "A", "settings": "s",
         "ranges": {"generate": (1.0, 1.0, 1.0, 1.0), "medusa": (2.5, 3.0, 0.9, 1.2)}},
        {"builds": 2, "machine": "CPU B", "short": "B", "settings": "t",
         "ranges": {"generate": (1.0, 1.0, 1.0, 1.0), "medusa": (3.5, 3.6, 1.3, 1.4)}},
    ]  # fmt: skip
    monkeypatch.setattr(quickstart, "MEASURED_SPREAD", machines)
    methods = [
        {"name": "generate", "mean_accept_length": 1.0, "speedup": 1.0},
        {"name": "medusa", "mean_accept_length": 3.4, "speedup": 1.1},
    ]
    text = quickstart.spread(methods, args)
    assert "| method | τ here | τ measured, A | τ measured, B | speedup here |" in text
    assert "| generate | 1.00 | 1.00-1.00 | 1.00-1.00 | 1.00x | 1.00-1.00x | 1.00-1.00x |" in text
    assert (
        "| medusa | 3.40 (outside every machine's) | 2.50-3.00 | 3.50-3.60 | 1.10x | 0.90-1.20x | 1.30-1.40x |"
        in text
    )
    assert (
        "Over 5 fresh builds at the default settings, on 2 machines" in text
        and "- B: 2 builds (CPU B; t)" in text
    )
    for tau in (2.7, 3.55):  # inside one machine's range is not flagged
        methods[1]["mean_accept_length"] = tau
        assert f"| medusa | {tau:.2f} | 2.50-3.00 |" in quickstart.spread(methods, args)
    machines[1]["ranges"]["medusa"] = None  # B has not measured today's Medusa recipe
    methods[1]["mean_accept_length"] = 3.55
    assert "| medusa | 3.55 (outside every machine's) | 2.50-3.00 | – | 1.10x | 0.90-1.20x | – |" in (
        quickstart.spread(methods, args)
    )
    args.max_steps = 2
    assert "do not apply" in quickstart.spread(methods, args) and "| medusa |" not in quickstart.spread(
        methods, args
    )


def test_measured_ranges_cover_every_method_and_peer():
    from specheads.cli import quickstart

    for machine in quickstart.MEASURED_SPREAD:
        ranges = machine["ranges"]
        assert set(ranges) == {"generate", "prompt-lookup", *METHODS}, machine["short"]
        for tau_lo, tau_hi, sp_lo, sp_hi in filter(None, ranges.values()):  # None: not measured there
            assert 1.0 <= tau_lo <= tau_hi and 0 < sp_lo <= sp_hi
    for method in ("generate", "prompt-lookup", *METHODS):  # each measured on one machine at least
        assert any(machine["ranges"][method] for machine in quickstart.MEASURED_SPREAD), method


def test_the_measured_ranges_are_a_data_file_shipped_with_the_package():
    """The ranges, and the machine each comes from, live in cli/quickstart_reference.json (package data), not
    in the code; neither carries dates."""
    import re

    import tomllib

    from specheads.cli import quickstart

    repo = Path(__file__).resolve().parents[1]
    data = repo / "src" / "specheads" / "cli" / quickstart.REFERENCE_FILE
    shipped = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert quickstart.REFERENCE_FILE in shipped["specheads.cli"]
    assert (
        quickstart.MEASURED_SPREAD
        == json.loads(data.read_text())["machines"]
        == quickstart.reference_ranges()
    )
    assert all(machine["machine"] and machine["builds"] >= 1 for machine in quickstart.MEASURED_SPREAD)
    for text in (data.read_text(), Path(quickstart.__file__).read_text()):
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)


def test_a_recipe_asking_for_muon_trains_with_adamw_on_a_torch_without_it(monkeypatch, capsys):
    from specheads.cli import quickstart
    from specheads.train import config

    recipe = quickstart.recipe_for("eagle3")
    # the tiny EAGLE-3 recipe's optimizer
    assert quickstart.load_config(recipe, [], methods=methods()).optimizer == "muon"
    assert quickstart.without_muon("eagle3", recipe, ["seed=1"]) == ["seed=1"]  # this torch has Muon
    # such a torch: the recipe check refuses Muon (train/config.py) as the quickstart's own check sees it missing
    for module in (quickstart, config):
        monkeypatch.setattr(module, "muon_missing", lambda: "needs torch >= 2.9")
    with pytest.raises(ValueError, match="needs torch >= 2.9"):
        quickstart.load_config(recipe, ["seed=1"], methods=methods())
    overrides = quickstart.without_muon("eagle3", recipe, ["seed=1"])
    assert overrides == ["seed=1", "optimizer=adamw"]
    # what train_heads then trains
    assert quickstart.load_config(recipe, overrides, methods=methods()).optimizer == "adamw"
    assert "eagle3: needs torch >= 2.9; training with optimizer=adamw" in capsys.readouterr().out
    medusa = quickstart.recipe_for("medusa")  # an AdamW recipe is left as it is
    assert quickstart.without_muon("medusa", medusa, []) == []
