"""TRL's agent arguments: `tools`, `environment_factory` and `rollout_func` (trainer arguments, not GRPOConfig
fields), user code found as a reward module is (rewards/user_code.py). `environment_factory` is one `module:Class`,
or a mapping of names to classes (TRL's multi-environment form; a JSON object on the command line). No torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from grpo_pipeline.env.text import excerpt
from grpo_pipeline.pipeline.config import ConfigError, GRPOArguments
from grpo_pipeline.pipeline.trainer.agent_boundary import guard_factory, guard_rollout_func, guard_tool
from grpo_pipeline.rewards.registry import load_user_object

# TRL's routing column in the multi-environment form (GRPOTrainer._generate_and_score_completions).
ENVIRONMENT_COLUMN = "environment"
# TRL's trainer arguments for agents, as options: each names user code (imported by resolve_agents)
AGENT_OPTIONS = ("tools", "environment_factory", "rollout_func")


def environment_specs(value: Any) -> dict[Optional[str], str]:
    """`environment_factory` as {name: spec}: {} when unset, {None: spec} for one class (TRL's single form).

    >>> environment_specs(None), environment_specs("envs:Math")
    ({}, {None: 'envs:Math'})
    >>> environment_specs('{"math": "envs:Math", "game": "envs:Game"}')
    {'math': 'envs:Math', 'game': 'envs:Game'}
    """
    if value is None or value == "":
        return {}
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ConfigError("environment_factory", f"{excerpt(value)} is not a JSON object ({err}); write "
                              '\'{"name": "module:Class", ...}\', or one module:Class.') from None
    if isinstance(value, dict):
        if not value or not all(isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in value.items()):
            raise ConfigError("environment_factory", f"got {excerpt(value)}; a mapping of environment names to "
                              "module:Class, e.g. {math: envs:MathEnv, game: envs:GameEnv}.")
        return {name: spec.strip() for name, spec in value.items()}
    if isinstance(value, str):
        return {None: value.strip()}
    raise ConfigError("environment_factory", f"got {excerpt(value)}; give module:Class, or a mapping of names to "
                      "module:Class.")


def agent_names(g: GRPOArguments) -> dict[str, Any]:
    """The agent options set in the GRPO section, by name, as effective_config.json and the manifest keep them.

    >>> agent_names(GRPOArguments())
    {}
    """
    envs = environment_specs(g.environment_factory)
    names: dict[str, Any] = {}
    if g.tools:
        names["tools"] = [str(spec) for spec in g.tools]
    if envs:
        names["environment_factory"] = envs[None] if list(envs) == [None] else dict(envs)
    if g.rollout_func:
        names["rollout_func"] = g.rollout_func
    return names


def rollout_func_note(rollout_func: Optional[str], command: str) -> Optional[str]:
    """The line a command outside training prints when a rollout_func is named (it takes the trainer, so only
    training can call it); None when none is.

    >>> rollout_func_note("r:roll", "grpo generate")[:60]
    'note: grpo generate does not call rollout_func r:roll (it ta'
    >>> rollout_func_note(None, "grpo generate") is None
    True
    """
    if not rollout_func:
        return None
    return (f"note: {command} does not call rollout_func {rollout_func} (it takes the trainer); it "
            "generates with the backend's generator (and the tool loop, when tools are named); docs/agents.md")


@dataclass(frozen=True)
class Agents:
    """The resolved objects: tools, environments ({None: factory} for TRL's single form), rollout_func; `specs` and
    `rollout_spec`: each one's name as the config gave it."""

    tools: tuple[Callable, ...] = ()
    environments: dict[Optional[str], Callable] = field(default_factory=dict)
    rollout_func: Optional[Callable] = None
    specs: dict[Any, str] = field(default_factory=dict)
    rollout_spec: Optional[str] = None

    @property
    def multi_environment(self) -> bool:
        return bool(self.environments) and None not in self.environments

    @property
    def uses_tools(self) -> bool:
        """Whether rollouts run TRL's tool loop (standalone tools, or an environment's methods)."""
        return bool(self.tools or self.environments)

    def guarded_tools(self) -> list[Callable]:
        """The standalone tools at the user-code boundary (agent_boundary.py guard_tool)."""
        return [guard_tool(tool, f"{tool.__name__} ({self.specs.get(id(tool), tool.__name__)})")
                for tool in self.tools]

    def guarded_factory(self, name: Optional[str]) -> Callable:
        """Environment `name`'s factory at the user-code boundary: what it builds has every call guarded."""
        return guard_factory(self.environments[name], self.specs.get(name, str(name)))

    def trainer_kwargs(self) -> dict[str, Any]:
        """The keyword arguments for trl.GRPOTrainer, only those set, each behind the user-code boundary."""
        kwargs: dict[str, Any] = {}
        if self.tools:
            kwargs["tools"] = self.guarded_tools()
        if self.environments:
            factories = {name: self.guarded_factory(name) for name in self.environments}
            kwargs["environment_factory"] = factories if self.multi_environment else factories[None]
        if self.rollout_func is not None:
            kwargs["rollout_func"] = guard_rollout_func(self.rollout_func, str(self.rollout_spec))
        return kwargs


def resolve_agents(g: GRPOArguments) -> Agents:
    """Import every tool, environment class and rollout_func the GRPO section `g` names; a name that does not resolve
    to something callable is a ConfigError naming the option and the fix."""
    specs: dict[Any, str] = {}
    tools = []
    for spec in g.tools or ():
        tool = _load("tools", str(spec), "tool")
        tools.append(tool)
        specs[id(tool)] = str(spec)
    names = [getattr(tool, "__name__", "") for tool in tools]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError("tools", f"two tools are named {name!r} ({', '.join(s for s in g.tools)}); the model "
                              "calls a tool by its function name, so each needs its own.")
    environment_names = environment_specs(g.environment_factory)
    environments = {name: _load("environment_factory", spec, "environment") for name, spec in environment_names.items()}
    specs.update(environment_names)
    rollout = _load("rollout_func", g.rollout_func, "rollout_func") if g.rollout_func else None
    return Agents(tuple(tools), environments, rollout, specs, g.rollout_func)


def _load(option: str, spec: str, kind: str) -> Callable:
    try:
        obj = load_user_object(spec, kind)
    except ValueError as err:
        raise ConfigError(option, str(err)) from None
    if not callable(obj):
        raise ConfigError(option, f"{spec!r} is a {type(obj).__name__}, not a "
                          f"{'class' if kind == 'environment' else 'function'}; name one with module:name.")
    return obj
