"""`specheads distill --server URL`: self-distillation through OpenAI-compatible servers.

    vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8000            # one or more, anywhere
    specheads distill --source sharegpt.jsonl --target meta-llama/Llama-3.1-8B-Instruct --out data/sd \\
        --server http://host-a:8000 --server http://host-b:8000 --concurrency 32

The same output folder, resuming, accounting (`read = written + skipped + failed`, per part) and
failures as the in-process path (data/distillation.py), whose code builds every prompt and every row:
only the answers come from the servers. The target is not loaded here: its tokenizer, chat template,
config and generation config are read from --target.

How a prompt is sent, and why: the conversation so far is rendered by the target's chat template with
add_generation_prompt=True, exactly as the in-process path renders it (the same token ids), and sent raw
to `/v1/completions`; never to `/v1/chat/completions`, where the server's own template (or its
defaults: a system prompt, a reasoning switch) could render other tokens than the training masks
expect. The rows hold text, and training renders that text again through the same template, so an
answer that is the same text gives the same token ids and loss masks whichever way it was written.
Each server is probed once, and speaks one of:

    token ids   `prompt` is the list of token ids (vLLM, SGLang), with stop_token_ids = the target's
                end tokens, skip_special_tokens, and `logprobs` with return_tokens_as_token_ids
                (vLLM) so that the answer's exact tokens come back and are decoded here as the
                in-process path decodes them; a server that returns text only gives its text.
    text        servers that take a string only (`transformers serve`): the rendered text, its BOS
                left out when the server's tokenizer adds one itself, sent only when our tokenizer
                encodes it back to the exact ids (otherwise the prompt fails, naming why); the end
                tokens and the sampling settings go in `generation_config` where the server takes it
                (transformers serve), else the server stops at its own end token. The answer is the
                server's text decoded without special tokens, as the in-process path decodes; its
                tokens are counted by the server (`usage`, less the end token), not re-tokenized (a
                model may write a token sequence that is not the tokenizer's own encoding of its text).
                Text rows (windows of a text) join the prompt's decoded text and the answer's, where
                the in-process path decodes both tokens at once. One thing text cannot tell: an answer
                whose end token is its max_new_tokens-th token reads as cut off ("capped").

Every request's `usage.prompt_tokens` must equal the prompt's token count here: a server whose tokenizer
differs fails its probe. A server is refused before anything is generated when `/v1/models` names no
model that is the target (its path or hub id, or its last path component; `served_model` when the
server serves the target under another name) or when the probe's token counts, ids or text disagree
with the target's tokenizer; the message names the server and the model it serves.

Sampling: temperature, top_p and max_new_tokens as in-process; top_k, min_p, repetition penalties off;
each request is seeded from (seed, its batch, its place in the batch), so the same folder comes out
of a rerun where the server's sampling is deterministic: always at temperature 0 (greedy answers are
the in-process path's, token for token, where the server computes as generate() does: the tests show it
for transformers serve), and above it only where a request's random numbers are its own (vLLM's
per-request seeds; not transformers serve's continuous batching, whose requests share them). A batch
here is a whole chunk (`chunk_rows` prompts): its requests go out at once, `concurrency` in flight on
each server; --batch-size is the in-process path's only.

A server that stops answering (connection refused or reset, after `retries` tries with backoff) is
left out, its requests go to the others; when none is left the run stops with ServerUnavailable before
the unfinished chunk is written, and the same command (with servers that answer) resumes it. A request
a server refuses (HTTP 4xx, or 5xx after the retries) fails its prompt, counted with the server's
answer as its reason.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from specheads.core.manifest import weights_id
from specheads.core.target import target_config, vocab_hash
from specheads.data.distillation import (
    Answer,
    DistillConfig,
    FailedAnswer,
    answer_chunk,
    end_token_ids,
)

DEFAULT_CONCURRENCY = 16
# a probe prompt with markup, digits, spaces, newlines and non-ASCII text: another tokenizer counts it otherwise
PROBE = "Probe: `def f(x):\n    return x ** 2`  — 12345, 0.75; naïve café ✓ <tag/> 日本語"
_CONNECTION_ERRORS = (ConnectionError, http.client.HTTPException, socket.timeout, TimeoutError)


class ServerUnavailable(RuntimeError):
    """No server answers: the run stops before the unfinished chunk is written (rerun to resume)."""


class ServerMismatchError(ValueError):
    """A server that does not serve the target (another model, or another tokenizer)."""


class _Refused(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(f"HTTP {status}: {detail[:500]}")
        self.status = status


class _Down(Exception):
    pass


def _request(url: str, body: dict | None, timeout: float) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise _Refused(e.code, e.read().decode(errors="replace")) from None
    except urllib.error.URLError as e:
        raise _Down(str(e.reason)) from None
    except _CONNECTION_ERRORS as e:
        raise _Down(f"{type(e).__name__}: {e}") from None


@dataclass
class Server:
    url: str  # the base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)
    model: str = ""  # the name it serves the target under
    dialect: str = ""  # "ids" or "text" (module docstring), found by the probe
    generation_config: bool = False  # takes transformers' `generation_config` (text dialect)
    dead: str | None = None  # why it was left out
    free: int = 0

    def endpoint(self, path: str) -> str:
        return self.url.rstrip("/").removesuffix("/v1") + path


@dataclass
class ServerPool:
    """The servers and their free request slots; a request takes the live server with the most."""

    servers: list[Server]
    concurrency: int
    retries: int = 3
    backoff: float = 0.5
    timeout: float = 600.0
    cond: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self):
        for s in self.servers:
            s.free = self.concurrency

    def acquire(self) -> Server:
        with self.cond:
            while True:
                live = [s for s in self.servers if s.dead is None]
                if not live:
                    why = "; ".join(f"{s.url}: {s.dead}" for s in self.servers)
                    raise ServerUnavailable(
                        f"no server answers ({why}); the finished chunks are kept: start the servers "
                        "and run the same command again to resume"
                    )
                best = max(live, key=lambda s: s.free)
                if best.free > 0:
                    best.free -= 1
                    return best
                self.cond.wait()

    def release(self, server: Server) -> None:
        with self.cond:
            server.free += 1
            self.cond.notify_all()

    def mark_dead(self, server: Server, why: str) -> None:
        with self.cond:
            server.dead = server.dead or why
            self.cond.notify_all()

    def call(self, server: Server, body: dict) -> dict:
        """POST /v1/completions with retries (connection errors and 5xx) and backoff."""
        for attempt in range(self.retries + 1):
            try:
                return _request(server.endpoint("/v1/completions"), body, self.timeout)
            except _Down:
                if attempt == self.retries:
                    raise
            except _Refused as e:
                if e.status < 500 or attempt == self.retries:
                    raise
            time.sleep(self.backoff * 2**attempt)
        raise AssertionError("unreachable")


def _target_names(name: str) -> set[str]:
    path = Path(name).expanduser()
    names = {name, str(path), path.name}
    if path.exists():
        names |= {str(path.resolve()), path.resolve().name}
    return names


@dataclass
class _GenerationConfig:
    eos_token_id: list[int] | int | None


class ServerTarget:
    """The target as distill() needs it (its tokenizer, config, settings record), its answers written by
    servers. Build it with `connect`."""

    def __init__(self, name_or_path: str, tokenizer, config, generation_config, pool: ServerPool):
        self.name_or_path = name_or_path
        self.tokenizer = tokenizer
        self.config = config
        self.generation_config = generation_config
        self.pool = pool
        self.end_ids = end_token_ids(self, tokenizer)
        self.context = getattr(config, "max_position_embeddings", None) or 10**9
        self._executor: ThreadPoolExecutor | None = None
        self._tokenizer_lock = threading.Lock()  # a fast tokenizer is not to be used by two threads at once

    @classmethod
    def connect(
        cls,
        name_or_path: str,
        urls: list[str],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        served_model: str | None = None,
        retries: int = 3,
        timeout: float = 600.0,
        trust_remote_code: bool = False,
    ) -> ServerTarget:
        """Read the target's tokenizer and configs from `name_or_path` (a directory or hub id), and check
        that every server serves it (ServerMismatchError, naming the server and what it serves);
        `trust_remote_code`: a custom architecture's code runs to read them (--trust-remote-code)."""
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig  # lazy: seconds to import

        if not urls:
            raise ValueError("need at least one server URL")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        config = target_config(AutoConfig, name_or_path, name_or_path, trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        try:
            generation_config = GenerationConfig.from_pretrained(name_or_path)
        except OSError:  # no generation_config.json: the model config's end token
            generation_config = _GenerationConfig(getattr(config, "eos_token_id", None))
        servers = [Server(url) for url in urls]  # one URL twice: twice the requests in flight there
        pool = ServerPool(servers, concurrency, retries=retries, timeout=timeout)
        target = cls(name_or_path, tokenizer, config, generation_config, pool)
        for server in servers:
            target._check_server(server, served_model)
        return target

    def settings_record(self) -> dict:
        """What the settings record of the target: its tokenizer and config, and that servers wrote the
        answers (a folder is resumed by servers only, whoever serves them)."""
        c = self.config
        text = getattr(c, "text_config", None) or c
        return {
            "engine": "openai-completions",
            "model_type": c.model_type,
            "vocab_size": getattr(text, "vocab_size", None),
            "vocab_hash": vocab_hash(self.tokenizer),
            "hidden_size": getattr(text, "hidden_size", None),
            "num_layers": getattr(text, "num_hidden_layers", None),
            "weights_id": weights_id(str(self.name_or_path), c),
        }

    # -- checking a server --------------------------------------------------------------------------

    def _check_server(self, server: Server, served_model: str | None) -> None:
        try:
            listing = _request(server.endpoint("/v1/models"), None, 60)
        except (_Down, _Refused) as e:
            raise ServerUnavailable(f"server {server.url} does not answer GET /v1/models: {e}") from None
        served = [m.get("id", "") for m in listing.get("data", [])]
        wanted = {served_model} if served_model else _target_names(str(self.name_or_path))
        match = [m for m in served if m in wanted or (not served_model and _target_names(m) & wanted)]
        if not match:
            hint = "" if served_model else " (or pass --served-model NAME if it serves the target under NAME)"
            raise ServerMismatchError(
                f"server {server.url} serves {', '.join(map(repr, served)) or 'no model'}, not the target "
                f"{served_model or str(self.name_or_path)!r}: start it on the target{hint}"
            )
        server.model = match[0]
        self._probe(server)

    def _probe(self, server: Server) -> None:
        """Find the server's dialect and check its tokenizer against ours on one short greedy answer."""
        ids = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": PROBE}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        probe = DistillConfig(max_new_tokens=8, temperature=0.0)
        refusals = []
        for dialect, generation_config in (("ids", False), ("text", True), ("text", False)):
            server.dialect, server.generation_config = dialect, generation_config
            body = self._body(server, list(ids), probe, seed=0)
            if body is None:
                raise ServerMismatchError(
                    f"server {server.url} ({server.model}) takes text prompts, and the target's tokenizer "
                    "does not encode its own rendered chat template back to the same tokens: use a "
                    "server that takes token ids (vLLM, SGLang)"
                )
            try:
                response = _request(server.endpoint("/v1/completions"), body, self.pool.timeout)
            except _Down as e:
                raise ServerUnavailable(f"server {server.url} does not answer: {e}") from None
            except _Refused as e:
                if e.status >= 500:
                    raise ServerUnavailable(f"server {server.url} failed a probe request: {e}") from None
                refusals.append(f"{dialect} prompt{' with generation_config' * generation_config}: {e}")
                continue
            why = self._disagreement(response, ids)
            if why:
                raise ServerMismatchError(
                    f"server {server.url} serves {server.model!r}, whose tokenizer is not the target's "
                    f"({self.name_or_path}): {why}"
                )
            return
        raise ServerMismatchError(
            f"server {server.url} ({server.model}) refused every form of a /v1/completions request: "
            + "; ".join(refusals)
        )

    def _disagreement(self, response: dict, ids: list[int]) -> str | None:
        usage = response.get("usage") or {}
        if usage.get("prompt_tokens") is not None and usage["prompt_tokens"] != len(ids):
            return f"a probe prompt of {len(ids)} tokens here counts {usage['prompt_tokens']} there"
        choice = response["choices"][0]
        tokens = _returned_ids(choice)
        if tokens is not None:
            if any(not 0 <= t < len(self.tokenizer) for t in tokens):
                return f"it returned token ids outside the target's vocabulary of {len(self.tokenizer)}"
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            if choice.get("text") is not None and choice["text"] != text:
                return f"its answer's token ids decode here to {text!r}, but it wrote {choice['text']!r}"
        return None

    # -- requests -----------------------------------------------------------------------------------

    def _body(self, server: Server, ids: list[int], cfg: DistillConfig, seed: int) -> dict | None:
        """The /v1/completions request for prompt `ids` (None: a text prompt that would not tokenize to
        `ids` on the server)."""
        body: dict = {"model": server.model, "max_tokens": cfg.max_new_tokens, "seed": seed}
        body["temperature"] = cfg.temperature
        if cfg.temperature > 0:
            body["top_p"] = cfg.top_p
        if server.dialect == "ids":
            body["prompt"] = ids
            body |= {
                "stop_token_ids": self.end_ids,
                "skip_special_tokens": True,
                "logprobs": 0,
                "return_tokens_as_token_ids": True,
                "top_k": -1,
                "min_p": 0.0,
                "repetition_penalty": 1.0,
                "frequency_penalty": 0.0,
                "presence_penalty": 0.0,
            }
            return body
        with self._tokenizer_lock:
            text = self._prompt_text(ids)
        if text is None:
            return None
        body["prompt"] = text
        if server.generation_config:
            settings = {"eos_token_id": self.end_ids, "do_sample": cfg.temperature > 0}
            settings |= {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
            if cfg.temperature > 0:
                settings |= {"top_k": 0, "min_p": 0.0, "typical_p": 1.0}
            body["generation_config"] = json.dumps(settings)
        return body

    def _prompt_text(self, ids: list[int]) -> str | None:
        """The text a server that tokenizes with its tokenizer's special tokens turns into `ids`."""
        tok = self.tokenizer
        text = tok.decode(ids, skip_special_tokens=False)
        candidates = [text]
        if tok.bos_token and text.startswith(tok.bos_token):
            candidates.append(text.removeprefix(tok.bos_token))
        for candidate in candidates:
            if tok(candidate)["input_ids"] == list(ids):
                return candidate
        return None

    def _answer(self, ids: list[int], cfg: DistillConfig, seed: int) -> Answer | FailedAnswer:
        pool = self.pool
        while True:
            server = pool.acquire()
            try:
                body = self._body(server, ids, cfg, seed)
                if body is None:
                    return FailedAnswer(
                        "the rendered prompt does not encode back to its tokens as text; a server that "
                        "takes token ids (vLLM, SGLang) can answer it"
                    )
                try:
                    response = pool.call(server, body)
                except _Down as e:
                    pool.mark_dead(server, str(e))
                    continue  # another server takes it
                except _Refused as e:
                    return FailedAnswer(f"server {server.url} refused the request: {e}")
                return self._read(server, response, ids)
            finally:
                pool.release(server)

    def _read(self, server: Server, response: dict, ids: list[int]) -> Answer | FailedAnswer:
        try:
            choice = response["choices"][0]
            usage = response.get("usage") or {}
            if usage.get("prompt_tokens") is not None and usage["prompt_tokens"] != len(ids):
                return FailedAnswer(
                    f"server {server.url} counted {usage['prompt_tokens']} prompt tokens, not {len(ids)}"
                )
            tokens = _returned_ids(choice)
            if tokens is not None:
                cut = next((i for i, t in enumerate(tokens) if t in self.end_ids), None)
                ended = cut is not None or choice.get("finish_reason") == "stop"
                tokens = tokens if cut is None else tokens[:cut]
                with self._tokenizer_lock:
                    text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                return Answer(text, len(tokens), ended)
            ended = choice.get("finish_reason") == "stop"
            count = usage.get("completion_tokens")
            if count is None:
                with self._tokenizer_lock:
                    count = len(self.tokenizer(choice["text"], add_special_tokens=False)["input_ids"])
            elif ended:  # the end token is counted there, not written here
                count = max(0, count - 1)
            return Answer(choice["text"], int(count), ended)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            return FailedAnswer(f"server {server.url} answered what is not a completion ({e!r})")

    def _executor_of(self) -> ThreadPoolExecutor:
        if self._executor is None:
            workers = self.pool.concurrency * len(self.pool.servers)
            self._executor = ThreadPoolExecutor(workers, thread_name_prefix="distill-request")
        return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def distill_chunk(self, chunk, cfg: DistillConfig, on_batch=None):
        """One chunk's rows (data/distillation.answer_chunk), the whole chunk one batch of requests."""
        executor = self._executor_of()

        def gen(prompts, seed):
            futures = [
                executor.submit(self._answer, list(p), cfg, (seed + i) % 2**31) for i, p in enumerate(prompts)
            ]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise

        return answer_chunk(self.tokenizer, chunk, cfg, gen, self.context, len(chunk), on_batch)


def _returned_ids(choice: dict) -> list[int] | None:
    """The answer's token ids, where the server returned them (vLLM's return_tokens_as_token_ids writes
    each logprobs token as "token_id:N"); None otherwise."""
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if not tokens or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return None
    return [int(t.removeprefix("token_id:")) for t in tokens]
