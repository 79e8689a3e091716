"""The tool loop of `grpo rewards`, `grpo generate` and `grpo eval`: TRL's own, run outside a trainer.

trl.GRPOTrainer `_tool_call_loop` runs bound to a small host whose generation step (`_generate_single_turn`) is the
backend's Generator: parsing, calls, `tool` messages, length budget and cap are TRL's code. Hand-written here, as
TRL keeps it inline in GRPOTrainer `_generate_and_score_completions` and `__init__`: one environment per rollout
(`factory()`, `reset(**row)`), each rollout's tools and prompt rendered, and `get_reward()` after the loop.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import inspect
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Mapping, Optional, Sequence

from grpo_pipeline.env.text import excerpt
from grpo_pipeline.pipeline.backends import Completion
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.data.prompts import render_prompts
from grpo_pipeline.pipeline.trainer.agent_check import environment_methods, offered_tools
from grpo_pipeline.pipeline.trainer.agents import ENVIRONMENT_COLUMN, Agents


@dataclass
class ToolCall:
    name: str
    arguments: Any
    result: Optional[str]  # the `tool` message's content; None when the call was never run (the cap)
    error: Optional[str] = None  # what the tool raised (TRL's {"error": ...} result)


@dataclass
class Rollout:
    """One prompt's answer after the loop: TRL's messages, the final turn as a Completion (its tokens: the whole
    completion, tool results included, as TRL counts it), each call, and the environment's get_reward()."""

    messages: list[dict[str, Any]]
    completion: Completion
    calls: list[ToolCall] = field(default_factory=list)
    environment: Optional[str] = None
    env_reward: Optional[float] = None
    instance: Any = field(default=None, repr=False)  # TRL's `environments` reward keyword
    # Why the last turn's calls have no result: "max_tool_calling_iterations" (the cap), or "length" (TRL drops
    # results that would pass max_completion_length or the context); None when every call has its result.
    unanswered: Optional[str] = None

    @property
    def turns(self) -> int:
        return sum(1 for message in self.messages if message.get("role") == "assistant")

    def record(self) -> dict[str, Any]:
        return {"turns": self.turns, "tool_calls": [vars(call) for call in self.calls],
                "unanswered": self.unanswered, "environment": self.environment, "env_reward": self.env_reward}


@dataclass(frozen=True)
class LoopSettings:
    """What the tool loop reads of the run's settings: TRL's fields as trained and max_seq_length."""

    max_iterations: Optional[int]
    max_model_len: int
    chat_template_kwargs: Optional[dict[str, Any]] = None


def loop_settings(trl_args: Mapping[str, Any], max_seq_length: int) -> LoopSettings:
    """The tool loop's settings from TRL's arguments.

    >>> loop_settings({"max_tool_calling_iterations": 2}, 1024)
    LoopSettings(max_iterations=2, max_model_len=1024, chat_template_kwargs=None)
    """
    return LoopSettings(trl_args.get("max_tool_calling_iterations"), max_seq_length,
                        trl_args.get("chat_template_kwargs"))


def env_rewards(agents: Agents, rollouts: Sequence[Rollout]) -> dict[str, list[Optional[float]]]:
    """TRL's extra reward columns: one per environment class with a get_reward, another class's rollout None.

    >>> env_rewards(Agents(), [])
    {}
    """
    classes = [factory for factory in agents.environments.values() if callable(getattr(factory, "get_reward", None))]
    names = list(dict.fromkeys(getattr(c, "__name__", type(c).__name__) for c in classes))
    return {name: [r.env_reward if r.environment == name else None for r in rollouts] for name in names}


def tool_stats(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """TRL's tools/call_frequency and tools/failure_frequency over these rollouts.

    >>> tool_stats([])
    {'calls_per_rollout': 0.0, 'failures_per_call': 0.0}
    """
    calls = [call for rollout in rollouts for call in rollout.calls  # run: answered, or answered then dropped
             if call.result is not None or rollout.unanswered == "length"]
    failed = sum(1 for call in calls if call.error is not None)
    return {"calls_per_rollout": len(calls) / len(rollouts) if rollouts else 0.0,
            "failures_per_call": failed / len(calls) if calls else 0.0}


def describe(rollout: Rollout, width: int = 80) -> list[str]:
    """The rollout as lines: each turn, each call with its arguments and its result (or error)."""
    lines, calls = [], iter(rollout.calls)
    turn = 0
    for message in rollout.messages:
        if message.get("role") != "assistant":
            continue
        turn += 1
        content = message.get("content") if isinstance(message.get("content"), str) else ""
        own = excerpt(content, width) if content.strip() else ""
        lines.append(f"turn {turn}: {own}" if own else f"turn {turn}:")
        for _ in message.get("tool_calls") or []:
            call = next(calls)
            args = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items()) if isinstance(call.arguments, dict) \
                else repr(call.arguments)
            outcome = (f"error: {excerpt(call.error, width)}" if call.error is not None else
                       excerpt(call.result, width) if call.result is not None else
                       "not run (max_tool_calling_iterations)" if rollout.unanswered != "length" else
                       "result dropped: it would pass max_completion_length or max_seq_length")
            lines.append(f"  {call.name}({args}) -> {outcome}")
    return lines


