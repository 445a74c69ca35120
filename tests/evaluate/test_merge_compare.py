"""scripts/merge_compare.py: compare runs over disjoint prompts merged into the whole set's figures."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "merge_compare.py"
spec = importlib.util.spec_from_file_location("merge_compare", SCRIPT)
merge_compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(merge_compare)


def entry(tokens, seconds, base_seconds, steps, tau, rates, identical, outside=None):
    return {"new_tokens": tokens, "seconds": seconds, "baseline_seconds": base_seconds, "baseline_new_tokens": tokens,
            "num_prompts": int(identical.split("/")[1]), "steps": steps, "mean_accept_length": tau,
            "accept_rate_per_depth": rates, "identical_to_baseline": identical, "outside_forward_fraction": outside}  # fmt: skip


def run(medusa, generate, category="writing"):
    methods = []
    for name, e in (("generate", generate), ("medusa", medusa)):
        methods.append({"name": name, "settings": {"tree": name}, **e, "per_category": {category: e}})
    return {
        "methods": methods,
        "command": "specheads compare ...",
        "prompts": {"source": category},
        "max_new_tokens": 256,
        "dtype": "float32",
        "threads": 1,
        "versions": {},
        "platform": "x",
    }


def test_sums_tokens_and_seconds_and_weights_tau_acceptance_and_shares_by_steps_and_seconds():
    a = run(
        entry(100, 10.0, 20.0, 50, 2.0, [0.6, 0.2], "4/4", 0.10), entry(100, 20.0, 20.0, 100, 1.0, [], "4/4")
    )
    b = run(
        entry(300, 30.0, 30.0, 250, 1.2, [0.2], "3/4", 0.30),
        entry(300, 30.0, 30.0, 300, 1.0, [], "4/4"),
        "math",
    )
    merged = merge_compare.merge([a, b])
    m = merged["methods"]["medusa"]
    assert (m["new_tokens"], m["seconds"], m["steps"], m["num_prompts"]) == (400, 40.0, 300, 8)
    assert m["tau"] == pytest.approx((2.0 * 50 + 1.2 * 250) / 300)
    assert m["accept_rate_per_depth"] == pytest.approx([(0.6 * 50 + 0.2 * 250) / 300, 0.2 * 50 / 300])
    assert m["outside_forward_fraction"] == pytest.approx((0.10 * 10 + 0.30 * 30) / 40)
    assert m["identical"] == "7/8"
    assert m["speedup"] == pytest.approx(
        (400 / 40) / (400 / 50)
    )  # the whole set's tokens/s over generate()'s
    assert set(m["per_category"]) == {"writing", "math"}
    assert m["per_category"]["math"]["speedup"] == pytest.approx(1.0)
    assert merged["methods"]["generate"]["outside_forward_fraction"] is None


def test_runs_of_other_methods_or_settings_are_refused():
    a = run(entry(1, 1.0, 1.0, 1, 1.0, [], "1/1"), entry(1, 1.0, 1.0, 1, 1.0, [], "1/1"))
    b = json.loads(json.dumps(a))
    b["methods"][1]["settings"] = {"tree": "medusa-63"}
    with pytest.raises(ValueError, match="medusa ran with other settings"):
        merge_compare.merge([a, b])
    b["methods"] = b["methods"][:1]
    with pytest.raises(ValueError, match="other methods"):
        merge_compare.merge([a, b])


def test_writes_compact_json_and_a_table_without_trailing_zero_depths(tmp_path):
    a = run(
        entry(100, 10.0, 20.0, 50, 2.0, [0.6, 0.2, 0.001], "4/4", 0.1),
        entry(100, 20.0, 20.0, 100, 1.0, [], "4/4"),
    )
    paths = []
    for i, r in enumerate([a, a]):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(r))
    out, md = tmp_path / "m.json", tmp_path / "m.md"
    assert merge_compare.main([*map(str, paths), "--out", str(out), "--md", str(md), "--title", "T"]) == 0
    assert (
        "\n" not in out.read_text() and json.loads(out.read_text())["methods"]["medusa"]["identical"] == "8/8"
    )
    text = md.read_text()
    assert text.startswith("# T") and "| medusa | 2.00 | 0.60 0.20 | 10.0 | 2.00x | 10% | 8/8 |" in text
    assert "| writing | 1.00 / 1.00x | 2.00 / 2.00x |" in text
