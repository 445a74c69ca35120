"""`eval` and `compare` with --chat-template (a base model's prompts rendered as chat turns),
--enable-thinking and --trust-remote-code: what reaches the tokenizer and the loader, and what the
results record."""

import hashlib
import json
import logging

import pytest

from specheads.builders.tiny_target import CHAT_TEMPLATE
from specheads.core.target import FrozenTarget
from specheads.evaluate import run as run_module
from specheads.evaluate.options import EvalOptions
from specheads.evaluate.run import run_eval
from specheads.methods import methods

from helpers import command, without_chat_template

eval_cli, compare_cli = command("eval"), command("compare")


@pytest.fixture(scope="module")
def base_setup(compare_setup, tmp_path_factory):
    root = tmp_path_factory.mktemp("base")
    template = root / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    base = without_chat_template(compare_setup["target"], root / "base")
    assert FrozenTarget.from_pretrained(str(base)).tokenizer.chat_template is None
    return {**compare_setup, "base": base, "template": template}


def common(setup, out):
    return ["--prompts", str(setup["questions"]), "--out", str(out), "--num-prompts", "1"]


def test_eval_renders_a_base_models_prompts_with_the_given_template(base_setup, tmp_path, caplog):
    s = base_setup
    args = ["--target", str(s["base"]), "--heads", str(s["root"] / "medusa"), "--max-new-tokens", "4"]
    args += ["--warmup", "0", "--tree", "chain-3", "--no-progress"]
    with caplog.at_level(logging.WARNING, logger="specheads.evaluate.prompts"):
        assert eval_cli([*args, *common(s, tmp_path / "raw")]) == 0
    assert "no chat template (a base model)" in caplog.text and "--chat-template FILE" in caplog.text
    raw = json.loads((tmp_path / "raw" / "results.json").read_text())
    assert raw["prompts"]["chat_template"] is False  # a base model's questions go as raw text
    assert raw["prompts"]["chat_template_file"] is None and raw["prompts"]["chat_template_sha256"] is None

    assert eval_cli([*args, *common(s, tmp_path / "chat"), "--chat-template", str(s["template"])]) == 0
    chat = json.loads((tmp_path / "chat" / "results.json").read_text())
    prompts = chat["prompts"]
    assert prompts["chat_template"] is True and prompts["chat_template_file"] == str(s["template"])
    assert prompts["chat_template_sha256"] == hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()
    assert prompts["enable_thinking"] is None
    # the same prompt as the templated target's own: its tokens are the template's render
    tokenizer = FrozenTarget.from_pretrained(str(s["target"])).tokenizer
    question = json.loads(s["questions"].read_text().splitlines()[0])["turns"][0]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    expected = len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    assert [r["prompt_tokens"] for r in chat["per_prompt"]] == [expected]
    assert chat["identical_to_baseline"] == "1/1"
    assert f"--chat-template {s['template']}" in chat["command"]
    # a wrong path fails before anything loads, naming the setting
    with pytest.raises(FileNotFoundError, match="chat_template .*: no such file"):
        eval_cli([*args, *common(s, tmp_path / "bad"), "--chat-template", str(tmp_path / "none.jinja")])


def test_compare_renders_a_base_models_prompts_with_the_given_template(base_setup, tmp_path):
    s = base_setup
    args = ["--target", str(s["base"]), "--heads", str(s["root"] / "medusa"), "--max-new-tokens", "4"]
    args += ["--warmup", "0", "--tree", "chain-3", "--no-progress", "--no-plots", "--peers", "generate"]
    assert compare_cli([*args, *common(s, tmp_path / "chat"), "--chat-template", str(s["template"])]) == 0
    results = json.loads((tmp_path / "chat" / "results.json").read_text())
    assert results["prompts"]["chat_template"] is True
    assert results["prompts"]["chat_template_sha256"] == hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()
    assert f"--chat-template {s['template']}" in results["command"]


class Loaded(Exception):
    """Raised by the stand-in loader once it has seen its arguments."""


@pytest.mark.parametrize("flag", [False, True])
def test_trust_remote_code_reaches_the_loader(base_setup, tmp_path, monkeypatch, flag):
    seen = {}

    def from_pretrained(path, **kwargs):
        seen.update(kwargs)
        raise Loaded

    monkeypatch.setattr(run_module.FrozenTarget, "from_pretrained", staticmethod(from_pretrained))
    s = base_setup
    options = EvalOptions(
        target=str(s["base"]),
        heads=str(s["root"] / "medusa"),
        prompts=str(s["questions"]),
        out=tmp_path / "out",
        tree="chain-3",
        trust_remote_code=flag,
    )
    with pytest.raises(Loaded):
        run_eval(options, methods())
    assert seen["trust_remote_code"] is flag
    seen.clear()
    argv = ["--target", str(s["base"]), "--prompts", str(s["questions"]), "--out", str(tmp_path / "c")]
    with pytest.raises(Loaded):
        compare_cli([*argv, "--peers", "generate", *(["--trust-remote-code"] if flag else [])])
    assert seen["trust_remote_code"] is flag
