"""Chat prompts written by the project from seed topics: training prompts that never touch the
evaluation sets.

MT-Bench and Spec-Bench (core/prompt_sets/) are for evaluation only, and the public chat sets people
distill from (ShareGPT, UltraChat) are neither offline nor provably disjoint from them. These prompts
are written here: hand-picked topics crossed with hand-written task templates, plus arithmetic word
problems and small programming tasks with seeded numbers and names, across the kinds of request
MT-Bench's categories cover (writing, roleplay, reasoning, math, coding, STEM, humanities). They
carry no answers: the target writes those (`specheads distill`), so the heads learn the target's own
words. tests/train/test_seed_prompts.py proves that no 6-word sequence of any prompt appears in
either evaluation set.

    specheads seed-prompts --out data/seed-prompts.jsonl \\
        --check-against src/specheads/core/prompt_sets/*.jsonl  # 2,108 prompts
    specheads distill --source data/seed-prompts.jsonl --target smollm2 --out data/seed-sd
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import random
import re
from collections.abc import Iterable
from pathlib import Path

# fmt: off
TOPICS = (
    "sourdough baking", "composting at home", "the water cycle", "volcanoes", "plate tectonics",
    "honeybees", "chess openings", "urban gardening", "the Silk Road", "the printing press",
    "wind turbines", "solar panels", "bird migration", "coral reefs", "black holes",
    "the immune system", "sleep habits", "personal budgeting", "learning a second language",
    "public speaking", "rock climbing", "origami", "jazz improvisation", "impressionist painting",
    "Roman aqueducts", "Egyptian hieroglyphs", "the invention of the telephone", "recycling plastic",
    "electric bicycles", "weather forecasting", "ocean tides", "the phases of the moon",
    "photosynthesis", "fermentation", "coffee roasting", "green tea", "knitting", "woodworking",
    "beekeeping", "marathon training", "stretching before exercise", "mindful breathing",
    "time management", "taking lecture notes", "lighthouses", "old sea charts", "suspension bridges",
    "elevators", "the metric system", "prime numbers", "probability with dice", "fractions",
    "the geometry of circles", "the Fibonacci sequence", "secret codes and ciphers", "public libraries",
    "board game design", "starting a podcast", "film editing", "houseplants", "rainwater harvesting",
    "glaciers", "desert ecosystems", "octopuses", "the human heart", "vaccines", "antibiotics",
    "the periodic table", "magnets", "static electricity", "rainbows", "sound waves", "telescopes",
    "the first airplanes", "steam engines", "the Great Wall", "Viking ships", "medieval castles",
    "the Olympic Games", "folk music", "pottery", "calligraphy", "birdwatching", "camping safely",
    "first aid basics", "saving energy at home", "reading nutrition labels", "writing a resume",
    "job interviews", "negotiating a salary", "moving to a new city", "adopting a rescue dog",
)
# fmt: on

TOPIC_TASKS = {
    "writing": (
        "Write a short poem about {topic}.",
        "Write a limerick about {topic}.",
        "Write the opening paragraph of a mystery story in which {topic} turns out to matter.",
        "Draft a cheerful note inviting a neighbour to an evening talk on {topic}.",
        "Write a product description for a beginner's kit on {topic}.",
        "Write a persuasive paragraph claiming that every teenager should learn about {topic}.",
    ),
    "roleplay": (
        "Pretend you are a museum guide whose favourite subject is {topic}; welcome a group of visitors.",
        "You are a librarian. Suggest three kinds of books for a reader who has just discovered {topic}.",
        "Act as a patient tutor and ask me three questions to find out how much I know about {topic}.",
    ),
    "stem": (
        "Explain {topic} to a curious twelve-year-old.",
        "What are common misconceptions about {topic}, and what is actually true?",
        "Describe how {topic} works, step by step.",
        "What would a scientist measure to study {topic}?",
    ),
    "humanities": (
        "Summarise the history of {topic} in five sentences.",
        "How has {topic} changed the way people live?",
        "Give three practical tips for someone getting started with {topic}.",
        "List some advantages and drawbacks of {topic}.",
        "How would you teach {topic} in a one-hour workshop?",
        "What should I ask an expert on {topic} if I had ten minutes with them?",
    ),
}

# fmt: off
NAMES = ("Amara", "Bruno", "Chen", "Dalia", "Emeka", "Freya", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena")
ITEMS = ("pencils", "apples", "stamps", "marbles", "postcards", "tea bags", "buttons", "seashells")
MATH = (
    "{name} buys {a} packs of {item} with {b} in each pack and gives away {c}. How many are left?",
    "A cyclist rides at {a} km per hour for {b} hours and then walks {c} km. How far did they go in total?",
    "{name} saves {a} coins a week. After {b} weeks they spend {c} coins. How many coins remain?",
    "Is {p} a prime number? Show how you checked.",
    "What is the sum of the whole numbers from 1 to {a}? Explain a quick way to find it.",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
)
REASONING = (
    "{name} is older than {name2}, and {name2} is older than {name3}. Who is the youngest? Explain.",
    "There are {a} {item} in a box; {name} takes half and {name2} takes {c}. How many stay in the box?",
    "If every {item} in a jar is either red or blue and there are {a} more red ones than blue ones "
    "among {b2} in all, how many are blue?",
)
CODING_TASKS = (
    "reverses the order of the words in a sentence", "counts how often each letter appears in a text",
    "checks whether a word reads the same backwards", "merges two sorted lists into one sorted list",
    "returns the second largest number in a list", "converts a temperature from Celsius to Fahrenheit",
    "removes duplicate entries from a list while keeping their order", "finds the longest word in a line",
    "computes the greatest common divisor of two integers", "splits a list into chunks of a given size",
    "turns a number of seconds into hours, minutes and seconds", "validates that brackets are balanced",
    "rotates a list by k places", "flattens a nested list of integers", "counts the lines in a text file",
)
# fmt: on
LANGUAGES = ("Python", "JavaScript", "Go", "C")
CODING = (
    "Write a {lang} function that {task}.",
    "In {lang}, how would you write code that {task}? Include a short test.",
)


def _math_prompts(rng: random.Random, n: int) -> list[str]:
    prompts = set()
    while len(prompts) < n:
        names = rng.sample(NAMES, 3)
        a, b = rng.randint(3, 40), rng.randint(2, 12)
        values = dict(
            name=names[0],
            name2=names[1],
            name3=names[2],
            item=rng.choice(ITEMS),
            a=a,
            b=b,
            c=rng.randint(1, a * b // 2 if a * b > 2 else 1),
            p=rng.randint(50, 400),
            b2=a + 2 * b,
        )
        prompts.add(rng.choice(MATH + REASONING).format(**values))
    return sorted(prompts)


def seed_prompts(seed: int = 0, math_prompts: int = 240) -> list[dict]:
    """Every prompt as a row {"messages": [{"role": "user", "content": str}], "category": str}, in
    a seeded order; the same seed gives the same list on any machine."""
    rows = [
        (category, template.format(topic=topic))
        for category, templates in TOPIC_TASKS.items()
        for template in templates
        for topic in TOPICS
    ]
    rows += [
        ("coding", t.format(lang=lang, task=task))
        for t in CODING
        for lang in LANGUAGES
        for task in CODING_TASKS
    ]
    rows += [("math", text) for text in _math_prompts(random.Random(seed), math_prompts)]
    random.Random(seed).shuffle(rows)
    return [{"messages": [{"role": "user", "content": text}], "category": c} for c, text in rows]


# -- proving disjointness -----------------------------------------------------------------------


def words(text: str) -> list[str]:
    """Lower-cased runs of letters and digits: punctuation and spacing do not hide a copy."""
    return re.findall(r"[a-z0-9]+", text.lower())


def ngrams(texts: Iterable[str], n: int) -> set[tuple[str, ...]]:
    grams = set()
    for text in texts:
        w = words(text)
        grams.update(tuple(w[i : i + n]) for i in range(len(w) - n + 1))
    return grams


def question_texts(path: str | Path) -> list[str]:
    """Every turn of an MT-Bench / Spec-Bench question file (JSONL rows with `turns`)."""
    turns = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                turns += json.loads(line)["turns"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(
                    f"{path}, line {number}: not a question row (JSON with a `turns` list): {e!r}"
                ) from None
    return turns


def shared_ngrams(texts: Iterable[str], reference: Iterable[str], n: int = 6) -> set[tuple[str, ...]]:
    """The n-word sequences that `texts` and `reference` have in common."""
    return ngrams(texts, n) & ngrams(reference, n)


# Every 6-word sequence of every turn of MT-Bench and Spec-Bench (core/prompt_sets/), as 8-byte blake2b
# digests of the words joined by spaces, shipped so training sources can be filtered, and the
# disjointness checked, without reading the evaluation sets (tests/train/test_seed_prompts.py checks the
# digests against them).
EVAL_NGRAMS = Path(__file__).with_name("eval-6grams.bin.gz")


def ngram_digest(gram: tuple[str, ...]) -> bytes:
    return hashlib.blake2b(" ".join(gram).encode(), digest_size=8).digest()


def fingerprint(texts: Iterable[str], n: int = 6) -> set[bytes]:
    return {ngram_digest(g) for g in ngrams(texts, n)}


@functools.cache
def evaluation_fingerprint() -> frozenset[bytes]:
    raw = gzip.decompress(EVAL_NGRAMS.read_bytes())
    return frozenset(raw[i : i + 8] for i in range(0, len(raw), 8))


def touches_evaluation(texts: Iterable[str]) -> bool:
    """Whether any 6-word sequence of `texts` is one of MT-Bench's or Spec-Bench's."""
    return not evaluation_fingerprint().isdisjoint(fingerprint(texts))
