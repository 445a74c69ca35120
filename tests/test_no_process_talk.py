"""The repository describes the product, never how it was developed: no tracked text file counts work
periods (`s52-init`, "the forty-first session"), cites the tracker's own issue numbers ("issue 21"), speaks
of GPU loans or device calls, or names a path outside the repository (`../shared`, `/work/`), which a
user's clone does not have. Upstream bugs are cited as `owner/project#number` (`vllm-project/vllm#18906`);
pytest's fixture scopes and library classes named Session are code, not talk.

The files are the tracked ones (`git ls-files`, plus new files git does not ignore), or, in a copy without
git, every file under the root but the tool folders. Binary and compressed files are skipped, and so are
the third-party question sets shipped verbatim (their text speaks of CEOs, loans and sessions of its own).
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()  # it spells the vocabulary out, to test it

# The project's own code and configuration; the rest is prose (README, docs/, recipes/, benchmarks/).
OWN = ("src/", "tests/", "scripts/", ".ci/", "pyproject.toml")
# Third-party text shipped as it is: MT-Bench and Spec-Bench, whose questions are not ours to reword.
THIRD_PARTY = ("src/specheads/core/prompt_sets/",)
BINARY = {
    ".gz", ".xz", ".bz2", ".zst", ".zip", ".tgz", ".tar", ".whl", ".safetensors", ".bin", ".pt", ".pth",
    ".ckpt", ".gguf", ".npy", ".npz", ".pkl", ".png", ".jpg", ".jpeg", ".gif", ".webp", ".pdf", ".ico",
    ".so", ".pyc", ".parquet", ".arrow", ".woff", ".woff2", ".ttf",
}  # fmt: skip
# Never walked when there is no git to ask: tool output and environments, not the project's files.
NOT_WALKED = {
    ".git", ".venv", "venv", "build", "dist", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache",
    "node_modules", ".gpu", "runs", ".eggs",
}  # fmt: skip

ORDINAL = (
    r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth"
    r"|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|thirtieth|fortieth"
    r"|fiftieth|sixtieth|(?:twenty|thirty|forty|fifty|sixty)-(?:first|second|third|fourth|fifth|sixth"
    r"|seventh|eighth|ninth)|\d+(?:st|nd|rd|th))"
)
TENS = r"(?:twenty|thirty|forty|fifty|sixty)"
PROCESS = re.compile(
    "|".join(
        (
            r"\bsessions?\b",  # a work period (the code idioms are taken out first: IDIOMS)
            r"\bs(?:[5-9]|\d\d)-[a-z]",  # a work period's folder: s14-mt32, s52-init (s0-s4: seeds in run names)
            rf"\b{ORDINAL}\s+(?:session|work\s+period|loan)s?\b",  # the sixth session, the 37th session
            r"\bwork\s+periods?\b",
            rf"\b(?:{TENS}-(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth)"
            r"|twentieth|thirtieth|fortieth|fiftieth|sixtieth)\b",  # "the forty-first": a count of them
            r"\bissues?\s+#?\d+",  # the tracker's own numbers; upstream ones read owner/project#N
            r"\bloans?\b",
            r"\blent\b",
            r"\bdevice\s+calls?\b",
            r"\.\./shared\b",
            r"/work/",
        )
    ),
    re.IGNORECASE,
)
# Code, not talk: pytest's fixture scope, library classes named Session (requests, aiohttp, onnxruntime).
IDIOMS = re.compile(r"""scope=["']session["']|\bSession\(|\.Session\b|\w+Session\b|\brequests\.\w+""")


def hits_in(text: str) -> list[tuple[int, str]]:
    """(line number, line) for each line of `text` that speaks of the process."""
    if not PROCESS.search(text):  # most files: one pass, no split
        return []
    return [
        (n, line.strip())
        for n, line in enumerate(text.splitlines(), 1)
        if PROCESS.search(IDIOMS.sub("", line))
    ]


def tracked_files() -> list[str]:
    """Repository-relative paths: git's tracked and not-ignored files, else a walk of the tree."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        names = sorted({n for n in out.decode().split("\0") if n})
        if names:
            return names
    except (OSError, subprocess.CalledProcessError):
        pass
    names = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in NOT_WALKED and not d.endswith(".egg-info")]
        files = [f for f in files if f != ".git"]  # a worktree's or submodule's pointer to its repository
        names += [(Path(folder) / f).relative_to(ROOT).as_posix() for f in files]
    return sorted(names)


def scanned(names: list[str]) -> list[str]:
    return [
        n
        for n in names
        if n != THIS
        and not n.startswith(THIRD_PARTY)
        and not any(n.lower().endswith(ext) for ext in BINARY)
        and (ROOT / n).is_file()
    ]


def process_talk(names: list[str]) -> list[str]:
    """`file:line: text` for every line of process talk in the named files."""
    found = []
    for name in scanned(names):
        data = (ROOT / name).read_bytes()
        if b"\0" in data[:8192]:  # binary whatever its name
            continue
        text = data.decode("utf-8", errors="replace")
        found += [f"{name}:{n}: {line[:200]}" for n, line in hits_in(text)]
    return found


CAUGHT = [
    "the forty-first session showed the shared one 2% behind",
    "(the fortieth: a 1.2%-2.3% loss)",
    "Seen twice in one session and once in CI",
    "2026-11-26 (seventh session): each thread count",
    "--max-length itself before 2026-12-04's 37th session",
    "a new user made (issue 20): it must end the command",
    "Issue 21's goals: ours above the best peer",
    "see issue #12",
    "docs/bench_trainers/eagle3-smollm2/s52-init",
    "docs/bench_trainers/medusa-smollm2/s41-eval32",
    "docs/gpu/h100-s9-tiny-compare-fp32.md",
    "Device call 1 when the loan goes to SmolLM2 alone",
    "they ran on the first loan",
    "on a lent GPU machine",
    "cp ../shared/data/mt_bench_question.jsonl .gpu/c3/data/",
    "PYTHONPATH=/work/main/src",
    "Sessions 14 to 52 measured it",
    "as the sixth work period found",
]
PASSES = [
    '@pytest.fixture(scope="session")',
    "@pytest.fixture(scope='session')",
    "s = requests.Session()",
    "sess = ort.InferenceSession(path)",
    "subprocess.Popen(cmd, start_new_session=True)",
    "session_dir = tmp_path_factory.mktemp('x')",
    "vllm-project/vllm#18906: the drafter's norm",
    "a second run reads the cache; the first run's checkpoints",
    "issues a warning when the file is stale",
    "ours-s0 and ours-s1 are the two seeds",
    "output_dir=W/ours-s0-fp32 and modelopt-e12-s1-lr_2e-3-warmup",
    "measured on an AMD EPYC (Zen 4), 2 threads",
    "python -m specheads.train --config recipes/smollm2-135m/eagle3.yaml",
    "the twelfth token of the draft",
]


@pytest.mark.parametrize("line", CAUGHT)
def test_the_vocabulary_catches(line):
    assert hits_in(line) == [(1, line)]


@pytest.mark.parametrize("line", PASSES)
def test_code_idioms_and_plain_words_pass(line):
    assert hits_in(line) == []


def test_the_walk_without_git_finds_the_same_kind_of_files(tmp_path, monkeypatch):
    """A copy without git history (a release tarball): the walk stands in for git and skips tool folders."""
    tool_files = (".git/config", ".venv/lib/c.py", "src/__pycache__/a.pyc", "sub/.git")
    for rel in ("src/a.py", "docs/b.md", *tool_files):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x\n")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repository above it either
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert tracked_files() == ["docs/b.md", "src/a.py"]


def test_own_code_and_configuration_have_no_process_talk():
    """src/, tests/, scripts/, .ci/ and pyproject.toml: `-k own` checks these alone."""
    hits = process_talk([n for n in tracked_files() if n.startswith(OWN)])
    assert not hits, "process talk in the code:\n" + "\n".join(hits)


def test_no_tracked_file_has_process_talk():
    hits = process_talk(tracked_files())
    assert not hits, f"{len(hits)} lines of process talk:\n" + "\n".join(hits)
