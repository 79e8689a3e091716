"""Training-health monitors: cheap numbers computed from each batch of generated completions.

A run that goes bad drifts into garbled text, loops of the same tokens, or no <answer> block; these put a number on
each, in pure Python. A few hundred of Qwen2.5's byte-level BPE tokens are pieces of multi-byte characters (ids
151643+ are special tokens, not byte fallbacks): emitted out of order they make U+FFFD, an early sign of garbling.

The health observer (`make_observer`): a reward function (`__name__ == "health"`, weight 0.0) that measures every
generation batch, reporting through TRL's `log_metric` and into a `HealthState` the callback reads when `log_metric`
is missing. It returns 0.0, not None: with None, TRL logs rewards/health/mean as NaN every step, a false alarm.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenizers import decoders, models  # light (a Rust extension, no torch): transformers' own dependency

# The names the measures are logged under: run/metric_names.py, below health/ (run/plots.py reads them too).
from grpo_pipeline.pipeline.health.tools import has_tool_turns, own_text, tool_metrics
from grpo_pipeline.pipeline.run.metric_names import (
    BETA,
    COMPLETION_LENGTH,
    GARBLED_RATE,
    INCOMPLETE_UTF8_SHARE,
    NO_ANSWER_RATE,
    OBSERVER_NAME,
    REPETITION_RATE,
)
from grpo_pipeline.rewards.completions import completion_text
from grpo_pipeline.rewards.extract import extract_xml_answer

# Token n-gram size for the repetition rate: 4-grams catch loops of short phrases
# ("= 5 = 5 = 5") without flagging ordinary reuse of single words or number pairs.
REPETITION_NGRAM = 4

# Characters seen in garbled GRPO output that never belong in an answer: U+FFFD; C0 controls but \t \n \r ("\r\n" is
# ordinary text), DEL and C1 controls; zero-width space/joiners (U+200B..U+200D), word joiner, BOM (U+FEFF).
GARBLED_CHARS = re.compile("[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200d\u2060\ufeff]")


def is_garbled(text: str) -> bool:
    """True when `text` holds U+FFFD, a control character other than \\t \\n \\r, or a zero-width character.

    >>> is_garbled("<answer>42</answer>"), is_garbled("line\\r\\nline\\tend")
    (False, False)
    >>> is_garbled("4\\ufffd2"), is_garbled("zero\\u200bwidth"), is_garbled("bell\\x07"), is_garbled("c1\\x85")
    (True, True, True, True)
    """
    return GARBLED_CHARS.search(text) is not None


def repetition_rate(token_ids: Sequence[int], n: int = REPETITION_NGRAM) -> float:
    """Share of a completion's token n-grams that repeat an earlier n-gram: 1 - unique/total, in [0, 1) (0.0 for
    fewer than two n-grams); a loop of one token repeated L times scores 1 - 1/(L-n+1).

    >>> repetition_rate([1, 2, 3, 4, 5, 6, 7, 8])
    0.0
    >>> repetition_rate([7] * 13)  # 10 four-grams, all the same
    0.9
    >>> repetition_rate([1, 2])
    0.0
    """
    ids = list(token_ids)
    total = len(ids) - n + 1
    if total <= 1:
        return 0.0
    unique = len({tuple(ids[i : i + n]) for i in range(total)})
    return 1.0 - unique / total


def incomplete_utf8_share(completion_ids: Iterable[Sequence[int]], incomplete_ids: frozenset[int]) -> float:
    """Fraction of all completion tokens in the batch (token-weighted) that are not valid UTF-8 on their own.

    >>> incomplete_utf8_share([[1, 2, 3], [4]], frozenset({2, 4}))
    0.5
    """
    tokens = [int(token_id) for ids in completion_ids for token_id in ids]
    return sum(token_id in incomplete_ids for token_id in tokens) / len(tokens) if tokens else 0.0


def has_answer(text: str) -> bool:
    """True when the completion has a non-empty <answer> block (the rewards' own parser decides).

    >>> has_answer("<reasoning>r</reasoning>\\n<answer>\\n7\\n</answer>")
    True
    >>> has_answer("7"), has_answer("<answer></answer>")
    (False, False)
    """
    return extract_xml_answer(text) != ""


def batch_health(completions: Sequence[Any], completion_ids: Sequence[Sequence[int]],
                 incomplete_ids: frozenset[int]) -> dict[str, float]:
    """All monitors for one generation batch, keyed by their logged metric names. `completions` are what TRL hands
    reward functions (strings or chat messages); one with no text counts as garbled and as having no answer.

    >>> m = batch_health(["<answer>4</answer>", "\\ufffd\\ufffd"], [[1, 2, 3], [9, 9]], frozenset({9}))
    >>> m["health/garbled_rate"], m["health/no_answer_rate"], m["health/incomplete_utf8_share"]
    (0.5, 0.5, 0.4)
    >>> m["health/completion_length"], m["health/repetition_rate"]
    (2.5, 0.0)
    """
    if len(completions) != len(completion_ids):
        raise ValueError(f"batch_health got {len(completions)} completions but {len(completion_ids)} "
                         "completion_ids lists; pass one id list per completion.")
    texts = [completion_text(c) for c in completions]
    return {
        GARBLED_RATE: _mean([1.0 if t is None or is_garbled(t) else 0.0 for t in texts]),
        INCOMPLETE_UTF8_SHARE: incomplete_utf8_share(completion_ids, incomplete_ids),
        REPETITION_RATE: _mean([repetition_rate(ids) for ids in completion_ids]),
        COMPLETION_LENGTH: _mean([float(len(ids)) for ids in completion_ids]),
        NO_ANSWER_RATE: _mean([0.0 if t is not None and has_answer(t) else 1.0 for t in texts]),
    }


@functools.lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the character that stands for each byte -> the byte.

    >>> alphabet = byte_level_alphabet()
    >>> len(alphabet), alphabet["A"], alphabet["Ġ"], alphabet["Ċ"]  # Ġ is the space, Ċ the newline
    (256, 65, 32, 10)
    """
    # lazy: transformers is slow to import; only a run's health rules (which import it anyway) derive the set
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: b for b, char in bytes_to_unicode().items()}


