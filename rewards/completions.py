"""Get the generated text out of whatever TRL (or a user) hands a reward function: a string for standard
datasets, chat messages for conversational ones (more messages after a tool call); None for any other shape, which
the rewards score 0.0, so a malformed batch never crashes a training step. The other way round, `build_prompt`
writes one question as chat messages (the data path's and the demo's prompts).
"""

from __future__ import annotations

from typing import Any, Optional


def completion_text(completion: Any, role: str = "assistant") -> str | None:
    """The text of one completion (with `role="user"`, of the prompt's last user turn), or None: a string as it
    is, a message's content, of a list of messages the last of `role` (none: the last with text); content given as
    parts (`[{"type": "text", "text": ...}]`) is its text parts joined.

    >>> completion_text([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], role="user")
    'q'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        messages = [m for m in completion if isinstance(m, dict)]
        for message in reversed(messages):
            if message.get("role") == role:
                return _content_text(message.get("content"))
        for message in reversed(messages):
            text = _content_text(message.get("content"))
            if text is not None:
                return text
    return None


def completion_texts(completions: Any) -> list[str | None]:
    """One entry per completion: its text, or None. None is no completions; a single other object is one.

    >>> completion_texts(["a", [{"role": "assistant", "content": "b"}], None])
    ['a', 'b', None]
    """
    if completions is None:
        return []
    if isinstance(completions, (list, tuple)):
        return [completion_text(c) for c in completions]
    return [completion_text(completions)]


def _content_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = [p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "".join(parts) if parts else None
    return None


def build_prompt(system_prompt: Optional[str], question: str) -> list[dict[str, str]]:
    """Chat messages for one question (an empty system prompt: the user message alone, and the chat template may
    add its own default system message, as Qwen2.5's does).

    >>> build_prompt("Answer briefly.", "What is 2 + 2?")
    [{'role': 'system', 'content': 'Answer briefly.'}, {'role': 'user', 'content': 'What is 2 + 2?'}]
    """
    messages = [{"role": "user", "content": question}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages
