"""Tools, environments and a rollout function for the agent tests, named by the tests' own options
(`tools: [agent_helpers:add]`); and the generation setting that makes a random tiny model call them.

Not a test module (pytest collects only test_*.py). Each call is appended to the file named by $AGENT_CALLS, one
JSON line, so a test reads what ran inside TRL's tool loop.
"""

from __future__ import annotations

import asyncio
import json
import os


def forced_text_bias(tokenizer, text: str, eos: bool = True) -> list:
    """TRL's `generation_kwargs.sequence_bias` that makes any model write `text` (then end its turn): every
    prefix of its token ids is biased, longer ones more, so the longest prefix written so far decides the next
    token. How a random tiny model with Qwen2.5's chat template is made to call tools, so that generation stays
    real while the rollouts take TRL's tool loop as a trained model's would (bench/overhead.py --tools too)."""
    ids = tokenizer.encode(text, add_special_tokens=False) + ([tokenizer.convert_tokens_to_ids("<|im_end|>")]
                                                              if eos else [])
    return [[ids[:k], 1000.0 * k] for k in range(1, len(ids) + 1)]


def tool_call_text(*calls: tuple[str, dict]) -> str:
    """Qwen2.5's tool-call format for the given (name, arguments)."""
    return "\n".join(f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'
                     for name, args in calls)


def _note(**record) -> None:
    path = os.environ.get("AGENT_CALLS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum.
    """
    _note(tool="add", a=a, b=b)
    return a + b


async def lookup(key: str) -> str:
    """Look a key up in a remote store.

    Args:
        key: The key to look up.

    Returns:
        The value stored under the key.
    """
    await asyncio.sleep(0)
    _note(tool="lookup", key=key)
    return f"value-of-{key}"


def undocumented(a: int) -> int:
    return a


def untyped(a):
    """Echo.

    Args:
        a: Anything.
    """
    return a


class Counter:
    """An environment that owns its reward: the number of `bump` calls of the rollout."""

    def __init__(self):
        self.count = 0

    def reset(self, **kwargs) -> str:
        self.count = 0
        _note(env="Counter", event="reset", columns=sorted(kwargs))
        return " (you may bump the counter)"

    def bump(self, by: int) -> int:
        """Bump the counter.

        Args:
            by: How much to add.

        Returns:
            The new count.
        """
        self.count += by
        _note(env="Counter", tool="bump", by=by)
        return self.count

    def get_reward(self) -> float:
        _note(env="Counter", event="get_reward", count=self.count)
        return float(self.count)


class Notes:
    """An environment without get_reward: the run's reward functions score it."""

    def reset(self, **kwargs) -> None:
        self.notes = []
        _note(env="Notes", event="reset")

    def write(self, text: str) -> str:
        """Write a note.

        Args:
            text: The note.

        Returns:
            What was written.
        """
        self.notes.append(text)
        _note(env="Notes", tool="write", text=text)
        return "ok"


class NoReset:
    def step(self, a: int) -> int:
        """Step.

        Args:
            a: A number.
        """
        return a


class BadMethod:
    def reset(self, **kwargs) -> None:
        return None

    def move(self, where):
        return where


def fixed_rollout(prompts, trainer):
    """A rollout_func: each prompt's chat template ids and a fixed completion (TRL hands it one prompt per rollout:
    the sampler has already repeated each one num_generations times), with an extra field that TRL forwards to
    the rewards."""
    tokenizer = trainer.processing_class
    prompt_ids, completion_ids = [], []
    for k, prompt in enumerate(prompts):
        prompt_ids.append(list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                             return_dict=False)))
        completion_ids.append(tokenizer.encode(f"<answer>{k}</answer>", add_special_tokens=False)
                              + [tokenizer.eos_token_id])
    _note(rollout="fixed_rollout", prompts=len(prompts), completions=len(completion_ids))
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
            "logprobs": [[0.0] * len(ids) for ids in completion_ids],
            "rollout_source": ["fixed"] * len(completion_ids)}


def saw_rollout_source(completions, rollout_source=None, **kwargs) -> list[float]:
    """A reward that records the rollout_func's extra field and scores the answer's digit."""
    _note(reward="saw_rollout_source", rollout_source=sorted(set(rollout_source or [])))
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(sum(ch.isdigit() for ch in t)) for t in texts]


def bump(by: int) -> int:
    """A standalone tool with the name of Counter's method.

    Args:
        by: How much.

    Returns:
        The amount.
    """
    return by


class ResetRaises:
    """An environment whose reset raises on the rows it is given."""

    def reset(self, **kwargs) -> None:
        raise KeyError("level")

    def get_reward(self) -> float:
        return 0.0


class RewardWrongType:
    """An environment whose get_reward returns a string."""

    def reset(self, **kwargs) -> None:
        return None

    def get_reward(self):
        return "high"


def rollout_without_logprobs(prompts, trainer):
    """A rollout_func that forgets TRL's `logprobs` key."""
    out = fixed_rollout(prompts, trainer)
    del out["logprobs"]
    return out