def answer(generator: Any, tokenizer: Any, agents: Optional[Agents], loop: Optional[LoopSettings],
           prompts: Sequence[Any], rows: Sequence[dict[str, Any]], max_tokens: int,
           **sampling: Any) -> tuple[list[Completion], Optional[list[Rollout]]]:
    """Each prompt answered through the tool loop when `agents` use tools (with its rollouts), else in one turn."""
    if agents is not None and agents.uses_tools:
        rollouts = run_as_trained(loop, generator, tokenizer, agents, prompts, rows, max_tokens, **sampling)
        return [r.completion for r in rollouts], rollouts
    return generator.generate(render_prompts(tokenizer, list(prompts)), max_tokens=max_tokens, **sampling), None


def run_as_trained(loop: LoopSettings, generator: Any, tokenizer: Any, agents: Agents,
                   prompts: Sequence[list[dict[str, Any]]], rows: Sequence[dict[str, Any]], max_tokens: int,
                   **sampling: Any) -> list[Rollout]:
    """Answer each chat prompt as training's rollouts do, the tools live; `rows[i]`: prompt i's row (for `reset`)."""
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        parse_response,
    )

    # As GRPOTrainer.__init__: TRL's response template (or legacy schema) for a known chat template, and a template
    # that is not prefix-preserving swapped for TRL's training-safe one.
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            add_response_schema(tokenizer)
        except ValueError as err:
            raise ConfigError("tools", f"the tokenizer's chat template has no response parser TRL knows ({err}); "
                              "the tool loop cannot read the model's calls. Use the model's own template (Qwen2.5's "
                              "works), as training did.") from None
    chat_template = None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)
    kwargs = dict(loop.chat_template_kwargs or {})
    environments = [_environment(agents, row) for row in rows]
    prompts = [_reset(copy.deepcopy(list(prompt)), env, row, agents.multi_environment)  # the loop appends to them
               for prompt, env, row in zip(prompts, environments, rows, strict=True)]
    tools = agents.guarded_tools()  # behind the user-code boundary
    offered = [offered_tools(tools, environment_methods(env), type(env).__name__) if env is not None else tools
               for env in environments]
    prompt_ids = [list(tokenizer.apply_chat_template(prompt, tools=tools or None, chat_template=chat_template,
                                                     add_generation_prompt=True, tokenize=True, return_dict=False,
                                                     **kwargs))
                  for prompt, tools in zip(prompts, offered)]
    first = generator.generate(prompt_ids, max_tokens=max_tokens, **sampling)
    completion_ids = [list(c.ids) for c in first]
    completions = [[parse_response(tokenizer, ids, prefix=prompt_ids[i])] for i, ids in enumerate(completion_ids)]
    host = _host(generator, tokenizer, offered, environments, chat_template, kwargs, max_tokens,
                 sys.maxsize if loop.max_iterations is None else loop.max_iterations, loop.max_model_len, sampling)
    try:
        _, completions, completion_ids, *_ = host._tool_call_loop(prompts, prompt_ids, completion_ids, completions,
                                                                  None, None, {})
        rewards = [_env_reward(env, host.async_loop) for env in environments]
    finally:
        host.close()
    done = [_rollout(messages, ids, env, reward) for messages, ids, env, reward in
            zip(completions, completion_ids, environments, rewards, strict=True)]
    for rollout in done:
        if any(call.result is None for call in rollout.calls):
            capped = loop.max_iterations is not None and rollout.turns - 1 >= loop.max_iterations
            rollout.unanswered = "max_tool_calling_iterations" if capped else "length"
    return done


def _host(generator: Any, tokenizer: Any, offered: list[list[Any]], environments: list[Optional[Any]],
          chat_template: Any, kwargs: dict[str, Any], max_tokens: int, max_iterations: int, max_model_len: int,
          sampling: dict[str, Any]) -> Any:
    """What GRPOTrainer._tool_call_loop reads off `self`, the backend's generator its generation step."""
    from grpo_pipeline.pipeline.config.trl_fields import grpo_trainer_module

    grpo_trainer_module()  # TRL's tool loop on our generator: TRL's vLLM is never asked
    from trl import GRPOTrainer
    from trl.trainer.utils import shutdown_event_loop_in_daemon, start_event_loop_in_daemon

    class LoopHost(SimpleNamespace):
        _tool_call_loop = GRPOTrainer._tool_call_loop
        _get_tool_suffix_ids = GRPOTrainer._get_tool_suffix_ids

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            done = generator.generate(prompt_ids, max_tokens=max_tokens, **sampling)
            return [list(c.ids) for c in done], None

        def close(self) -> None:
            if self.async_loop is not None:
                shutdown_event_loop_in_daemon(self._loop_thread, self.async_loop)

    sync = [{t.__name__: t for t in tools if not inspect.iscoroutinefunction(t)} for tools in offered]
    async_ = [{t.__name__: t for t in tools if inspect.iscoroutinefunction(t)} for tools in offered]
    thread = loop = None
    if any(async_) or any(inspect.iscoroutinefunction(getattr(env, "get_reward", None)) for env in environments):
        thread, loop, ready = start_event_loop_in_daemon(name="grpo-tool-loop")
        ready.wait()
    return LoopHost(
        processing_class=tokenizer, _tokenizer=tokenizer, _is_vlm=False, chat_template=chat_template,
        chat_template_kwargs=kwargs, tools=[t for tools in offered for t in tools], _sync_tool_dicts=sync,
        _async_tool_dicts=async_, async_loop=loop, _loop_thread=thread, use_vllm=False,
        model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=max_model_len)),
        max_completion_length=max_tokens, max_tool_calling_iterations=max_iterations)


def _environment(agents: Agents, row: dict[str, Any]) -> Optional[Any]:
    """A fresh, guarded instance of the row's environment (TRL pools them), or None."""
    if not agents.environments:
        return None
    name = row.get(ENVIRONMENT_COLUMN) if agents.multi_environment else None
    if name not in agents.environments:
        raise ConfigError("environment_factory", f"a prompt names environment {name!r}; the environments "
                          f"--environment_factory names are {sorted(agents.environments)}: give each prompt an "
                          f"`{ENVIRONMENT_COLUMN}` field naming one (TRL's multi-environment form).")
    return agents.guarded_factory(name)()


def _reset(prompt: list[dict[str, Any]], env: Optional[Any], row: dict[str, Any], multi: bool) -> list[dict[str, Any]]:
    """As GRPOTrainer._generate_and_score_completions: `reset(**row)`; a returned string extends the last message."""
    if env is None:
        return prompt
    observation = env.reset(**({k: v for k, v in row.items() if k != ENVIRONMENT_COLUMN} if multi else row))
    if isinstance(observation, str):
        return [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + observation}]
    return prompt


def _env_reward(env: Optional[Any], loop: Any) -> Optional[float]:
    """get_reward() after the rollout (an async one on the loop's thread, as TRL awaits it), or None."""
    get_reward = getattr(env, "get_reward", None) if env is not None else None
    if not callable(get_reward):
        return None
    if inspect.iscoroutinefunction(get_reward):
        value = (asyncio.run_coroutine_threadsafe(get_reward(), loop).result() if loop is not None
                 else asyncio.run(get_reward()))
    else:
        value = get_reward()
    return None if value is None else float(value)


def _rollout(messages: list[dict[str, Any]], ids: list[int], env: Optional[Any], reward: Optional[float]) -> Rollout:
    final = next((m for m in reversed(messages) if m.get("role") == "assistant"), {})
    text = final.get("content") if isinstance(final.get("content"), str) else ""
    calls: list[ToolCall] = []
    pending: list[ToolCall] = []
    for message in messages:
        if message.get("role") == "assistant":
            pending = [ToolCall(call.get("function", call).get("name", "?"), call.get("function", call).get(
                "arguments"), None) for call in message.get("tool_calls") or []]
            calls += pending
        elif message.get("role") == "tool":  # TRL appends sync results first, then async ones: matched by name
            call = next((c for c in pending if c.name == message.get("name") and c.result is None), None)
            if call is not None:
                call.result = str(message.get("content"))
                call.error = _error(call.result)
    return Rollout(messages, Completion(text, len(ids), ids), calls, type(env).__name__ if env is not None else None,
                   reward, env)


def _error(content: str) -> Optional[str]:
    """The message of TRL's failed-call result (`str({"error": str(exception)})`), else None."""
    if not content.startswith("{'error': "):
        return None
    try:
        value = ast.literal_eval(content)
    except (ValueError, SyntaxError):
        return None
    return str(value["error"]) if isinstance(value, dict) and list(value) == ["error"] else None
