"""`specheads distill --server`: distillation through a real OpenAI-compatible server (`transformers serve`,
from PyPI's transformers[serving], started here on loopback ports), against the in-process path."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import datasets
import pytest

from specheads.core.target import FrozenTarget
from specheads.data import load_rows, tokenize_rows
from specheads.data.distill_folder import is_complete
from specheads.data.distillation import DistillConfig, distill
from specheads.data.server_distill import ServerMismatchError, ServerTarget, ServerUnavailable

from helpers import command, save_tiny_target

distill_cli = command("distill")
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # slow: CI's second stage

STARTUP_S = 600  # `transformers serve` can take minutes to start on a busy 2-core machine
QUESTIONS = ["def add(a, b):", "Hi", "import os", "class Point:", "print(1)", "x = [", "# sort a list"]
CHATS = [[{"role": "user", "content": q}] for q in QUESTIONS] + [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "One?"},
        {"role": "assistant", "content": "1"},
        {"role": "user", "content": "Two?"},
        {"role": "assistant", "content": "2"},
    ],
    [{"role": "user", "content": "too long " * 40}],  # 360 tokens: does not fit the 256 positions, fails
]
GREEDY = DistillConfig(max_new_tokens=12, chunk_rows=3, batch_size=2, max_bad_rows=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """`transformers serve DIR` on a free loopback port, in a process group of its own."""

    def __init__(self, model_dir: Path, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log, self.model_dir = log, model_dir
        argv = [
            sys.executable,
            "-m",
            "transformers.cli.transformers",
            "serve",
            str(model_dir),
        ]  # PyPI transformers[serving]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu", "--dtype", "float32"]
        # continuous batching, its KV cache sized for the tests (by default it takes gigabytes of memory)
        argv += [
            "--continuous-batching",
            "--cb-block-size",
            "16",
            "--cb-num-blocks",
            "256",
            "--log-level",
            "warning",
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the server exited ({self.process.returncode}):\n{self.log.read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise TimeoutError(f"the server did not start in {STARTUP_S} s:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


@contextmanager
def served(model_dir: Path, log: Path):
    """A started server, killed (its whole process group) on the way out."""
    server = Served(model_dir, log)
    try:
        server.wait_ready(time.monotonic() + STARTUP_S)
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def tiny_server(small_tiny_target, tmp_path_factory):
    with served(small_tiny_target, tmp_path_factory.mktemp("server") / "serve.log") as server:
        yield server


def chat_rows(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))
    return load_rows(path, cache_dir=tmp_path / "hf-cache")


def parts(out) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(out).glob("part-*.jsonl"))}


COUNTS = ("read", "written", "skipped", "failed", "new_tokens", "unfinished", "output_rows", "output_capped")


@pytest.fixture(scope="module")
def in_process(small_tiny_target, tmp_path_factory):
    """The rows and summary of in-process distillation of CHATS with GREEDY."""
    tmp = tmp_path_factory.mktemp("in-process")
    target = FrozenTarget.from_pretrained(small_tiny_target)
    summary = distill(chat_rows(tmp), target, tmp / "out", GREEDY, progress=False)
    return tmp / "out", summary


def test_server_rows_and_counts_equal_in_process_rows(tiny_server, small_tiny_target, in_process, tmp_path):
    target = ServerTarget.connect(str(small_tiny_target), [tiny_server.url], concurrency=4)
    assert (
        target.pool.servers[0].dialect == "text"
    )  # transformers serve takes no token ids (module docstring)
    try:
        summary = distill(chat_rows(tmp_path), target, tmp_path / "out", GREEDY, progress=False)
    finally:
        target.close()
    local_out, local = in_process
    assert {k: summary[k] for k in COUNTS} == {k: local[k] for k in COUNTS}
    assert summary["read"] == summary["written"] + summary["failed"] == len(CHATS) and summary["failed"] == 1
    assert summary["failures"] == local["failures"] and "does not fit" in summary["failures"][0]["why"]
    assert summary["new_tokens"] > 0 and summary["parts"] == local["parts"] == 3
    for k in range(summary["parts"]):  # per part: the same rows, and the same record of them
        record = json.loads((tmp_path / "out" / "_chunks" / f"{k:05d}.json").read_text())
        assert record == json.loads((local_out / "_chunks" / f"{k:05d}.json").read_text())
        assert record["read"] == record["written"] + record["failed"]
    assert parts(tmp_path / "out") == parts(local_out)
    # the rows train alike: the same token ids and the same loss masks
    tok = target.tokenizer
    served, own = (load_rows(d, cache_dir=tmp_path / "hf-cache") for d in (tmp_path / "out", local_out))
    for loss_on in ("assistant", "last_assistant"):
        a, b = (tokenize_rows(r, tok, max_length=256, loss_on=loss_on) for r in (served, own))
        assert a["input_ids"] == b["input_ids"] and a["loss_mask"] == b["loss_mask"]
        assert all(any(m) for m in a["loss_mask"])


def test_a_served_answer_trains_as_the_same_tokens_generated_in_process(tiny_server, small_tiny_target):
    """One row built both ways from one answer: the server's text, and the tokens generate() wrote."""
    from specheads.data.distillation import end_token_ids, generate_batch

    local = FrozenTarget.from_pretrained(small_tiny_target)
    tok = local.tokenizer
    target = ServerTarget.connect(str(small_tiny_target), [tiny_server.url], concurrency=1)
    prompt = [{"role": "user", "content": "def add(a, b):"}]
    ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
    cfg = DistillConfig(max_new_tokens=20)
    answer = target._answer(list(ids), cfg, seed=0)
    target.close()
    ends = end_token_ids(local.model, tok)
    ((tokens, ended),) = generate_batch(
        local.model, [ids], cfg, pad_id=tok.pad_token_id, end_ids=ends, seed=0
    )
    assert (answer.tokens, answer.ended) == (len(tokens), ended)
    rows = [
        {"messages": [*prompt, {"role": "assistant", "content": text}]}
        for text in (answer.text, tok.decode(tokens, skip_special_tokens=True))
    ]
    a, b = tokenize_rows(datasets.Dataset.from_list(rows), tok, max_length=256).to_list()
    assert a["input_ids"] == b["input_ids"] and a["loss_mask"] == b["loss_mask"] and any(a["loss_mask"])
    assert a["input_ids"][: len(ids)] == list(ids)  # the prompt the server answered is the one rendered here


