"""`--check`'s `agents` step: the tools, environments and rollout_func TRL will be handed, checked before the model
loads, each failure one ConfigError naming the tool, class or row and the fix.

What TRL needs, from TRL and transformers themselves: a tool's JSON schema as the chat template receives it
(transformers' `get_json_schema`: type hints and a Google-style docstring), a chat template that renders a whole
tool-calling exchange (TRL's `supports_tool_calling`), an environment with a callable `reset` whose public methods
are tools (TRL's GRPOTrainer reads them off the class, as here), an `environment` column naming a known environment
on every row in the multi-environment form, and a rollout_func taking (prompts, trainer).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from env.text import excerpt
from pipeline.config import ConfigError
from pipeline.trainer.agents import ENVIRONMENT_COLUMN, Agents

DOCS = "docs/agents.md"
# GRPOTrainer reads these off an environment class and never offers them as tools.
ENVIRONMENT_HOOKS = ("reset", "get_reward")


def environment_tools(cls: type) -> list[str]:
    """The methods TRL offers as tools: the public functions of the class but reset and get_reward."""
    return [name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if name not in ENVIRONMENT_HOOKS and not name.startswith("_")]


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


def check_environment(factory: Callable, spec: str) -> tuple[type, list[Callable], bool]:
    """One environment built as TRL builds it (`factory()`): its class, its tool methods (bound, as TRL offers
    them), whether it has get_reward."""
    try:
        instance = factory()
    except Exception as err:  # noqa: BLE001 - the user's constructor
        raise ConfigError("environment_factory", f"{spec}() raised {type(err).__name__}: {excerpt(str(err))}; TRL "
                          "builds each environment with no arguments (state comes from reset(**row)).") from None
    cls = type(instance)
    if not callable(getattr(instance, "reset", None)):
        raise ConfigError("environment_factory", f"{cls.__name__} ({spec}) has no callable `reset`; add "
                          "`def reset(self, **kwargs)` returning None or a string appended to the prompt "
                          f"(TRL's contract; {DOCS}).")
    methods = environment_methods(instance)
    for method in methods:
        tool_schema(method, "environment_factory", f"{cls.__name__}.{method.__name__} ({spec})")
    return cls, methods, callable(getattr(instance, "get_reward", None))


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


def check_agents(agents: Agents, model_name: str, tokenizer: Any, train: Any) -> str:
    """The `agents` check: what TRL's GRPOTrainer will be handed (`agents`, resolved once: agents.py resolve_agents)
    works with this model (`model_name`, its tokenizer) and data."""
    if not (agents.uses_tools or agents.rollout_func):
        return "no tools, environment_factory or rollout_func"
    lines, offered = [], list(agents.tools)
    for tool in agents.tools:
        tool_schema(tool, "tools", f"{tool.__name__} ({agents.specs.get(id(tool), tool.__name__)})")
    if agents.tools:
        lines.append(f"tools: {', '.join(tool.__name__ for tool in agents.tools)}")
    for name, factory in agents.environments.items():
        cls, methods, owns_reward = check_environment(factory, agents.specs[name])
        offered += methods
        lines.append(f"environment {name + ': ' if name else ''}{cls.__name__} (tools "
                     f"{', '.join(m.__name__ for m in methods) or 'none'}"
                     f"{'; its get_reward is a reward' if owns_reward else ''})")
    if agents.multi_environment:
        check_rows(train.dataset, [str(n) for n in agents.environments])
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
