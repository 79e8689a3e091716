"""`--check`'s `agents` step: the tools, environments and rollout_func TRL will be handed, checked before the model
loads with TRL's and transformers' own tests (`get_json_schema`, `supports_tool_calling`), each failure one
ConfigError naming the tool, class or row and the fix.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Optional, Sequence

from grpo_pipeline.env.text import excerpt
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.trainer.agent_boundary import AgentFailure, environment_tools, guard_factory
from grpo_pipeline.pipeline.trainer.agents import ENVIRONMENT_COLUMN, Agents

DOCS = "docs/agents.md"


def environment_methods(instance: Any) -> list[Callable]:
    """The tools an environment instance offers, bound to it, as TRL offers them."""
    return [getattr(instance, name) for name in environment_tools(type(instance))]


def tool_schema(tool: Callable, option: str, label: str) -> dict:
    """The tool's schema as the chat template receives it, or a ConfigError naming it and the fix."""
    # lazy: transformers' chat helpers, at check time only (the import is light; no torch)
    from transformers.utils.chat_template_utils import get_json_schema

    try:
        return get_json_schema(tool)
    except Exception as err:  # noqa: BLE001 - TypeHintParsingException, DocstringParsingException, ...
        raise ConfigError(option, f"tool {label} cannot be described to the model: {err}. Give every argument a "
                          "type hint and write a Google-style docstring (a summary line, then `Args:` with one line "
                          f"per argument); {DOCS}.") from None


def check_environment(factory: Callable, spec: str, rows: list[dict[str, Any]]) -> tuple[type, list[Callable], bool]:
    """One environment built and called as TRL does (`reset(**row)` and `get_reward()` on each prepared row of
    `rows`, behind the user-code boundary): its class, its tool methods (bound), whether it has get_reward. A raise,
    or a value TRL cannot take, is a ConfigError naming `Class.method`, the row and what came back."""
    try:
        instance = guard_factory(factory, spec)()
    except AgentFailure as err:
        raise ConfigError("environment_factory", str(err)) from None
    cls = type(instance)
    if not callable(getattr(cls, "reset", None)):
        raise ConfigError("environment_factory", f"{cls.__name__} ({spec}) has no callable `reset`; add "
                          "`def reset(self, **kwargs)` returning None or a string appended to the prompt "
                          f"(TRL's contract; {DOCS}).")
    methods = environment_methods(instance)
    for method in methods:
        tool_schema(method, "environment_factory", f"{cls.__name__}.{method.__name__} ({spec})")
    owns_reward = callable(getattr(cls, "get_reward", None))
    for row in rows:
        try:
            _run(instance.reset(**row))
            if owns_reward:
                _run(instance.get_reward())
        except AgentFailure as err:
            raise ConfigError("environment_factory", f"{err} It was called before the model loads, as the trainer "
                              f"calls it, on a prepared row ({spec}).") from None
    return cls, methods, owns_reward


def _run(value: Any) -> Any:
    """A coroutine (an async reset or get_reward) run to its end, as TRL awaits it; anything else as it is."""
    if inspect.isawaitable(value):
        return asyncio.run(value)
    return value


def offered_tools(tools: list[Callable], methods: list[Callable], environment: str,
                  spec: str = "") -> list[Callable]:
    """The tools one rollout offers the model: the standalone ones, then its environment's methods. Two with one name
    are refused: TRL renders both schemas and runs only the environment's (GRPOTrainer._generate_and_score_completions
    keeps the last)."""
    names = {tool.__name__: tool for tool in tools}
    for method in methods:
        if method.__name__ in names:
            raise ConfigError("tools", f"tool {method.__name__!r} and the environment method "
                              f"{environment}.{method.__name__}{f' ({spec})' if spec else ''} have one name. The model calls a tool by its name; "
                              "TRL would show it both and run only the environment's. Rename one of them.")
    return [*tools, *methods]


def rows_for(dataset: Any, name: Optional[str], multi: bool, count: int = 2) -> list[dict[str, Any]]:
    """The first `count` prepared rows environment `name` is reset with (without the routing column)."""
    rows = []
    for row in dataset:
        if multi and row.get(ENVIRONMENT_COLUMN) != name:
            continue
        rows.append({k: v for k, v in row.items() if k != ENVIRONMENT_COLUMN} if multi else dict(row))
        if len(rows) == count:
            break
    return rows


def check_template(tokenizer: Any, prompt: Any, tools: list[Callable], option: str, model: str) -> None:
    """The chat template renders a tool exchange (TRL's own test) and the tool list it is given."""
    # lazy: trl imports torch (the check has loaded the backend by now)
    from trl.chat_template_utils import supports_tool_calling

    if not supports_tool_calling(tokenizer):
        raise ConfigError(option, f"the chat template of {model} cannot render tool calls (TRL's "
                          "supports_tool_calling: user -> assistant with tool_calls -> tool). Use a model whose "
                          "template supports tools, e.g. Qwen2.5-Instruct (tiny-qwen2.5 to try on CPU).")
    if not isinstance(prompt, list):
        raise ConfigError(option, "tools need conversational prompts (lists of messages), as TRL parses the "
                          "model's turns for tool calls; give question_field rows (made into chats) or a `prompt` "
                          "column of messages.")
    rendered = tokenizer.apply_chat_template(prompt, tools=tools, tokenize=False, add_generation_prompt=True)
    missing = [tool.__name__ for tool in tools if tool.__name__ not in rendered]
    if missing:
        raise ConfigError(option, f"the chat template of {model} leaves tool(s) {', '.join(missing)} out of the "
                          "prompt, so the model would never learn they exist. Use a template that renders `tools`.")


def check_rows(dataset: Any, names: list[str]) -> None:
    """Every row of the multi-environment form names one of the environments in its `environment` column."""
    if ENVIRONMENT_COLUMN not in dataset.column_names:
        raise ConfigError("dataset_name", f"environment_factory maps {', '.join(names)}, so each row needs an "
                          f"`{ENVIRONMENT_COLUMN}` column naming one; the training set has "
                          f"{', '.join(dataset.column_names)}. Add the column, or give one module:Class.")
    ids = dataset["grpo_id"] if "grpo_id" in dataset.column_names else range(len(dataset))
    for row_id, value in zip(ids, dataset[ENVIRONMENT_COLUMN]):
        if value not in names:
            raise ConfigError("dataset_name", f"row {row_id}: environment {excerpt(value)} is not one of "
                              f"environment_factory's ({', '.join(names)}); fix the row or add it to the mapping.")


def check_agents(agents: Agents, model_name: str, tokenizer: Any, train: Any,
                 rewards: Sequence[Any] = ("_",)) -> str:
    """The `agents` check: what TRL's GRPOTrainer will be handed works with this model and data; `rewards`: the run's
    reward_funcs (empty: an environment's get_reward must be the reward)."""
    if not (agents.uses_tools or agents.rollout_func):
        return "no tools, environment_factory or rollout_func"
    lines, offered, owners = [], list(agents.tools), []
    for tool in agents.tools:
        tool_schema(tool, "tools", f"{tool.__name__} ({agents.specs.get(id(tool), tool.__name__)})")
    if agents.tools:
        lines.append(f"tools: {', '.join(tool.__name__ for tool in agents.tools)}")
    if agents.multi_environment:
        check_rows(train.dataset, [str(n) for n in agents.environments])
    for name, factory in agents.environments.items():
        rows = rows_for(train.dataset, name, agents.multi_environment)
        cls, methods, owns_reward = check_environment(factory, agents.specs[name], rows)
        offered += offered_tools(list(agents.tools), methods, cls.__name__, agents.specs[name])[len(agents.tools):]
        owners += [cls.__name__] if owns_reward else []
        called = ("no prepared row names it" if not rows else
                  f"reset{' and get_reward' if owns_reward else ''} called on prepared rows")
        lines.append(f"environment {name + ': ' if name else ''}{cls.__name__} (tools "
                     f"{', '.join(m.__name__ for m in methods) or 'none'}"
                     f"{'; its get_reward is a reward' if owns_reward else ''}; {called})")
    if not rewards and not owners:
        raise ConfigError("reward_funcs", "the list is empty and no environment has a get_reward, so nothing scores "
                          "the rollouts (TRL needs one reward source). Name a reward, or give the environment a "
                          f"`get_reward(self) -> float` ({DOCS}).")
    if offered:
        option = "tools" if agents.tools else "environment_factory"
        check_template(tokenizer, train.dataset[0]["prompt"], offered, option, model_name)
        lines.append("the chat template renders them")
    if agents.rollout_func is not None:
        try:
            inspect.signature(agents.rollout_func).bind(["prompt"], object())
        except (TypeError, ValueError):
            raise ConfigError("rollout_func", f"{agents.rollout_spec} must take (prompts, trainer), as TRL calls "
                              "it, and return prompt_ids, completion_ids and logprobs.") from None
        lines.append(f"rollout_func {agents.rollout_func.__name__}")
    return "; ".join(lines)
