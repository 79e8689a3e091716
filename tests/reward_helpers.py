"""Completion builders shared by the reward tests (tests/test_rewards*.py)."""


def wrap(answer: str) -> str:
    return f"<reasoning>\nwork\n</reasoning>\n<answer>\n{answer}\n</answer>\n"


def as_chat(text):
    return [{"role": "assistant", "content": text}]