def is_byte_level_bpe(tokenizer: Any) -> bool:
    """True for a fast tokenizer whose model is BPE and whose decoder is ByteLevel (GPT-2, Qwen2.5, Llama-3), read
    off the live `tokenizers` objects (serialising tokenizer.json takes 2 s for Qwen2.5)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    return isinstance(backend.model, models.BPE) and isinstance(backend.decoder, decoders.ByteLevel)


def incomplete_utf8_token_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of the tokens whose bytes are not valid UTF-8 on their own: for a byte-level BPE, each regular token mapped
    back to its bytes and decoded strictly (0.2 s for Qwen2.5); for any other tokenizer, each id decoded alone and
    counted when the text holds U+FFFD.

    >>> from grpo_pipeline.pipeline.assets import load_qwen_tokenizer
    >>> tok = load_qwen_tokenizer()
    >>> bad = incomplete_utf8_token_ids(tok)
    >>> [i in bad for i in tok.encode("龘")], [i in bad for i in tok.encode(" answer")]
    ([True, True], [False])
    """
    if not is_byte_level_bpe(tokenizer):
        return _decoded_incomplete_ids(tokenizer)
    to_bytes = byte_level_table()
    special = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    incomplete: set[int] = set()
    odd: list[int] = []
    for token, token_id in tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False).items():
        if token_id in special:
            continue
        try:  # each character to its byte, in C (str.translate, then latin-1: one code point below 256 a byte)
            raw = token.translate(to_bytes).encode("latin-1")
        except UnicodeEncodeError:  # a character outside the byte alphabet: not a byte token, judge it by decoding
            odd.append(token_id)
            continue
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            incomplete.add(token_id)
    return frozenset(incomplete | _decoded_incomplete_ids(tokenizer, odd))


