"""scripts/merge_compare.py: compare runs over disjoint prompts merged into what one run over all of them gives."""

import json
from types import SimpleNamespace

import pytest

from scripts import merge_compare
from specheads.evaluate.compare_records import method_entry

PHASES = {
    "prefill": 0.1,
    "draft": 0.2,
    "tree_inputs": 0.0,
    "tree_forward": 0.5,
    "verify": 0.1,
    "compact": 0.0,
}


def record(
    i: int, category: str, accept: list[int], seconds: float, identical: bool = True, timed=True
) -> dict:
    """A per-prompt record as compare keeps it (compare_records.records_for)."""
    tokens = sum(accept)
    return {"id": str(i), "category": category, "slot": 0, "turns": 1, "prompt_tokens": [10], "new_tokens": tokens,
            "turn_new_tokens": [tokens], "steps": len(accept), "mean_accept_length": tokens / len(accept),
            "accept_lengths": accept, "draft_sizes": [4] * len(accept), "draft_depths": [3] * len(accept),
            "prefill_token": 1, "seconds": seconds, "turn_seconds": [seconds], "baseline_new_tokens": tokens,
            "baseline_seconds": 2.0, "identical_to_baseline": identical, "first_mismatch": None,
            "phase_seconds": {**PHASES, "total": seconds} if timed else None}  # fmt: skip


def entry(name: str, records: list[dict], depth: int, settings: dict) -> dict:
    return method_entry(name, name, SimpleNamespace(max_depth=depth, settings=lambda: settings), records)


def results(methods: dict[str, list[dict]], source: str, depth: int = 3, tree: str = "medusa-15") -> dict:
    """A results.json of `specheads compare` over these records (generate's first)."""
    entries = [
        entry(n, rs, 0 if n == "generate" else depth, {"tree": tree, "n": n}) for n, rs in methods.items()
    ]
    ids = [r["id"] for r in next(iter(methods.values()))]
    return {"baseline": "generate", "methods": entries, "order": [{"id": i, "methods": list(methods)} for i in ids],
            "target": {"name_or_path": "t", "path": "t", "weights_fingerprint": "w"},
            "prompts": {"source": source, "path": source, "chat_template": True, "prompt_tokens": 64,
                        "category": None, "max_turns": 2, "num_prompts": len(ids), "turns": len(ids), "skipped": []},
            "max_new_tokens": 256, "temperature": 0.0, "warmup": 1, "device": "cpu", "dtype": "float32",
            "attn_implementation": "sdpa", "threads": 1, "platform": "x",
            "versions": {"torch": "2", "transformers": "5", "specheads": "0.1"}, "command": f"specheads compare {source}",
            "definitions": {}, "answers": {"medusa": "answers/medusa.jsonl"}, "plots": {"accept": "accept.png"}}  # fmt: skip


def halves():
    a = {
        "generate": [record(0, "writing", [1] * 6, 3.0), record(1, "math", [1] * 5, 2.5)],
        "medusa": [record(0, "writing", [3, 2, 1], 1.0), record(1, "math", [4, 1], 0.8, identical=False)],
    }
    b = {"generate": [record(2, "writing", [1] * 4, 2.0)], "medusa": [record(2, "writing", [2, 2], 0.5)]}  # fmt: skip
    return a, b


def test_the_merge_is_what_one_run_over_all_the_prompts_reports():
    a, b = halves()
    merged = merge_compare.merge([results(a, "A"), results(b, "B")])
    whole = results({n: a[n] + b[n] for n in a}, "A + B")
    assert merged["methods"] == whole["methods"]  # every figure, per category and per prompt too
    medusa = merged["methods"][1]
    assert medusa["identical_to_baseline"] == "2/3" and medusa["num_prompts"] == 3
    assert medusa["mean_accept_length"] == pytest.approx(15 / 7)
    assert set(medusa["per_category"]) == {"writing", "math"}
    assert merged["prompts"]["num_prompts"] == 3 and merged["prompts"]["source"] == "A + B"
    assert [o["id"] for o in merged["order"]] == ["0", "1", "2"]
    assert merged["plots"] == {} and merged["answers"] == {}  # none are drawn or written for the merge


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r["methods"][1]["settings"].update(tree="medusa-63"), "medusa ran with other settings"),
        (lambda r: r["methods"].pop(), "other methods"),
        (lambda r: r.update(max_new_tokens=128), "differ in max_new_tokens"),
        (lambda r: r["target"].update(weights_fingerprint="v"), "different target weights"),
    ],
)
def test_runs_that_are_not_halves_of_one_comparison_are_refused(change, message):
    a, b = halves()
    other = results(b, "B")
    change(other)
    with pytest.raises(ValueError, match=message):
        merge_compare.merge([results(a, "A"), other])


def test_writes_compare_s_report_and_compact_results_without_the_records_unless_asked(tmp_path):
    a, b = halves()
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, r in zip(paths, [results(a, "A"), results(b, "B")]):
        path.write_text(json.dumps(r))
    out = tmp_path / "merged"
    assert merge_compare.main([*map(str, paths), "--out", str(out)]) == 0
    text = (out / "results.json").read_text()
    assert text.count("\n") == 1 and "per_prompt" not in json.loads(text)["methods"][1]
    report = (out / "report.md").read_text()
    assert "3 prompts from `A + B`" in report and "## writing" in report and "## math" in report
    assert merge_compare.main([*map(str, paths), "--out", str(out), "--per-prompt"]) == 0
    assert len(json.loads((out / "results.json").read_text())["methods"][1]["per_prompt"]) == 3
