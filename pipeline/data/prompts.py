"""Prompts as chat messages, measured with the model's real tokenizer and chat template.

TRL's GRPOTrainer no longer has `max_prompt_length`, so nothing downstream trims or
filters prompts: a prompt longer than the budget would either overflow vLLM's context or
(with an old hand-rolled truncation) lose the start of its system prompt. Here every prompt
is rendered by `tokenizer.apply_chat_template` and counted, and the limits are chosen from
the real counts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from pipeline.config import ConfigError

# Rounding `max_prompt_length: auto` up to a multiple of 16 leaves the padded prompt block
# aligned for the attention kernels and leaves a little slack for the longest prompt.
PROMPT_LENGTH_MULTIPLE = 16
# The user message used to probe the template: short, plain and free of special characters.
PROBE_QUESTION = "What is 1 + 1?"


def build_prompt(system_prompt: Optional[str], question: str) -> list[dict[str, str]]:
    """Chat messages for one question; the chat template, not us, decides the text layout.

    An empty system prompt sends the user message alone (the template may then add its
    own default system message, as Qwen2.5's does).

    >>> build_prompt("Answer briefly.", "What is 2 + 2?")
    [{'role': 'system', 'content': 'Answer briefly.'}, {'role': 'user', 'content': 'What is 2 + 2?'}]
    """
    messages = [{"role": "user", "content": question}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def render_prompts(tokenizer: Any, conversations: Sequence[list[dict[str, str]]]) -> list[str]:
    """Render chats to the exact text the model sees, generation prompt included."""
    if not conversations:
        return []
    rendered = tokenizer.apply_chat_template(list(conversations), tokenize=False, add_generation_prompt=True)
    return [rendered] if isinstance(rendered, str) else list(rendered)


def check_system_prompt_survives(tokenizer: Any, system_prompt: Optional[str]) -> str:
    """Render one probe prompt and make sure the system prompt appears in it verbatim.

    Some templates drop the system role, rewrite it, or escape newlines (a `\\n` turning into a
    literal backslash-n); the model would then never see the format instructions the rewards check for.
    Returns the rendered probe text.

    >>> from pipeline.assets import load_qwen_tokenizer
    >>> text = check_system_prompt_survives(load_qwen_tokenizer(), "Line one.\\nLine two.")
    >>> text.startswith("<|im_start|>system\\nLine one.\\nLine two.<|im_end|>")
    True
    """
    template = getattr(tokenizer, "chat_template", None)
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if not template:
        raise ConfigError(
            "system_prompt",
            f"tokenizer {name!r} has no chat template, so prompts cannot be built as chats. Use an "
            "instruct/chat model (e.g. unsloth/Qwen2.5-1.5B-Instruct) or give the tokenizer a chat_template.",
        )
    try:
        (rendered,) = render_prompts(tokenizer, [build_prompt(system_prompt, PROBE_QUESTION)])
    except Exception as err:  # jinja raises on templates without a system role (e.g. Gemma's)
        raise ConfigError(
            "system_prompt",
            f"the chat template of {name!r} failed on a system + user prompt ({type(err).__name__}: {err}). "
            "If the template has no system role, set system_prompt to '' and put the instructions in the data.",
        ) from err
    if system_prompt and system_prompt not in rendered:
        raise ConfigError(
            "system_prompt",
            f"the chat template of {name!r} does not reproduce the system prompt verbatim (newlines "
            f"included). The model would not see the format instructions.\nsystem_prompt: {system_prompt!r}\n"
            f"rendered by the chat template: {rendered!r}\nUse a template that keeps the system message "
            "as written, or rewrite system_prompt so that it survives.",
        )
    return rendered


@dataclass
class PromptLengths:
    """Token counts of every prompt, with the time spent rendering and tokenizing."""

    counts: list[int]
    render_s: float
    tokenize_s: float


def count_prompt_tokens(tokenizer: Any, conversations: Sequence[list[dict[str, str]]]) -> PromptLengths:
    """Count each prompt's tokens as the model sees them: chat template + generation prompt.

    All chats are rendered to text first (jinja, per row), then tokenized in ONE batched call
    of the fast (Rust) tokenizer instead of a Python loop of calls. The counts equal
    `len(apply_chat_template(chat, tokenize=True, add_generation_prompt=True)["input_ids"])`.

    >>> from pipeline.assets import load_qwen_tokenizer
    >>> chat = build_prompt("You are a helpful assistant.", "What is 2 plus 2?")
    >>> count_prompt_tokens(load_qwen_tokenizer(), [chat]).counts
    [27]
    """
    start = time.perf_counter()
    texts = render_prompts(tokenizer, conversations)
    rendered = time.perf_counter()
    # add_special_tokens=False: the template already wrote every special token; a tokenizer
    # that adds a BOS would otherwise count (and, in training, get) it twice.
    # No attention masks: they would only double the Python lists built from the Rust output.
    input_ids = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"] if texts else []
    done = time.perf_counter()
    return PromptLengths(counts=[len(ids) for ids in input_ids], render_s=rendered - start,
                         tokenize_s=done - rendered)


def system_prompt_tokens(tokenizer: Any, system_prompt: Optional[str]) -> int:
    """Tokens of the system prompt with an empty user message and the generation prompt: every prompt's floor.

    >>> from pipeline.assets import load_qwen_tokenizer
    >>> system_prompt_tokens(load_qwen_tokenizer(), "You are a helpful assistant.")
    19
    """
    return count_prompt_tokens(tokenizer, [build_prompt(system_prompt, "")]).counts[0]


def length_stats(counts: Sequence[int]) -> dict[str, float | int]:
    """max / mean / p50 / p90 / p99 of the prompt lengths (numpy's linear percentiles).

    >>> length_stats([10, 20, 30, 40])
    {'count': 4, 'min': 10, 'max': 40, 'mean': 25.0, 'p50': 25.0, 'p90': 37.0, 'p99': 39.7}
    """
    import numpy as np

    if len(counts) == 0:
        return {"count": 0}
    values = np.asarray(counts)
    p50, p90, p99 = (round(float(p), 2) for p in np.percentile(values, [50, 90, 99]))
    return {
        "count": int(values.size),
        "min": int(values.min()),
        "max": int(values.max()),
        "mean": round(float(values.mean()), 2),
        "p50": p50,
        "p90": p90,
        "p99": p99,
    }


def round_up(value: int, multiple: int = PROMPT_LENGTH_MULTIPLE) -> int:
    """`value` rounded up to a multiple of `multiple`.

    >>> round_up(257), round_up(256), round_up(1)
    (272, 256, 16)
    """
    return -(-value // multiple) * multiple


@dataclass
class LengthBudget:
    """The prompt limit used to filter, before the data is seen, and where each number came from."""

    max_seq_length: int
    fixed_prompt_limit: Optional[int]  # max_prompt_length from the config, None = auto
    fixed_completion_limit: Optional[int]  # max_completion_length from the config, None = auto

    @property
    def filter_limit(self) -> int:
        """Prompts longer than this are over-long: the fixed limit, else what the completion leaves."""
        if self.fixed_prompt_limit is not None:
            return self.fixed_prompt_limit
        if self.fixed_completion_limit is not None:
            return self.max_seq_length - self.fixed_completion_limit
        return self.max_seq_length

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
        if self.fixed_prompt_limit is not None:
            prompt_limit = self.fixed_prompt_limit
        else:
            # auto: the longest kept prompt rounded up, but never past what the completion leaves.
            prompt_limit = min(round_up(longest_kept_prompt), self.filter_limit)
        if self.fixed_completion_limit is not None:
            completion_limit = self.fixed_completion_limit
        else:
            completion_limit = self.max_seq_length - prompt_limit
        if completion_limit <= 0:
            raise ConfigError(
                "max_completion_length",
                f"auto gives max_seq_length ({self.max_seq_length}) - max_prompt_length ({prompt_limit}) = "
                f"{completion_limit}: no room left for completions. Raise max_seq_length, or set a smaller "
                "max_prompt_length (longer prompts are then dropped or refused per overlong_policy).",
            )
        if prompt_limit + completion_limit > self.max_seq_length:
            raise ConfigError(
                "max_completion_length",
                f"max_prompt_length ({prompt_limit}) + max_completion_length ({completion_limit}) exceeds "
                f"max_seq_length ({self.max_seq_length}).",
            )
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
    """Give `tokenizer`'s chat template the trained system prompt as its default (with_default_system_prompt),
    before an export saves it: merged folders get it in tokenizer_config.json, a GGUF in its metadata (llama.cpp's
    converter reads the template of the folder save_pretrained_gguf writes). No prompt or no template: unchanged."""
    template = getattr(tokenizer, "chat_template", None)
    if system_prompt and isinstance(template, str) and template:
        tokenizer.chat_template = with_default_system_prompt(template, system_prompt)
