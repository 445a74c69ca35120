"""Named targets (builders/named_targets.py): one resolver for every command that takes a target; the
manifest that records which weights a built target holds (core/manifest.py)."""

from __future__ import annotations

import subprocess
import sys

from specheads.builders import named_targets
from specheads.builders.named_targets import NAMED_TARGETS, resolve_target
from specheads.core import manifest


def test_unnamed_targets_pass_through(tmp_path):
    for name in (str(tmp_path), "meta-llama/Llama-3.1-8B", "./relative/dir", "tiny-llama"):
        assert resolve_target(name) == name


def test_tiny_is_the_embedded_build(monkeypatch, tmp_path):
    import specheads.builders.tiny_target as tiny_target

    calls = []

    def fake_ensure(progress=True):
        calls.append(progress)
        return tmp_path / "tiny", {}, True

    monkeypatch.setattr(tiny_target, "ensure_tiny_target", fake_ensure)
    assert resolve_target("tiny", progress=False) == str(tmp_path / "tiny")
    assert calls == [False]


def test_every_command_resolves_through_the_one_table():
    # The old copies (train/loop.py resolve_target, train/sources.py target_path) are gone; the train
    # loop, the cache, distill, eval, compare, export and import all call this one.
    import specheads.cli.distill as distill
    import specheads.cli.export as export
    import specheads.cli.import_heads as import_heads
    import specheads.evaluate.compare as compare
    import specheads.evaluate.run as evaluate
    import specheads.train.loop as loop
    import specheads.train.recipe_cache as recipe_cache
    import specheads.train.sources as sources

    for module in (compare, distill, evaluate, export, import_heads, recipe_cache, loop, sources):
        assert module.resolve_target is named_targets.resolve_target, module.__name__
    assert not hasattr(sources, "target_path")
    assert set(NAMED_TARGETS) == {"tiny", "smollm2"}


def test_heads_does_not_import_train_to_resolve():
    # importing the resolver must not pull in train/ or decode/ (building a target imports its builder,
    # at call time).
    code = (
        "import sys, specheads.builders.named_targets; "
        "print(sorted(m for m in sys.modules if m.startswith(('specheads.train', 'specheads.decode'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_records_carry_which_weights(tmp_path):
    import json
    import warnings

    import pytest

    from specheads.core.target import TargetRecord

    (tmp_path / manifest.MANIFEST_FILE).write_text(json.dumps({"weights_sha256": "ab" * 32}))
    assert manifest.weights_id(str(tmp_path)) == "sha256:" + "ab" * 32
    assert manifest.weights_id(str(tmp_path / "nothing")) is None

    class HubConfig:
        _commit_hash = "c0ffee"

    assert manifest.weights_id("org/model", HubConfig()) == "hub:org/model@c0ffee"

    fields = dict(
        name_or_path="x", model_type="llama", vocab_size=8, vocab_hash=None, hidden_size=4, num_layers=1
    )
    old = TargetRecord.from_dict(fields)  # a checkpoint written before weights_id was recorded
    assert old.weights_id is None
    trained = TargetRecord(**fields, weights_id="sha256:" + "ab" * 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trained.check_matches(old)  # unknown on one side: nothing to say
    with pytest.warns(UserWarning, match="trained against weights sha256:abab"):
        trained.check_matches(TargetRecord(**fields, weights_id="hub:org/model@c0ffee"))
