"""What a held-out completion is scored with: the correctness the run trained with, called as TRL calls it.

The scorer is the first reward that is the built-in correctness, marked `correctness_reward = True`, or named with
"correct" or "accura". A completion is correct when it gets the scorer's top score (the highest it gives any
completion here or the reference stated in each answer style), so a near answer paid 3.5 of 5.0 is not. Without a
correctness reward, the built-in reading (`read_answer`) matched against the reference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.data.prompts import completion_like
from grpo_pipeline.rewards import correctness_reward_func, get_reward_funcs
from grpo_pipeline.rewards.cleaning import _last_boxed_content
from grpo_pipeline.rewards.contract import RewardFailure, call_reward, reward_name
from grpo_pipeline.rewards.correctness import CORRECT_REWARD
from grpo_pipeline.rewards.extract import GSM8K_MARKER, extract_tagged
from grpo_pipeline.rewards.format import ANSWER_CLOSE, ANSWER_OPEN
from grpo_pipeline.rewards.matching import answers_match

CORRECTNESS_MARK = "correctness_reward"
CORRECTNESS_NAME = re.compile(r"correct|accura", re.IGNORECASE)
_TAG = re.compile(r"<(/?)([A-Za-z_][\w-]*)>")


@dataclass
class Scorer:
    """The run's rewards and which one scores correctness (None: the built-in reading)."""

    funcs: list[Callable]
    correctness: Optional[int]
    keywords: Callable[[dict[str, list[Any]], list[str]], dict[str, Any]]  # columns, texts -> a call's kwargs

    @property
    def name(self) -> str:
        return reward_name(self.funcs[self.correctness]) if self.correctness is not None else "built-in reading"


def build_scorer(reward_funcs: list[Any], keywords: Callable) -> Scorer:
    funcs = get_reward_funcs(list(reward_funcs)) if reward_funcs else []
    for test in (lambda f: getattr(f, "__wrapped__", f) is correctness_reward_func or f is correctness_reward_func,
                 lambda f: getattr(f, CORRECTNESS_MARK, False) is True,
                 lambda f: bool(CORRECTNESS_NAME.search(reward_name(f)))):
        found = next((i for i, func in enumerate(funcs) if test(func)), None)
        if found is not None:
            return Scorer(funcs, found, keywords)
    return Scorer(funcs, None, keywords)


def format_tags(system_message: Any) -> tuple[str, str]:
    """The answer tags a system message asks for: the last `<X>` it names that it also closes (`</X>`); else ours.

    >>> format_tags("Put your working between <start_working_out> and <end_working_out>. Then the answer between "
    ...             "<SOLUTION></SOLUTION>")
    ('<SOLUTION>', '</SOLUTION>')
    """
    found = _TAG.findall(system_message) if isinstance(system_message, str) else []
    closed = {name for slash, name in found if slash}
    paired = [name for slash, name in found if not slash and name in closed]
    return (f"<{paired[-1]}>", f"</{paired[-1]}>") if paired else (ANSWER_OPEN, ANSWER_CLOSE)


def read_answer(text: str, tags: tuple[str, str]) -> str:
    """A completion's final answer: in `tags`, else in <answer>, else the last \\boxed{}, else after the last `####`.

    >>> [read_answer(t, ("<SOLUTION>", "</SOLUTION>")) for t in ("<SOLUTION>9</SOLUTION>", "So \\\\boxed{9}.",
    ...                                                          "5+4 = 9\\n#### 9", "nine")]
    ['9', '9', '9', '']
    """
    for pair in dict.fromkeys([tags, (ANSWER_OPEN, ANSWER_CLOSE)]):
        tagged = extract_tagged(text, *pair)
        if tagged:
            return tagged
    boxed = _last_boxed_content(text) if isinstance(text, str) else None
    if boxed:
        return boxed
    marker = text.rfind(GSM8K_MARKER) if isinstance(text, str) else -1
    return text[marker + len(GSM8K_MARKER):].strip() if marker != -1 else ""