def test_servers_share_the_prompts_and_the_command_line_takes_them(
    tiny_server, small_tiny_target, in_process, tmp_path, capsys, monkeypatch
):
    answered = []
    real = ServerTarget._read

    def spy(self, server, response, ids):
        answered.append(server.url)
        return real(self, server, response, ids)

    monkeypatch.setattr(ServerTarget, "_read", spy)
    rows = tmp_path / "chats.jsonl"
    rows.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))
    url = tiny_server.url
    out = tmp_path / "out"
    argv = ["--source", str(rows), "--target", str(small_tiny_target), "--out", str(out), "--no-progress"]
    argv += ["--max-new-tokens", "12", "--chunk-rows", "3", "--batch-size", "2", "--max-bad-rows", "1"]
    argv += ["--server", url, "--server", f"{url}/v1", "--concurrency", "1", "--skip-long"]
    assert distill_cli(argv) == 0
    printed = capsys.readouterr().out
    assert "read 8 prompts = written 8 + skipped 0 (done before) + failed 0" in printed
    assert "left out 1 prompts that cannot fit" in printed
    assert set(answered) == {url, f"{url}/v1"}  # both took requests
    assert len(answered) == 9  # 8 conversations, one with two answers
    # the rows of the in-process run, the too-long conversation left out rather than failed
    local_rows = [json.loads(line) for p in parts(in_process[0]).values() for line in p.decode().splitlines()]
    served = [json.loads(line) for p in parts(out).values() for line in p.decode().splitlines()]
    assert served == local_rows
    assert distill_cli(argv) == 0  # finished: resumed, nothing left to do
    assert "read 8 prompts = written 0 + skipped 8" in capsys.readouterr().out


