"""Adding a method is one module and one table entry, shipped in a distribution of its own: a toy method
(tests/methods/toy_method.py), installed here as a distribution whose entry point of the `specheads.methods`
group names its entry, trains through the real CLI in a fresh process, is saved, loaded and decoded, with
nothing of specheads changed. A plugin that cannot load is an error naming it and its distribution."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from toy_method import BIGRAM, BigramHead

import specheads
from specheads.cli import main as cli_main
from specheads.core.target import FrozenTarget
from specheads.heads import load_heads
from specheads.methods import MethodPluginError, forget_plugins, methods, register, unregister

pytestmark = pytest.mark.usefixtures("one_thread")

TOY_MODULE = Path(__file__).with_name("toy_method.py")
SRC = str(Path(specheads.__file__).resolve().parents[1])  # the specheads this suite tests
QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["abcdefghij abcdefghij abcdefghij"]},
    {"question_id": 2, "category": "coding", "turns": ["0123456789 0123456789"]},
]


def write_distribution(site: Path, name: str, entry_points: str, modules: dict[str, str]) -> Path:
    """An installed distribution in the folder `site`, as pip lays one out: its modules, and
    NAME-VERSION.dist-info with METADATA and entry_points.txt."""
    site.mkdir(parents=True, exist_ok=True)
    for module, text in modules.items():
        (site / f"{module}.py").write_text(text)
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return site


@pytest.fixture
def install(monkeypatch):
    """install(site): the distributions in `site` importable here (sys.path) and in subprocesses
    (PYTHONPATH); the method table reads the entry points afresh, here and after the test."""

    def install(site: Path) -> dict[str, str]:
        monkeypatch.syspath_prepend(str(site))
        paths = [str(site), SRC, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
        forget_plugins()
        return {**os.environ, "OMP_NUM_THREADS": "1"}

    yield install
    forget_plugins()


@pytest.fixture
def toy_site(tmp_path) -> Path:
    """The toy method's module, installed as the distribution `specheads-toy` whose entry point
    `bigram = toy_method:BIGRAM` names its entry."""
    entry_points = "[specheads.methods]\nbigram = toy_method:BIGRAM\n"
    return write_distribution(
        tmp_path / "site", "specheads-toy", entry_points, {"toy_method": TOY_MODULE.read_text()}
    )


def test_toy_method_trains_and_decodes_through_the_cli(install, toy_site, tiny_target_dirs, tmp_path):
    env = install(toy_site)
    target_dir, out = tiny_target_dirs["llama"], tmp_path / "heads"
    text_data = tmp_path / "cycles.jsonl"  # every byte determines the next ones: t + 2 is learnable
    words = ["abcdefghij", "0123456789", "klmnopqrst", "uvwxyz!?.,"]
    rows = [{"text": (words[i % 4] * 8)[i % 7 :]} for i in range(64)]
    text_data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "bigram.yaml"
    recipe.write_text(f"method: bigram\ntarget: {target_dir}\ndata: [{text_data}]\nreport_to: none\n")
    train = [str(recipe), "max_length=64", "batch_size=8", "lr=0.01", "warmup_steps=2", "max_steps=30"]
    train += ["eval_fraction=0.1", "eval_every=30", "eval_batches=2", "log_every=10", f"output_dir={out}"]
    # a fresh process: nothing registers the toy but its distribution's entry point
    argv = [sys.executable, "-m", "specheads", "train", *train, "--no-progress", "--threads", "1"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "held-out top-1 per head" in done.stdout
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in metrics if m["split"] == "train"]
    assert len(losses) == 3 and losses[-1] < 0.5 * losses[0]  # it learned the cycles' t + 2

    heads, config = load_heads(out, FrozenTarget.from_pretrained(str(target_dir)), methods=methods())
    assert isinstance(heads, BigramHead) and config["method"] == "bigram"

    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    evaluated = tmp_path / "eval"
    argv = ["eval", "--target", str(target_dir), "--heads", str(out), "--prompts", str(questions)]
    assert cli_main([*argv, "--out", str(evaluated), "--max-new-tokens", "12", "--no-progress"]) == 0
    results = json.loads((evaluated / "results.json").read_text())
    assert results["method"] == "bigram" and results["tree"]["name"] == "chain-2"
    assert results["identical_to_baseline"] == "2/2"  # lossless whatever the head guesses
    assert 1.0 <= results["mean_accept_length"] <= 2.0 and len(results["accept_rate_per_depth"]) == 1


def test_the_table_is_the_only_list_of_methods(install, toy_site):
    """The built-ins and the installed toy, in one table; recipe validation reads it."""
    from specheads.train.recipe import load_config

    assert "bigram" not in methods()  # not installed yet
    install(toy_site)
    assert list(methods()) == ["medusa", "medusa2", "eagle", "eagle3", "bigram"]
    assert methods()["bigram"] is BIGRAM
    assert load_config(None, ["method=bigram"], methods=methods()).method == "bigram"
    unregister("bigram")
    with pytest.raises(ValueError, match="method must be one of .*'eagle3'\\), got 'bigram'"):
        load_config(None, ["method=bigram"], methods=methods())
    register(BIGRAM)
    with pytest.raises(ValueError, match="already registered"):
        register(BIGRAM)


def test_a_plugin_that_cannot_load_is_an_error_naming_it(install, tmp_path, tiny_target_dirs):
    site = tmp_path / "site"
    write_distribution(site, "specheads-broken", "[specheads.methods]\nbroken = toy_missing:ENTRY\n", {})
    env = install(site)
    with pytest.raises(MethodPluginError, match="method plugin 'broken' .*distribution specheads-broken 0.1"):
        methods()
    with pytest.raises(MethodPluginError, match="ModuleNotFoundError: No module named 'toy_missing'"):
        methods()  # every read, until the distribution is fixed or removed
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"target: {tiny_target_dirs['llama']}\nreport_to: none\n")
    argv = [sys.executable, "-m", "specheads", "train", str(recipe), "--threads", "1"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert done.returncode == 1 and not done.stdout
    assert "specheads train: error: method plugin 'broken' (toy_missing:ENTRY" in done.stderr
    assert "distribution specheads-broken 0.1" in done.stderr and "fix or uninstall" in done.stderr


def test_a_plugin_entry_must_be_a_method(install, tmp_path):
    site = tmp_path / "site"
    entry_points = "[specheads.methods]\nnot-one = toy_other:ENTRY\n"
    write_distribution(site, "specheads-other", entry_points, {"toy_other": "ENTRY = {'name': 'x'}\n"})
    install(site)
    with pytest.raises(MethodPluginError, match="'not-one' .*specheads-other 0.1.* loads to a dict, not a"):
        methods()


def test_a_plugin_may_not_take_a_built_in_name(install, tmp_path):
    site = tmp_path / "site"
    module = "import dataclasses\n\nfrom toy_method import BIGRAM\n\nAGAIN = dataclasses.replace(BIGRAM, name='medusa')\n"
    write_distribution(
        site, "specheads-clash", "[specheads.methods]\nmedusa = toy_clash:AGAIN\n", {"toy_clash": module}
    )
    install(site)
    with pytest.raises(
        MethodPluginError, match="'medusa' .*specheads-clash 0.1.* already registered; rename it"
    ):
        methods()
