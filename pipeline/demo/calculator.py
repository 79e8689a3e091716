"""The CPU agent demo's task (`demo-calculator`, configs/cpu-agent-demo.yaml): 3-digit by 2-digit products, which a
2-layer model cannot work out but can copy into a `calculator` call (TRL's tool loop) and back out of its answer;
the tool; the warm-up conversations, whose sloppy teacher (`SKIP_TOOL_RATE`) leaves GRPO a lesson: call the tool.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.pipeline.demo.task import TASK_FILE, DemoTask, drawn_split

TOOL_NAME = "calculator"
TRAIN_SIZE, TEST_SIZE = 2000, 100
# Share of warm-up examples that answer at once (with the first operand); above 1/2 as task.py's SLOPPY_ANSWER_RATE.
SKIP_TOOL_RATE = 0.6

# "A jar holds 462 pens. How many pens in 91 jars?": words of one length put each number at the same distance from
# the end of the prompt, so the model learns to copy by position (~600 warm-up steps); with other lengths it did not.
CONTAINERS = ("bag", "jar", "tin", "can", "cup", "pot")  # 3 letters each, plural with "s"
ITEMS = ("pens", "nuts", "eggs", "keys", "pins", "buns", "toys", "figs")  # 4 letters each


def calculator(a: int, op: str, b: int) -> int:
    """Compute `a op b` exactly.

    Args:
        a: The left number.
        op: One of +, -, *.
        b: The right number.

    Returns:
        The result.
    """
    operations = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b}
    if op not in operations:
        raise ValueError(f"op must be one of + - *, got {op!r}")
    return operations[op]()


def _draw(rng: random.Random) -> Optional[dict[str, str]]:
    a, b, container, item = rng.randint(100, 999), rng.randint(11, 99), rng.choice(CONTAINERS), rng.choice(ITEMS)
    if a * b < 10_000:
        return None
    return {"question": f"A {container} holds {a} {item}. How many {item} in {b} {container}s?",
            "answer": str(a * b), "a": str(a), "b": str(b)}


def tool_conversation(a: int, b: int) -> list[dict[str, Any]]:
    """A problem's completion with the tool: the call, the tool's answer, the final answer.

    >>> [m["role"] for m in tool_conversation(347, 58)], tool_conversation(347, 58)[1]["content"]
    (['assistant', 'tool', 'assistant'], '20126')
    """
    call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"a": a, "op": "*", "b": b}}}
    result = str(calculator(a, "*", b))
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": TOOL_NAME, "content": result},
            {"role": "assistant", "content": f"<answer>{result}</answer>"}]


def _sloppy(rng: random.Random, problem: dict[str, str]) -> list[dict[str, Any]]:
    """About `SKIP_TOOL_RATE` answer at once with the first operand (wrong), the rest call `calculator`.

    >>> sorted({len(e["completion"]) for e in CALCULATOR.warmup_examples(20, "Use the calculator.", seed=0)})
    [1, 3]
    """
    a, b = int(problem["a"]), int(problem["b"])
    return ([{"role": "assistant", "content": f"<answer>{a}</answer>"}]
            if rng.random() < SKIP_TOOL_RATE else tool_conversation(a, b))


CALCULATOR = DemoTask("demo-calculator", lambda split: drawn_split(split, TRAIN_SIZE if split == "train" else TEST_SIZE,
                                                                  _draw, one_in=20),
                      lambda p: {"question": p["question"], "answer": p["answer"]}, _sloppy,
                      example_question="A cup holds 826 figs. How many figs in 22 cups?",
                      code_files=(Path(__file__).resolve(), TASK_FILE))
