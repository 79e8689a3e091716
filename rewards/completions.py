"""Get the generated text out of whatever TRL (or a user) hands a reward function.

TRL passes `completions` as a list with one entry per generation. The entry is a plain
string for standard datasets and a list of chat messages for conversational ones
(`[{"role": "assistant", "content": "..."}]`, more messages after a tool call). Anything
else is an odd shape; we return None for it and the reward functions score it 0.0, so a
malformed batch never crashes a training step.

The other way round, `build_prompt` writes one question as chat messages: the prompts of the data path
(pipeline/data/) and of the built-in demo's warm-up (pipeline/demo/task.py) come from it.
"""

from __future__ import annotations

from typing import Any, Optional


def completion_text(completion: Any, role: str = "assistant") -> str | None:
    """The text of one completion (or, with `role="user"`, of the prompt's last user turn), or None.

    Accepted shapes:

    - `str`: returned as is.
    - a message dict with a `"content"` key.
    - a list of messages: the last message of `role` (default `"assistant"`) wins (after tool calls the final
      answer is in the last one); with no assistant role, the last message that has text.
    - message content given as a list of parts (`[{"type": "text", "text": ...}]`): the text
      parts joined.

    Everything else (None, numbers, bytes, nested lists, dicts without text) gives None.

    >>> completion_text("<answer>18</answer>")
    '<answer>18</answer>'
    >>> completion_text([{"role": "assistant", "content": "hi"}])
    'hi'
    >>> completion_text({"content": "hi"})
    'hi'
    >>> completion_text([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], role="user")
    'q'
    >>> completion_text(None) is None, completion_text(42) is None, completion_text([["x"]]) is None
    (True, True, True)
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
    """One entry per completion: its text, or None when it has none.

    `completions` is normally a list or tuple. None means "no completions" (empty result);
    any other single object is treated as one completion, so the output length always
    equals the number of completions the caller meant.

    >>> completion_texts(["a", [{"role": "assistant", "content": "b"}], None])
    ['a', 'b', None]
    >>> completion_texts(None)
    []
    """
    if completions is None:
        return []
    if isinstance(completions, (list, tuple)):
        return [completion_text(c) for c in completions]
    return [completion_text(completions)]


def _content_text(content: Any) -> str | None:
    """A message's content as text: a string, or the text parts of a multimodal list."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = [p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "".join(parts) if parts else None
    return None


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
