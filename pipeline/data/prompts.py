"""Prompts in TRL's two formats (trl.data_utils.is_conversational: a standard prompt is a string continued as
written, a conversational one a list of {"role", "content"} messages rendered by the chat template), measured with
the model's tokenizer. TRL's GRPOTrainer no longer has `max_prompt_length`, so the limits are chosen here from the
real counts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from grpo_pipeline.env.text import excerpt
from grpo_pipeline.rewards.completions import build_prompt
from grpo_pipeline.pipeline.config import ConfigError, given

# `max_prompt_length: auto` rounds up to a multiple of 16: the padded prompt block stays aligned for the kernels.
PROMPT_LENGTH_MULTIPLE = 16
# The user message used to probe the template: short, plain and free of special characters.
PROBE_QUESTION = "What is 1 + 1?"


def is_conversational(prompt: Any) -> bool:
    """True for a list of messages (TRL's conversational format), False for a string (standard).

    >>> is_conversational([{"role": "user", "content": "1+1?"}]), is_conversational("1+1=")
    (True, False)
    """
    return isinstance(prompt, (list, tuple))


def with_system_prompt(system_prompt: Optional[str], prompt: Any) -> Any:
    """A conversational prompt with `system_prompt` first when it has no system message of its own; anything else
    (a standard prompt: TRL gives it to the model as written) unchanged.

    >>> with_system_prompt("Be brief.", [{"role": "user", "content": "1+1?"}])[0]
    {'role': 'system', 'content': 'Be brief.'}
    """
    if not system_prompt or not is_conversational(prompt) or (prompt and prompt[0].get("role") == "system"):
        return prompt
    return [{"role": "system", "content": system_prompt}, *prompt]


def as_chat(system_prompt: Optional[str], prompt: Any) -> list[dict[str, str]]:
    """The chat `grpo generate` sends: a question (text) as a training row's, a chat as `with_system_prompt`.

    >>> as_chat("S", "2+2?"), as_chat("S", [{"role": "system", "content": "Mine"}, {"role": "user", "content": "?"}])[0]
    ([{'role': 'system', 'content': 'S'}, {'role': 'user', 'content': '2+2?'}], {'role': 'system', 'content': 'Mine'})
    """
    return with_system_prompt(system_prompt, prompt) if is_conversational(prompt) else build_prompt(system_prompt, prompt)


def completion_like(prompt: Any, text: str) -> Any:
    """`text` as TRL hands a completion of `prompt` to the rewards (GRPOTrainer._generate_and_score_completions).

    >>> completion_like("1+1=", "2"), completion_like([{"role": "user", "content": "1+1?"}], "2")
    ('2', [{'role': 'assistant', 'content': '2'}])
    """
    return [{"role": "assistant", "content": text}] if is_conversational(prompt) else text


def question_text(prompt: Any) -> str:
    """What a prompt asks: its text, or a chat's last message (whatever system message it has).

    >>> question_text("2+2="), question_text([{"role": "system", "content": "S"}, {"role": "user", "content": "2+2?"}])
    ('2+2=', '2+2?')
    """
    return str(prompt[-1]["content"]) if is_conversational(prompt) else str(prompt)


def render_prompts(tokenizer: Any, prompts: Sequence[Any]) -> list[str]:
    """The text the model sees for each prompt, as TRL's maybe_apply_chat_template renders it."""
    chats = [list(prompt) for prompt in prompts if is_conversational(prompt)]
    rendered: list[str] = []
    if chats:
        out = tokenizer.apply_chat_template(chats, tokenize=False, add_generation_prompt=True)
        rendered = [out] if isinstance(out, str) else list(out)
    texts = iter(rendered)
    return [next(texts) if is_conversational(prompt) else str(prompt) for prompt in prompts]


def check_system_prompt_survives(tokenizer: Any, system_prompt: Optional[str]) -> str:
    """The rendered probe prompt, refused unless the system prompt appears in it verbatim: some templates drop the
    system role, rewrite it or escape newlines, and the model would never see the format the rewards check for.

    >>> from grpo_pipeline.pipeline.assets import load_qwen_tokenizer
    >>> text = check_system_prompt_survives(load_qwen_tokenizer(), "Line one.\\nLine two.")
    >>> text.startswith("<|im_start|>system\\nLine one.\\nLine two.<|im_end|>")
    True
    """
    template = getattr(tokenizer, "chat_template", None)
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if not template:
        raise ConfigError(
            "system_prompt",
            f"tokenizer {excerpt(name)} has no chat template, so prompts cannot be built as chats. Use an "
            "instruct/chat model (e.g. unsloth/Qwen2.5-1.5B-Instruct) or give the tokenizer a chat_template.",
        )
    try:
        (rendered,) = render_prompts(tokenizer, [build_prompt(system_prompt, PROBE_QUESTION)])
    except Exception as err:  # jinja raises on templates without a system role (e.g. Gemma's)
        raise ConfigError(
            "system_prompt",
            f"the chat template of {excerpt(name)} failed on a system + user prompt ({type(err).__name__}: {err}). "
            "If the template has no system role, set system_prompt to '' and put the instructions in the data.",
        ) from err
    if system_prompt and system_prompt not in rendered:
        raise ConfigError(
            "system_prompt",
            f"the chat template of {excerpt(name)} does not reproduce the system prompt verbatim (newlines "
            f"included). The model would not see the format instructions.\nsystem_prompt: {excerpt(system_prompt)}\n"
            f"rendered by the chat template: {excerpt(rendered)}\nUse a template that keeps the system message "
            "as written, or rewrite system_prompt so that it survives.",
        )
    return rendered


@dataclass
class PromptLengths:
    """Token counts of every prompt, with the time spent rendering and tokenizing."""

    counts: list[int]
    render_s: float
    tokenize_s: float


def count_prompt_tokens(tokenizer: Any, conversations: Sequence[Any]) -> PromptLengths:
    """Each prompt's tokens as the model sees them, rendered first and then tokenized in one batched call of the
    fast tokenizer; equal to `len(apply_chat_template(chat, tokenize=True, add_generation_prompt=True)["input_ids"])`.

    >>> from grpo_pipeline.pipeline.assets import load_qwen_tokenizer
    >>> chat = build_prompt("You are a helpful assistant.", "What is 2 plus 2?")
    >>> count_prompt_tokens(load_qwen_tokenizer(), [chat]).counts
    [27]
    """
    start = time.perf_counter()
    texts = render_prompts(tokenizer, conversations)
    rendered = time.perf_counter()
    counts = [0] * len(texts)
    # A chat: no special tokens added, the template wrote them (a BOS would be counted, and trained, twice). A
    # standard prompt: the tokenizer's own, as TRL's GRPOTrainer._tokenize_prompts calls `processing_class(text=...)`.
    # No attention masks: they would only double the Python lists built from the Rust output.
    for chat in (True, False):
        where = [i for i, prompt in enumerate(conversations) if is_conversational(prompt) == chat]
        if where:
            ids = tokenizer([texts[i] for i in where], add_special_tokens=not chat,
                            return_attention_mask=False)["input_ids"]
            for i, row_ids in zip(where, ids, strict=True):
                counts[i] = len(row_ids)
    done = time.perf_counter()
    return PromptLengths(counts=counts, render_s=rendered - start, tokenize_s=done - rendered)


def system_prompt_tokens(tokenizer: Any, system_prompt: Optional[str]) -> int:
    """Tokens of the system prompt with an empty user message and the generation prompt: every prompt's floor.

    >>> from grpo_pipeline.pipeline.assets import load_qwen_tokenizer
    >>> system_prompt_tokens(load_qwen_tokenizer(), "You are a helpful assistant.")
    19
    """
    return count_prompt_tokens(tokenizer, [build_prompt(system_prompt, "")]).counts[0]


def length_stats(counts: Sequence[int]) -> dict[str, float | int]:
    """Summary of the prompt lengths (numpy's linear percentiles).

    >>> length_stats([10, 20, 30, 40])
    {'count': 4, 'min': 10, 'max': 40, 'mean': 25.0, 'p50': 25.0, 'p90': 37.0, 'p99': 39.7}
    """
    if len(counts) == 0:
        return {"count": 0}
    values = np.asarray(counts)
    p50, p90, p99 = (round(float(p), 2) for p in np.percentile(values, [50, 90, 99]))
    return {"count": int(values.size), "min": int(values.min()), "max": int(values.max()),
            "mean": round(float(values.mean()), 2), "p50": p50, "p90": p90, "p99": p99}


def round_up(value: int, multiple: int = PROMPT_LENGTH_MULTIPLE) -> int:
    """`value` rounded up to a multiple of `multiple`.

    >>> round_up(257), round_up(256), round_up(1)
    (272, 256, 16)
    """
    return -(-value // multiple) * multiple


@dataclass
class LengthBudget:
    """The prompt limit used to filter before the data is seen, and where each number came from."""

    max_seq_length: int
    fixed_prompt_limit: Optional[int]  # max_prompt_length from the config, None = auto
    fixed_completion_limit: Optional[int]  # max_completion_length from the config, None = auto

    @property
    def filter_limit(self) -> int:
        """Prompts longer than this are over-long: the fixed limit, else what the completion leaves."""
        return given(self.fixed_prompt_limit, self.max_seq_length - (self.fixed_completion_limit or 0))

    def check_room_for_system_prompt(self, system_prompt_tokens: int) -> None:
        """Refuse a limit that the system prompt alone already exceeds: every row would be dropped."""
        limit = self.filter_limit
        if system_prompt_tokens <= limit:
            return
        if self.fixed_prompt_limit is not None:
            raise ConfigError(
                "max_prompt_length",
                f"max_prompt_length ({limit}) is below the {system_prompt_tokens} tokens that the system prompt "
                "alone takes in the chat template (system prompt + empty user message + generation prompt), so "
                f"every prompt would be over-long. Set max_prompt_length to at least "
                f"{round_up(system_prompt_tokens + 1)} plus room for the questions, or to `auto`.",
            )
        source = (f"max_seq_length ({self.max_seq_length}) - max_completion_length ({self.fixed_completion_limit})"
                  if self.fixed_completion_limit is not None else f"max_seq_length ({self.max_seq_length})")
        raise ConfigError(
            "max_completion_length" if self.fixed_completion_limit is not None else "max_seq_length",
            f"the prompt budget {source} = {limit} is below the {system_prompt_tokens} tokens that the system "
            "prompt alone takes in the chat template. Raise max_seq_length or lower max_completion_length.",
        )

    def final_limits(self, longest_kept_prompt: int) -> tuple[int, int]:
        """(max_prompt_length, max_completion_length) once the kept prompts are known."""
        # auto: the longest kept prompt rounded up, but never past what the completion leaves.
        prompt_limit = given(self.fixed_prompt_limit, min(round_up(longest_kept_prompt), self.filter_limit))
        completion_limit = given(self.fixed_completion_limit, self.max_seq_length - prompt_limit)
        if completion_limit <= 0:
            raise ConfigError(
                "max_completion_length",
                f"auto gives max_seq_length ({self.max_seq_length}) - max_prompt_length ({prompt_limit}) = "
                f"{completion_limit}: no room left for completions. Raise max_seq_length, or set a smaller "
                "max_prompt_length (longer prompts are then dropped or refused per overlong_policy).",
            )
        if prompt_limit + completion_limit > self.max_seq_length:  # both fixed (a caller without validate())
            raise ConfigError("max_completion_length", f"max_prompt_length ({prompt_limit}) + max_completion_length "
                              f"({completion_limit}) exceeds max_seq_length ({self.max_seq_length}).")
        return prompt_limit, completion_limit


def with_default_system_prompt(template: str, system_prompt: str) -> str:
    r"""`template` with `system_prompt` inserted as the first message of any chat that has no system message.

    >>> from jinja2 import Template
    >>> t = with_default_system_prompt("{% for m in messages %}[{{ m.role }}: {{ m.content }}]{% endfor %}", 'Say "hi"\n')
    >>> Template(t).render(messages=[{"role": "user", "content": "1+1"}])
    '[system: Say "hi"\n][user: 1+1]'
    >>> Template(t).render(messages=[{"role": "system", "content": "own"}, {"role": "user", "content": "1+1"}])
    '[system: own][user: 1+1]'
    """
    literal = json.dumps(system_prompt)  # a JSON string is a valid jinja string literal (escapes included)
    return ("{%- if not messages or messages[0]['role'] != 'system' -%}"
            "{%- set messages = [{'role': 'system', 'content': " + literal + "}] + messages -%}"
            "{%- endif -%}\n" + template)


def carry_system_prompt(tokenizer: Any, system_prompt: Optional[str]) -> None:
    """Make the trained system prompt the chat template's default before an export saves it (into
    tokenizer_config.json; a GGUF's metadata, as llama.cpp's converter reads the saved folder's template)."""
    template = getattr(tokenizer, "chat_template", None)
    if system_prompt and isinstance(template, str) and template:
        tokenizer.chat_template = with_default_system_prompt(template, system_prompt)
