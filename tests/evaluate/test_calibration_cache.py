"""`--tree auto` calibrates once per machine: a later run with the same heads, target, prompts and settings
takes the kept choice (evaluate/calibration_cache.py); anything else, `--recalibrate` or an unreadable file
measures again."""

import json
import shutil

import pytest
import torch
from test_tree_auto_cli import eval_args, make_setup, timings_favouring

from specheads.cli import main as cli
from specheads.decode.calibrate import CalibrationSettings
from specheads.evaluate import calibrate as calibrate_module
from specheads.evaluate import calibration_cache
from specheads.evaluate.calibration_cache import calibration_key, calibrations_dir, tensors_sha256
from specheads.heads import load_heads
from specheads.methods import methods

from helpers import edit_weights

pytestmark = pytest.mark.usefixtures("one_thread")
AUTO = ["--tree", "auto", "--calibration-prompts", "1"]


@pytest.fixture(scope="module")
def setup(tiny_target_dirs, tmp_path_factory) -> dict:
    return make_setup(tiny_target_dirs, tmp_path_factory)


def timed(monkeypatch, largest: bool) -> list:
    """As `timings_favouring`, and a list that grows by one each time a calibration times its trees."""
    calls = []
    fake = timings_favouring(monkeypatch, largest)

    def timer(*args):
        calls.append(1)
        return fake

    monkeypatch.setattr(calibrate_module, "measured_timer", timer)
    return calls


def run(setup, out, heads="medusa", *extra) -> dict:
    assert cli(eval_args(setup, out, heads, *AUTO, *extra)) == 0
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("heads", ["medusa", "eagle"])
def test_a_second_run_takes_the_kept_calibration_and_recalibrate_measures_again(
    setup, tmp_path, monkeypatch, capsys, heads
):
    timed(monkeypatch, largest=True)
    first = run(setup, tmp_path / "first", heads)
    assert "reused" not in first["calibration"]
    assert f"--tree auto: calibrating {heads}'s tree on 1 held-out prompts" in capsys.readouterr().out
    kept = list(calibrations_dir().glob("*.json"))
    assert len(kept) == 1

    # timed now, the smallest tree would win: a second run must not time anything
    smallest = timed(monkeypatch, largest=False)
    second = run(setup, tmp_path / "second", heads)
    assert smallest == []
    printed = capsys.readouterr().out
    assert f"--tree auto: taking the {first['tree']['name']} tree an earlier run calibrated" in printed
    assert "calibrating" not in printed
    assert second["tree"] == first["tree"]
    assert second["calibration"]["reused"]["from"] == str(kept[0])
    assert second["calibration"]["candidates"] == first["calibration"]["candidates"]
    assert second["identical_to_baseline"] == "2/2"
    assert "taken from the calibration an earlier run kept" in (tmp_path / "second" / "report.md").read_text()

    # --recalibrate measures (and chooses the smallest tree now), and replaces what was kept
    third = run(setup, tmp_path / "third", heads, "--recalibrate")
    assert smallest == [1] and "reused" not in third["calibration"]
    assert third["tree"]["nodes"] < first["tree"]["nodes"]
    assert "--recalibrate" in third["command"]
    largest = timed(monkeypatch, largest=True)
    assert run(setup, tmp_path / "fourth", heads)["tree"] == third["tree"] and largest == []


def test_other_heads_or_prompts_calibrate_afresh(setup, tmp_path, monkeypatch):
    timed(monkeypatch, largest=True)
    run(setup, tmp_path / "first")
    # the same heads with one weight changed
    other = setup["root"] / "medusa-other"
    if not other.exists():
        shutil.copytree(setup["root"] / "medusa", other)

        def nudge(weights):
            name = sorted(weights)[0]
            weights[name] = weights[name].clone()
            weights[name].view(-1)[0] += 1.0

        edit_weights(other, nudge)
    calls = timed(monkeypatch, largest=False)
    again = run(setup, tmp_path / "other-heads", "medusa-other")
    assert calls == [1] and "reused" not in again["calibration"]
    # another calibration prompt (the last two, not the last one)
    args = eval_args(setup, tmp_path / "two", "medusa", "--tree", "auto", "--calibration-prompts", "2")
    assert cli(args) == 0
    assert (
        calls == [1, 1]
        and "reused" not in json.loads((tmp_path / "two" / "results.json").read_text())["calibration"]
    )
    assert len(list(calibrations_dir().glob("*.json"))) == 3


def test_an_unreadable_calibration_is_reported_and_replaced(setup, tmp_path, monkeypatch, capsys):
    timed(monkeypatch, largest=True)
    first = run(setup, tmp_path / "first")
    (path,) = calibrations_dir().glob("*.json")
    path.write_text('{"key": ')  # a truncated file (no writer leaves one, but a disk can)
    calls = timed(monkeypatch, largest=True)
    again = run(setup, tmp_path / "again")
    assert "ignoring the unreadable calibration" in capsys.readouterr().err
    assert calls == [1] and "reused" not in again["calibration"]
    assert again["tree"] == first["tree"]
    assert json.loads(path.read_text())["calibration"]["chosen"] == again["tree"]  # replaced, whole


def test_the_key_names_every_input(setup):
    loaded = setup["loaded"]
    heads, config = load_heads(setup["root"] / "medusa", loaded, methods=methods())
    prompts = [type("P", (), {"input_ids": torch.tensor([[5, 9, 3]])})()]
    settings = CalibrationSettings()
    key = calibration_key(heads, config, loaded, prompts, settings, None)
    assert key == calibration_key(heads, config, loaded, prompts, settings, None)  # stable
    assert key["target"] == loaded.record().weights_fingerprint and key["method"] == "medusa"
    assert key["machine"]["threads"] == torch.get_num_threads() and key["machine"]["dtype"] == "torch.float32"

    def differs(**change) -> bool:
        args = {"prompts": prompts, "settings": settings, "vocab": None, **change}
        return calibration_key(heads, config, loaded, args["prompts"], args["settings"], args["vocab"]) != key

    assert differs(prompts=[type("P", (), {"input_ids": torch.tensor([[5, 9, 4]])})()])
    assert differs(settings=CalibrationSettings(max_new_tokens=64))
    assert differs(vocab=torch.arange(0, 40))
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert differs()
    finally:
        torch.set_num_threads(threads)
    before = tensors_sha256(heads)
    with torch.no_grad():
        next(heads.parameters()).view(-1)[0] += 1
    assert tensors_sha256(heads) != before
    assert calibration_cache.cache_path(key) == calibration_cache.cache_path(json.loads(json.dumps(key)))
