"""docs/results.md is what benchmarks/build_results.py makes of the run records: rebuilt here, it matches the
committed page byte for byte (a record or the builder changed without the page, or the page by hand, fails)."""

from benchmarks import build_results


def test_results_page_is_built_from_the_records():
    committed = build_results.PAGE.read_bytes().decode()
    assert build_results.build() == committed, "run: python -m benchmarks.build_results"


def test_check_mode_tells_a_stale_page(tmp_path, capsys):
    page = tmp_path / "results.md"
    assert build_results.main(["--out", str(page)]) == 0
    assert build_results.main(["--out", str(page), "--check"]) == 0
    page.write_text(page.read_text().replace("1.721", "1.722"))
    assert build_results.main(["--out", str(page), "--check"]) == 1
    assert "python -m benchmarks.build_results" in capsys.readouterr().err


def test_every_table_names_its_records_machine_and_command():
    page = build_results.build()
    tables = page.split("\n## ")[1:]
    assert len(tables) == 2
    for section in tables:
        assert "benchmarks/records/" in section and "Reproduce" in section
        assert "core" in section  # the machine: "2-core Intel Xeon ..."
    assert page.count("python -m benchmarks.bench_trainers ") == 2 and "specheads quickstart" in page
