"""The target a user brings: `trust_remote_code` (recipe key and --trust-remote-code on train, cache, distill)
reaching the loader and named in a custom architecture's refusal; `distill --chat-template` for a base
model, recorded in the distillation's settings."""

import hashlib
import json

import pytest

from specheads.builders.tiny_target import CHAT_TEMPLATE
from specheads.cli import cache as cache_cli_module
from specheads.cli import distill as distill_cli_module
from specheads.cli import train as train_cli_module
from specheads.core.target import FrozenTarget
from specheads.data import server_distill
from specheads.data.checks import SETTINGS_FILE
from specheads.methods import methods
from specheads.train import prepare
from specheads.train.offline_target import OfflineTarget
from specheads.train.recipe import load_config

from helpers import command, without_chat_template

distill_cli, train_cli, cache_cli = command("distill"), command("train"), command("cache")

CHATS = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    [{"role": "user", "content": "One?"}],
]


@pytest.fixture
def custom_targets(tmp_path):
    """A target that ships its own modelling code (an auto_map), and one of a family transformers does
    not know."""
    shipped, unknown = tmp_path / "shipped", tmp_path / "unknown"
    for path, config in (
        (shipped, {"model_type": "acme", "auto_map": {"AutoConfig": "configuration_acme.AcmeConfig"}}),
        (unknown, {"model_type": "acme"}),
    ):
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
    return shipped, unknown


def test_a_custom_architecture_is_refused_naming_the_setting(custom_targets):
    shipped, unknown = custom_targets
    for load in (FrozenTarget.from_pretrained, OfflineTarget.from_pretrained):
        with pytest.raises(
            ValueError,
            match="(?s)custom architecture.*auto_map.*trust_remote_code: true in the recipe, or --trust-remote-code",
        ):
            load(str(shipped))
        with pytest.raises(
            ValueError,
            match="(?s)does not know its model_type 'acme'.*trust_remote_code: true.*--trust-remote-code",
        ):
            load(str(unknown))


def test_distill_refuses_a_custom_architecture_and_names_the_flag(custom_targets, tmp_path):
    rows = tmp_path / "chats.jsonl"
    rows.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))
    shipped, _ = custom_targets
    with pytest.raises(ValueError, match="--trust-remote-code"):
        distill_cli(["--source", str(rows), "--target", str(shipped), "--out", str(tmp_path / "out")])
    # through servers too: the target's configs are read here, before any server is asked
    argv = ["--server", "http://127.0.0.1:9", "--source", str(rows), "--target", str(shipped)]
    with pytest.raises(ValueError, match="--trust-remote-code"):
        distill_cli([*argv, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


class Loaded(Exception):
    """Raised by a stand-in loader once it has seen its arguments."""


def recording(seen: dict):
    def from_pretrained(path, **kwargs):
        seen.update(kwargs)
        raise Loaded

    return staticmethod(from_pretrained)


@pytest.mark.parametrize("flag", [False, True])
def test_trust_remote_code_reaches_the_loader(tmp_path, monkeypatch, flag):
    seen: dict = {}
    # distill: the flag to FrozenTarget.from_pretrained
    monkeypatch.setattr(distill_cli_module.FrozenTarget, "from_pretrained", recording(seen))
    rows = tmp_path / "chats.jsonl"
    rows.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))
    argv = ["--source", str(rows), "--target", str(tmp_path), "--out", str(tmp_path / "out")]
    with pytest.raises(Loaded):
        distill_cli([*argv, *(["--trust-remote-code"] if flag else [])])
    assert seen.pop("trust_remote_code") is flag
    # distill --server: the flag to the reading of the target's configs
    monkeypatch.setattr(
        server_distill, "target_config", lambda auto, path, name, trust: seen.update(t=trust) or _raise()
    )
    with pytest.raises(Loaded):
        distill_cli([*argv, "--server", "http://127.0.0.1:9", *(["--trust-remote-code"] if flag else [])])
    assert seen.pop("t") is flag
    # train and cache: the flag (or the recipe key) into the recipe
    configs = []
    monkeypatch.setattr(train_cli_module, "train", lambda cfg, *a, **k: configs.append(cfg) or _raise())
    monkeypatch.setattr(
        cache_cli_module, "cache_recipe", lambda cfg, *a, **k: configs.append(cfg) or _raise()
    )
    extra = ["--trust-remote-code"] if flag else []
    with pytest.raises(Loaded):
        train_cli(["recipes/tiny/medusa.yaml", f"output_dir={tmp_path / 'run'}", *extra])
    with pytest.raises(Loaded):
        cache_cli(["recipes/tiny/eagle3.yaml", "--out", str(tmp_path / "cache"), *extra])
    with pytest.raises(Loaded):
        train_cli(["recipes/tiny/medusa.yaml", f"output_dir={tmp_path / 'run'}", "trust_remote_code=true"])
    assert [c.trust_remote_code for c in configs] == [flag, flag, True]
    # the recipe's key to the loader, online and offline
    monkeypatch.setattr(prepare.FrozenTarget, "from_pretrained", recording(seen))
    monkeypatch.setattr(prepare.OfflineTarget, "from_pretrained", recording(seen))
    for mode in ("online", "offline"):
        cfg = load_config(
            None, [f"trust_remote_code={flag}", f"mode={mode}", f"cache_dir={tmp_path}"], methods=methods()
        )
        with pytest.raises(Loaded):
            prepare.load_target(cfg, str(tmp_path), "cpu")
        assert seen.pop("trust_remote_code") is flag


