"""benchmarks/records.py, the module the run records share, and the records' layout: folders named by topic
and date, large JSON kept compressed, assemble scripts that import only this module (never each other)."""

import ast
import gzip
import re

import pytest

from benchmarks import records


def test_json_round_trips_plain_when_small_and_compressed_when_large(tmp_path):
    small = records.write_json(tmp_path / "small.json", {"a": 1})
    assert small.name == "small.json" and records.read_json(tmp_path / "small.json.gz") == {"a": 1}
    big = {"rows": list(range(records.GZIP_OVER))}
    written = records.write_json(tmp_path / "big.json", big)
    assert written.name == "big.json.gz" and not (tmp_path / "big.json").exists()
    assert records.read_json(tmp_path / "big.json") == big == records.read_json(written)
    # no name or time in the gzip header: the same record gives the same bytes
    again = records.write_json(tmp_path / "big.json", big)
    assert again.read_bytes() == written.read_bytes() and gzip.decompress(written.read_bytes())[:1] == b"{"
    # a record that shrinks back under the limit replaces its compressed spelling
    records.write_json(tmp_path / "big.json.gz", {"rows": []})
    assert not written.exists() and records.read_json(tmp_path / "big.json") == {"rows": []}
    with pytest.raises(FileNotFoundError, match="missing.json"):
        records.read_json(tmp_path / "missing.json")


def test_record_dir_finds_one_record_by_topic_and_slug():
    assert records.record_dir("eagle3-smollm2", "mt80").name == "2026-12-06-mt80"
    with pytest.raises(FileNotFoundError, match="give the slug of one record"):
        records.record_dir("eagle3-smollm2", "init")  # two records of that slug
    assert records.record_dir("eagle3-smollm2", "init", latest=True).name == "2026-12-06-init"


def test_the_five_seed_line_gives_the_recorded_comparison():
    """mt80_line over the record's runs reproduces the paired figures the record stored."""
    runs = records.mt80_runs()
    stored = records.read_json(records.record_dir("eagle3-smollm2", "mt80") / "runs.json")["paired"]["mt80"]
    ours = records.mt80_line([f"ours-t15-s{s}" for s in range(5)], runs)
    theirs = records.mt80_line([f"modelopt-s{s}" for s in range(5)], runs)
    assert records.paired(ours, theirs) == stored


def test_records_are_named_by_topic_and_date():
    for topic in records.RECORDS.iterdir():
        if topic.is_file():
            assert topic.suffix == ".md", topic
            continue
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", topic.name), topic
        for record in topic.iterdir():
            if record.is_file():
                assert record.name == "README.md", record
            else:
                assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9]+(-[a-z0-9]+)*", record.name), record


def test_large_json_records_are_compressed():
    plain = [p for p in records.RECORDS.rglob("*.json") if p.stat().st_size > records.GZIP_OVER]
    assert not plain, f"gzip these (records.write_json does): {plain}"


def test_assemble_scripts_share_records_and_never_import_each_other():
    scripts = sorted(records.RECORDS.rglob("*.py"))
    assert scripts
    for script in scripts:
        tree = ast.parse(script.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                assert not module.startswith("benchmarks") or module in (
                    "benchmarks.records",
                    "benchmarks.bench_trainers_modelopt",
                ), (script, module)
                assert module.split(".")[0] not in ("assemble", "scripts", "bench_trainers_paired"), (
                    script,
                    module,
                )
            if isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] not in ("assemble",) for a in node.names), script
        text = script.read_text()
        assert (
            'sys.path.insert(0, "scripts")' not in text and "HERE.parent /" not in text.split("sys.path")[0]
        )