def answer_of(text: Any, prompt: Any) -> str:
    """A completion's final answer as `grpo eval`, `grpo generate` and `grpo rewards` read it.

    >>> answer_of("5 + 4 = 9. The answer is \\\\boxed{9}.", [{"role": "user", "content": "5+4?"}])
    '9'
    """
    return read_answer(str(text), format_tags(_system_message(prompt)))


def _system_message(prompt: Any) -> Optional[str]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) and prompt[0].get("role") == "system":
        return prompt[0].get("content")
    return None


def stated_answers(reference: Any, tags: tuple[str, str], system_message: Optional[str]) -> list[str]:
    """The reference in every style the scorer may pay for: ours, \\boxed{}, `####`, bare, the recipe's format."""
    recipe, names = [], []
    for slash, name in _TAG.findall(system_message or ""):
        if not slash and name not in names:
            names.append(name)
    for name in names:
        inside = reference if f"<{name}>" == tags[0] else "Working."
        recipe.append(f"<{name}>{inside}</{name}>" if f"</{name}>" in (system_message or "") else f"<{name}>")
    return [f"<reasoning>\nWorking.\n</reasoning>\n<answer>\n{reference}\n</answer>", f"\\boxed{{{reference}}}",
            f"#### {reference}", str(reference), "".join(recipe)]


def score_with(scorer: Scorer, rows: list[dict[str, Any]], texts: list[str]) -> tuple[list[dict[str, Any]],
                                                                                       dict[str, Any]]:
    """Per completion {"extracted_answer", "correct", "score"}, and the rewards' means; a scorer that fails is a
    ConfigError, another reward's failure is noted in its mean."""
    tags = [format_tags(_system_message(row["prompt"])) for row in rows]
    extracted = [read_answer(str(text), tag) for text, tag in zip(texts, tags)]
    scores, means = {}, {}
    for i, func in enumerate(scorer.funcs):
        try:
            scores[i] = _call(scorer, func, rows, [str(t) for t in texts])
        except RewardFailure as err:
            if i == scorer.correctness:
                raise ConfigError("reward_funcs", f"{err}. It scores the evaluation (the run's correctness) and "
                                  "was called on the eval completions as the trainer calls it.") from None
            means[reward_name(func)] = {"error": str(err)}
            continue
        known = [v for v in scores[i] if v is not None]
        means[reward_name(func)] = sum(known) / len(known) if known else None
    if scorer.correctness is None:
        correct = [bool(e) and answers_match(e, row["answer"]) for e, row in zip(extracted, rows)]
        got = [None] * len(rows)
    else:
        got = scores[scorer.correctness]
        top = _top_score(scorer, rows, tags, got)
        correct = [value is not None and top is not None and value >= top - 1e-9 for value in got]
    return ([{"extracted_answer": e, "correct": c, "score": s} for e, c, s in zip(extracted, correct, got)],
            means)


def _call(scorer: Scorer, func: Callable, rows: list[dict[str, Any]], texts: list[str]) -> list[Optional[float]]:
    columns: dict[str, list[Any]] = {}
    for row in rows:
        for key, value in {**row.get("columns", {}), "prompt": row["prompt"]}.items():
            columns.setdefault(key, []).append(value)
    columns = {key: values for key, values in columns.items() if len(values) == len(rows)}
    prompts = [row["prompt"] for row in rows]
    completions = [completion_like(prompt, text) for prompt, text in zip(prompts, texts)]
    return call_reward(func, prompts, completions, scorer.keywords(columns, texts))


def _top_score(scorer: Scorer, rows: list[dict[str, Any]], tags: list[tuple[str, str]],
               got: list[Optional[float]]) -> Optional[float]:
    func = scorer.funcs[scorer.correctness]
    if getattr(func, "__wrapped__", func) is correctness_reward_func:
        return CORRECT_REWARD
    stated = [(row, text) for row, tag in zip(rows, tags)
              for text in stated_answers(row["answer"], tag, _system_message(row["prompt"]))]
    try:
        probe = _call(scorer, func, [row for row, _ in stated], [text for _, text in stated]) if stated else []
    except RewardFailure:
        probe = []
    values = [v for v in [*probe, *got] if v is not None]
    return max(values) if values else None
