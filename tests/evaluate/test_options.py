"""`eval` and `compare` split alike: the commands parse argv into typed options (evaluate/options.py) and
call one library function each; nothing below cli/ takes an argparse.Namespace, and the library runs
without the command line."""

import argparse
import ast
import dataclasses
import json
from pathlib import Path

import pytest
from test_tree_auto_cli import make_setup

from specheads.cli import compare as compare_command
from specheads.cli import eval as eval_command
from specheads.evaluate.compare import compare_heads
from specheads.evaluate.options import CompareOptions, EvalOptions
from specheads.evaluate.run import run_eval
from specheads.methods import methods

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "specheads"


def library_sources() -> list[Path]:
    """Every module below the cli floor (a package's __main__.py is a program: the cli floor's)."""
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.relative_to(PACKAGE).parts[0] != "cli" and p.name != "__main__.py"
    ]


def argparse_uses(path: Path) -> list[str]:
    """Where `path` imports argparse or names its Namespace (an annotation, a default, a call)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "argparse" for a in node.names):
            found.append(f"{path.name}:{node.lineno}: import argparse")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "argparse":
            found.append(f"{path.name}:{node.lineno}: from argparse import")
        elif isinstance(node, ast.Attribute) and node.attr == "Namespace":
            found.append(f"{path.name}:{node.lineno}: .Namespace")
        elif isinstance(node, ast.Name) and node.id == "Namespace":
            found.append(f"{path.name}:{node.lineno}: Namespace")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "argparse.Namespace" in node.value
        ):
            found.append(f"{path.name}:{node.lineno}: 'argparse.Namespace' (a string annotation)")
    return found


def test_no_module_below_cli_imports_argparse_or_takes_a_namespace():
    sources = library_sources()
    assert len(sources) > 80 and PACKAGE / "evaluate" / "compare.py" in sources
    assert [use for path in sources for use in argparse_uses(path)] == []


def test_the_scan_finds_a_namespace(tmp_path):
    code = "from __future__ import annotations\nimport argparse\ndef f(args: argparse.Namespace): ...\n"
    (tmp_path / "m.py").write_text(code)
    assert argparse_uses(tmp_path / "m.py") == ["m.py:2: import argparse", "m.py:3: .Namespace"]
    (tmp_path / "s.py").write_text("def f(args: 'argparse.Namespace'): ...\n")
    assert len(argparse_uses(tmp_path / "s.py")) == 1


@pytest.mark.parametrize(
    "command, options",
    [(eval_command, EvalOptions), (compare_command, CompareOptions)],
    ids=["eval", "compare"],
)
def test_one_field_per_flag_with_the_flags_defaults(command, options):
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    flags = {a.dest: a for a in parser._actions if a.dest != "help"}
    fields = {f.name: f for f in dataclasses.fields(options)}
    assert set(flags) == set(fields)
    for name, field in fields.items():
        if flags[name].required:
            assert field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING, name
            continue
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        assert flags[name].default == default, name


@pytest.fixture(scope="module")
def setup(tiny_target_dirs, tmp_path_factory) -> dict:
    return make_setup(tiny_target_dirs, tmp_path_factory)


def test_run_eval_from_python(setup, tmp_path, capsys):
    options = EvalOptions(
        target=setup["target"],
        heads=setup["root"] / "medusa",
        prompts=setup["questions"],
        out=tmp_path / "eval",
        tree="chain-4",
        num_prompts=2,
        max_new_tokens=8,
        warmup=0,
        no_progress=True,
    )
    results = run_eval(options, methods())
    assert json.loads(json.dumps(results)) == json.loads((options.out / "results.json").read_text())
    assert results["method"] == "medusa" and results["tree"]["name"] == "chain-4"
    assert results["identical_to_baseline"] == "2/2" and len(results["per_prompt"]) == 2
    assert results["command"].startswith(f"specheads eval --target {setup['target']} --heads ")
    assert sorted(p.name for p in options.out.iterdir()) == ["report.md", "results.json"]
    assert options.tree == "chain-4" and options.overwrite is False  # the caller's options are not changed
    assert capsys.readouterr().out == ""  # the command prints the report; the library does not


def test_compare_heads_from_python(setup, tmp_path):
    options = CompareOptions(
        target=setup["target"],
        heads=[setup["root"] / "medusa"],
        prompts=setup["questions"],
        out=tmp_path / "compare",
        peers="generate",
        tree=["chain-4"],
        num_prompts=1,
        max_turns=1,
        max_new_tokens=8,
        warmup=0,
        no_plots=True,
        no_progress=True,
    )
    results = compare_heads(options, methods())
    assert json.loads(json.dumps(results)) == json.loads((options.out / "results.json").read_text())
    assert [m["name"] for m in results["methods"]] == ["generate", "medusa"]
    assert results["prompts"]["num_prompts"] == 1 and results["prompts"]["turns"] == 1
    assert all(m["identical_to_baseline"] == "1/1" for m in results["methods"])
