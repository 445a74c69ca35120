"""`specheads quickstart` end to end on a minimal budget: target, heads, one comparison, one table."""

import json

from specheads.cli import main as cli_main

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
    for plot in results["plots"].values():
        assert (out / "compare" / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A second run reuses the target, the draft and the heads.
    assert cli_main(argv) == 0
    printed = capsys.readouterr().out
    assert "tiny target reused" in printed and "tiny draft reused" in printed
    assert all(f"reusing {method} heads" in printed for method in METHODS)