def test_a_killed_server_loses_nothing_and_the_rerun_completes_the_rows(
    tiny_server, small_tiny_target, in_process, tmp_path, monkeypatch
):
    with served(small_tiny_target, tmp_path / "doomed.log") as doomed:
        out = _distill_until_the_server_dies(
            doomed, small_tiny_target, chat_rows(tmp_path), tmp_path, monkeypatch
        )
    assert not is_complete(out) and list(parts(out)) == ["part-00000.jsonl"]  # chunk 1 not half-written
    assert sorted(p.name for p in (out / "_chunks").iterdir()) == ["00000.json"]
    # rerun with a server that answers: the finished chunk is kept, the rest written
    target = ServerTarget.connect(str(small_tiny_target), [tiny_server.url], concurrency=2)
    try:
        summary = distill(chat_rows(tmp_path), target, out, GREEDY, progress=False)
    finally:
        target.close()
    assert (summary["read"], summary["skipped"]) == (len(CHATS), GREEDY.chunk_rows)
    assert summary["read"] == summary["written"] + summary["skipped"] + summary["failed"]
    assert parts(out) == parts(in_process[0])  # what an uninterrupted run writes (in-process, and served)


def _distill_until_the_server_dies(doomed, small_tiny_target, rows, tmp_path, monkeypatch):
    real, answered = ServerTarget._read, []

    def kill_during_chunk_1(self, server, response, ids):
        answered.append(1)
        if len(answered) == GREEDY.chunk_rows + 1:  # the first answer of chunk 1 is in: the server dies
            doomed.kill()
        return real(self, server, response, ids)

    target = ServerTarget.connect(str(small_tiny_target), [doomed.url], concurrency=2, retries=2)
    target.pool.backoff = 0.05
    with monkeypatch.context() as m:
        m.setattr(ServerTarget, "_read", kill_during_chunk_1)
        with pytest.raises(
            ServerUnavailable, match=rf"(?s)no server answers \({doomed.url}: .*run the same command again"
        ):
            distill(rows, target, tmp_path / "out", GREEDY, progress=False)
    target.close()
    return tmp_path / "out"


def test_a_server_that_dies_beside_another_leaves_its_prompts_to_it(
    tiny_server, small_tiny_target, in_process, tmp_path, monkeypatch
):
    real, answered = ServerTarget._read, []
    with served(small_tiny_target, tmp_path / "doomed.log") as doomed:

        def kill_after_two(self, server, response, ids):
            answered.append(server.url)
            if server.url == doomed.url and answered.count(doomed.url) == 2:
                doomed.kill()
            return real(self, server, response, ids)

        target = ServerTarget.connect(str(small_tiny_target), [doomed.url, tiny_server.url], concurrency=1)
        target.pool.backoff = 0.05
        monkeypatch.setattr(ServerTarget, "_read", kill_after_two)
        try:
            summary = distill(chat_rows(tmp_path), target, tmp_path / "out", GREEDY, progress=False)
        finally:
            target.close()
    assert answered.count(doomed.url) == 2 and target.pool.servers[0].dead is not None
    assert target.pool.servers[1].dead is None and answered.count(tiny_server.url) == len(answered) - 2
    assert summary["read"] == summary["written"] + summary["failed"] == len(CHATS)
    assert parts(tmp_path / "out") == parts(in_process[0])


def test_a_server_serving_another_model_is_refused(tiny_server, small_tiny_target, tmp_path):
    with served(save_tiny_target("llama", tmp_path / "other-model"), tmp_path / "other.log") as other:
        _refused(tiny_server, other, small_tiny_target)


def _refused(tiny_server, other, small_tiny_target):
    with pytest.raises(
        ServerMismatchError, match=rf"server {other.url} serves '.*other-model', not the target"
    ):
        ServerTarget.connect(str(small_tiny_target), [tiny_server.url, other.url])
    # named as the target's, it still fails the probe: its tokenizer is another one
    with pytest.raises(
        ServerMismatchError,
        match=rf"server {other.url} serves '.*other-model', whose tokenizer is not the target's",
    ):
        ServerTarget.connect(str(small_tiny_target), [other.url], served_model=str(other.model_dir))


def test_a_server_that_does_not_answer_is_named(small_tiny_target):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerUnavailable, match=f"server {url} does not answer GET /v1/models"):
        ServerTarget.connect(str(small_tiny_target), [url])
