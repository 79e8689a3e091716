"""Tool use as the health rules see it: a multi-turn completion's own turns (scored, not what a tool returned), the
share of rollouts that ended at max_tool_calling_iterations, and the rule that warns when no rollout has called a
tool after N logged steps. TRL hands a reward function each completion of a tool run as its messages
(GRPOTrainer._tool_call_loop): assistant turns (`tool_calls`), each followed by the `tool` messages.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from grpo_pipeline.pipeline.run.plots import as_number

TOOL_CALL_FREQUENCY = "tools/call_frequency"  # TRL's: tool calls per rollout
MAX_ITERATIONS_SHARE = "tools/max_iterations_share"  # ours: rollouts stopped at max_tool_calling_iterations


def has_tool_turns(completions: Sequence[Any]) -> bool:
    """Whether any completion holds a tool's message (a multi-turn rollout)."""
    return any(isinstance(c, list) and any(isinstance(m, dict) and m.get("role") == "tool" for m in c)
               for c in completions)


def own_text(completion: Any) -> Optional[str]:
    """The model's own turns of a multi-turn completion, joined; None when it wrote no text at all.

    >>> own_text([{"role": "assistant", "content": "let me add", "tool_calls": [{}]},
    ...           {"role": "tool", "content": "5"}, {"role": "assistant", "content": "<answer>5</answer>"}])
    'let me add\\n<answer>5</answer>'
    """
    if not isinstance(completion, list):
        return completion if isinstance(completion, str) else None
    texts = [m.get("content") for m in completion if isinstance(m, dict) and m.get("role") == "assistant"]
    texts = [t for t in texts if isinstance(t, str)]
    return "\n".join(texts) if texts else None


def ended_at_cap(completion: Any, max_iterations: int) -> bool:
    """The rollout ran max_iterations tool rounds and its last turn still asks for a tool (TRL stopped the loop).

    >>> call, result = {"role": "assistant", "content": "", "tool_calls": [{}]}, {"role": "tool", "content": "5"}
    >>> ended_at_cap([call, result, call], 1), ended_at_cap([call, result, {"role": "assistant", "content": "5"}], 1)
    (True, False)
    """
    if not isinstance(completion, list):
        return False
    turns = [m for m in completion if isinstance(m, dict) and m.get("role") == "assistant"]
    rounds = sum(1 for a, b in zip(completion, completion[1:])
                 if isinstance(a, dict) and isinstance(b, dict) and a.get("role") == "assistant"
                 and b.get("role") == "tool")
    return bool(turns and turns[-1].get("tool_calls")) and rounds >= max_iterations


def tool_metrics(completions: Sequence[Any], max_iterations: Optional[int]) -> dict[str, float]:
    """This batch's share of rollouts that ended at max_tool_calling_iterations (only when it is set)."""
    if not max_iterations or not completions:
        return {}
    return {MAX_ITERATIONS_SHARE: sum(ended_at_cap(c, max_iterations) for c in completions) / len(completions)}


class NoToolCalls:
    """Warns once when `steps` logged training steps with tools all show no tool call (TRL's tools/call_frequency
    is 0): the model may never have learned the call format. 0 turns the rule off."""

    def __init__(self, steps: int) -> None:
        self.steps, self.seen, self.called, self.warned = int(steps), 0, False, False

    def check(self, logs: dict[str, Any], step: int) -> Optional[str]:
        frequency = as_number(logs.get(TOOL_CALL_FREQUENCY))
        if not self.steps or frequency is None or self.warned:
            return None
        self.seen += 1
        self.called = self.called or frequency > 0
        if self.seen >= self.steps and not self.called:
            self.warned = True
            return (f"no rollout has called a tool in {self.seen} logged steps ({TOOL_CALL_FREQUENCY} is 0): the "
                    "model may never have learned the tool-call format of its chat template. Fix: a format warm-up "
                    "(sft_warmup_steps) on examples that call the tools, a system prompt that shows a call, or a "
                    "model fine-tuned for tool calling (docs/agents.md).")
        return None