@functools.lru_cache(maxsize=1)
def byte_level_table() -> dict[int, str]:
    """str.translate's table from the byte alphabet to the bytes as latin-1 characters; every other code point below
    256 (a plain space, a control character: none is in the alphabet) goes to one above it, so that it fails the
    latin-1 encoding as any character outside the alphabet does.

    >>> "Ġhi\\u0100".translate(byte_level_table()).encode("latin-1")
    b' hi\\x00'
    >>> " ".translate(byte_level_table())
    '\\uffff'
    """
    table = {code: "\uffff" for code in range(256)}
    table.update({ord(char): chr(b) for char, b in byte_level_alphabet().items()})
    return table


def _decoded_incomplete_ids(tokenizer: Any, ids: Iterable[int] | None = None) -> frozenset[int]:
    ids = list(range(len(tokenizer))) if ids is None else list(ids)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    texts = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)
    return frozenset(i for i, text in zip(ids, texts) if i not in special and "\ufffd" in text)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def finite_mean(values: list[float | None]) -> float | None:
    """The mean of the finite values; None when there are none."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


@dataclass
class HealthState:
    """What the observer saw since the last log (`pending`: each metric's per-batch values), shared with the callback;
    `beta`: the trainer's current beta (the observer logs it)."""

    pending: dict[str, list[float]] = field(default_factory=dict)
    batches: int = 0
    beta: float | None = None

    def record(self, metrics: dict[str, float]) -> None:
        self.batches += 1
        for name, value in metrics.items():
            self.pending.setdefault(name, []).append(value)

    def flush(self) -> dict[str, float]:
        """Mean of each metric since the last flush (the same averaging TRL's log_metric does)."""
        means = {name: sum(v) / len(v) for name, v in self.pending.items() if v}
        self.pending = {}
        return means


def make_observer(state: HealthState, incomplete_ids: frozenset[int], tokenizer: Any = None,
                  max_tool_iterations: int | None = None) -> Callable[..., list[float]]:
    """The observer reward function. Without `completion_ids` (and for a multi-turn completion, measured on the
    model's own turns only: pipeline/health/tools.py) the completions are tokenized with `tokenizer`;
    `max_tool_iterations` (TRL's max_tool_calling_iterations) adds the share of rollouts that ended there.

    >>> state = HealthState()
    >>> observer = make_observer(state, frozenset({9}))
    >>> logged = {}
    >>> observer(completions=["<answer>4</answer>", "\\ufffd"], completion_ids=[[1, 2], [9]],
    ...          log_metric=lambda name, value: logged.__setitem__(name, value))
    [0.0, 0.0]
    >>> logged["health/garbled_rate"], logged["health/no_answer_rate"], state.batches
    (0.5, 0.5, 1)
    """

    def health(prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
               completion_ids: Sequence[Sequence[int]] | None = None,
               log_metric: Callable[[str, float], None] | None = None, **_: Any) -> list[float]:
        completions = list(completions or [])
        extra = tool_metrics(completions, max_tool_iterations)
        if has_tool_turns(completions):  # the model's own turns, not the tools' output
            completions, completion_ids = [own_text(c) for c in completions], None
        if completion_ids is None:
            if tokenizer is None:
                raise ValueError("the health observer got no completion_ids and has no tokenizer to rebuild them; "
                                 "build it with build_health(spec, tokenizer).")
            completion_ids = [tokenizer.encode(completion_text(c) or "", add_special_tokens=False)
                              for c in completions]
        metrics = {**batch_health(completions, [list(ids) for ids in completion_ids], incomplete_ids), **extra}
        if state.beta:  # only runs with a KL term (beta > 0) have a beta worth plotting
            metrics[BETA] = float(state.beta)
        state.record(metrics)
        if log_metric is not None:
            for name, value in metrics.items():
                log_metric(name, value)
        return [0.0] * len(completions)

    health.__name__ = OBSERVER_NAME
    health.__qualname__ = OBSERVER_NAME
    return health