def _raise():
    raise Loaded


@pytest.fixture
def base_target(small_tiny_target, tmp_path):
    """The small tiny target as a base model brings it: no chat template."""
    return without_chat_template(small_tiny_target, tmp_path / "base")


def test_distill_gives_a_base_model_a_chat_template(base_target, tmp_path):
    rows = tmp_path / "chats.jsonl"
    rows.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))
    template = tmp_path / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    argv = ["--source", str(rows), "--target", str(base_target), "--max-new-tokens", "3", "--no-progress"]
    with pytest.raises(ValueError, match="(?s)no chat_template \\(a base model\\).*--chat-template FILE"):
        distill_cli([*argv, "--out", str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()  # refused before anything is written
    out = tmp_path / "out"
    assert distill_cli([*argv, "--out", str(out), "--chat-template", str(template)]) == 0
    written = [json.loads(line) for line in (out / "part-00000.jsonl").read_text().splitlines()]
    assert [row["messages"][0] for row in written] == [m[0] for m in CHATS]
    assert all(row["messages"][-1]["role"] == "assistant" for row in written)
    settings = json.loads((out / SETTINGS_FILE).read_text())
    assert settings["enable_thinking"] is None and settings["chat_template_sha256"]
    # resuming with another template is refused, naming what changed
    other = tmp_path / "other.jinja"
    other.write_text(CHAT_TEMPLATE.replace("\n", "\n\n", 1))
    with pytest.raises(ValueError, match="chat_template_sha256"):
        distill_cli([*argv, "--out", str(out), "--chat-template", str(other)])
    # --enable-thinking is refused for a template that never reads it
    with pytest.raises(ValueError, match="never reads it"):
        distill_cli(
            [
                *argv,
                "--out",
                str(tmp_path / "t"),
                "--chat-template",
                str(template),
                "--enable-thinking",
                "false",
            ]
        )
    assert not (tmp_path / "t").exists()


def test_training_gives_a_base_model_a_chat_template_and_records_it(base_target, tmp_path):
    rows = tmp_path / "chats.jsonl"
    chats = [
        [
            {"role": "user", "content": f"Count to {n}."},
            {"role": "assistant", "content": " ".join(map(str, range(n)))},
        ]
        for n in range(3, 19)
    ]
    rows.write_text("".join(json.dumps({"messages": m}) + "\n" for m in chats))
    template = tmp_path / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    out = tmp_path / "run"
    argv = [
        "recipes/tiny/medusa.yaml",
        f"target={base_target}",
        f"data={rows}",
        "eval_data=[]",
        "eval_fraction=0.25",
        "loss_on=assistant",
        "max_length=64",
        "batch_size=4",
        "medusa.num_heads=2",
        "max_steps=2",
        "warmup_steps=1",
        "eval_every=2",
        "eval_batches=1",
        "log_every=1",
        "report_to=none",
        "min_label_tokens_per_row=1",
        f"output_dir={out}",
    ]
    with pytest.raises(ValueError, match="(?s)no chat_template \\(a base model\\).*chat_template: FILE"):
        train_cli([*argv, "--no-progress"])
    assert train_cli([*argv, f"chat_template={template}", "--no-progress"]) == 0
    (launch,) = [json.loads(line) for line in (out / "provenance.jsonl").read_text().splitlines()]
    assert launch["config"]["chat_template"] == str(template) and launch["config"]["reasoning"] == "keep"
    assert launch["config"]["enable_thinking"] is None
    assert launch["chat_template_sha256"] == hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()
