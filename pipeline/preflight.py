"""The checks before anything heavy loads (`run_checks`): the contract of `grpo train --check` (all, as one JSON
object) and of the run, which calls them before the model loads (the first failure: one message, exit 2). When
`--check` passes, the run does not fail for any of these reasons. The data steps prepare what the run reads into the
cache, with the tokenizer only; the data, rewards, LoRA and engine checks import torch (and vLLM) after the backend's
`prepare_environment`; the rest load no weights and probe the network at most once.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Optional

from grpo_pipeline.env.locations import absolute_path
from grpo_pipeline.env.path_check import PathError, expand, nearest_existing
from grpo_pipeline.env.paths import shell_command
from grpo_pipeline.env.text import excerpt
from grpo_pipeline.pipeline.backends import choose_backend, load_backend, refuse_gpu_recipe_without_cuda
from grpo_pipeline.pipeline.backends.vllm_engine import check_run_engine
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig, resolve_optim, trl_training_args, validate
from grpo_pipeline.pipeline.config.paths import config_paths
from grpo_pipeline.pipeline.data import model_check
from grpo_pipeline.pipeline.data import tokenizer as tokenizers  # through the module: tests replace load_tokenizer
from grpo_pipeline.pipeline.data.columns import ANSWER, removes_unused_columns
from grpo_pipeline.pipeline.data.prepare import DataError
from grpo_pipeline.pipeline.data.prompts import completion_like
from grpo_pipeline.pipeline.data.report import accounting_line, prompt_line
from grpo_pipeline.pipeline.data.run_data import RunData, check_warmup, prepare_eval, prepare_train, without_a_held_out_set
from grpo_pipeline.pipeline.data.source_spec import DataFileError
from grpo_pipeline.pipeline.plan.fit import memory_check
from grpo_pipeline.pipeline.run.checkpoints import (
    PREVIOUS_DIR,
    checkpoint_problem,
    complete_checkpoints,
    previous_run_entries,
)
from grpo_pipeline.pipeline.data.lora_targets import check_lora_targets
from grpo_pipeline.pipeline.run.decisions import RunDecisions, eval_key, reward_specs, run_decisions
from grpo_pipeline.pipeline.run.nodes import check_nodes
from grpo_pipeline.pipeline.run.resume import contents_problem, data_mismatch, resume_key, resume_mismatch
from grpo_pipeline.pipeline.trainer.agent_check import check_agents
from grpo_pipeline.pipeline.trainer.agents import resolve_agents
from grpo_pipeline.pipeline.trainer.build import check_effective_config, check_grpo_config
from grpo_pipeline.rewards import get_reward_funcs
from grpo_pipeline.rewards.contract import RewardFailure, probe_rewards
from grpo_pipeline.rewards.trl_source import reward_call_kwargs

# report_to name -> the module transformers' integration imports, and how to install it.
REPORTER_PACKAGES = {
    "tensorboard": ("tensorboard", "pip install 'grpo-pipeline[tensorboard]'  (or: pip install tensorboard)"),
    "wandb": ("wandb", "pip install wandb, then `wandb login`"),
}


@dataclass
class Check:
    name: str
    ok: bool
    message: str


def check_output_dir(paths: dict[str, Any]) -> str:
    """output_dir (and data_cache_dir) take new files and are not inside the model or data they read."""
    path = config_paths(paths, "output_dir", "data_cache_dir")["output_dir"]
    existing = nearest_existing("output_dir", path)
    free_gib = shutil.disk_usage(existing).free / 2**30
    return (f"{path} is writable" + ("" if existing == path else f" (will be created in {existing})")
            + f"; {free_gib:.1f} GiB free there")


def check_report_to(names: list[str], output_dir: str) -> str:
    notes = []
    for name in names:
        module, fix = REPORTER_PACKAGES.get(name, (name, f"pip install {name}"))
        if importlib.util.find_spec(module) is None:
            raise ConfigError("report_to", f"`{name}` needs the {module} package, which is not installed. "
                              f"Install it: {fix}; or set report_to: none.")
        if name == "tensorboard":
            notes.append(tensorboard_hint(output_dir))
    return "; ".join(notes) or ("report_to: " + (", ".join(names) or "none"))


def tensorboard_hint(output_dir: str | os.PathLike[str]) -> str:
    """Where transformers' TensorBoardCallback writes (TENSORBOARD_LOGGING_DIR, else output_dir/runs/<run>)."""
    logdir = os.environ.get("TENSORBOARD_LOGGING_DIR") or os.path.join(output_dir, "runs")
    return f"tensorboard logs go to {logdir}: run `{shell_command('tensorboard', '--logdir', logdir)}`"


class NotChecked(ConfigError):
    """A data step whose input (the tokenizer, the training data) failed its own check."""


def data_checks(cfg: PipelineConfig, done: dict[str, Any]) -> list[tuple[str, Callable[[], Any]]]:
    """The data steps (prepare_run_data's, each reported on its own, writing only the cache); one whose input failed
    fails too. What they work out is kept in `done` (tokenizer, train, rewards, agents) for the run's decisions."""

    def prepared() -> str:
        # grpo_pipeline.env.path_check's, first
        config_paths(cfg.to_dict(), "dataset_name", "eval_dataset_name", "data_cache_dir")
        m = cfg.model
        try:
            done["tokenizer"] = tokenizers.load_tokenizer(m.model_name_or_path, m.trust_remote_code, m.model_source)
        except ConfigError:
            raise
        except (OSError, ValueError) as err:
            raise ConfigError("model_name_or_path", f"the tokenizer of {excerpt(m.model_name_or_path)} could not "
                              f"be loaded to check the data ({type(err).__name__}: {err}).") from None
        done["train"] = prepare_train(cfg, done["tokenizer"], write_report=False)
        g = cfg.grpo
        checkpoint = resume_target(g.resume, g.output_dir)
        changed = (data_mismatch(checkpoint, cfg.data.dataset_name, done["train"].dataset, g.resume_other_data)
                   if checkpoint is not None else None)
        if changed:
            raise ConfigError("dataset_name", changed)
        report = done["train"].report
        return f"train: {accounting_line(report)}\n    prompts: {prompt_line(report)}"

    def needs(key: str) -> Any:
        if key not in done:
            raise NotChecked("dataset_name", "not checked: the data check failed (see its message).")
        return done[key]

    def evaluation() -> str:
        if not cfg.eval.uses_eval_set():
            return "no evaluation (eval_before and eval_after are false, eval_steps is 0)"
        run_data = RunData(needs("train"), prepare_eval(cfg, needs("tokenizer"), write_report=False))
        return "; ".join(filter(None, [run_data.eval_rows.line(), run_data.overlap_warning()]))

    def agents() -> str:  # tools, environments: resolved once, here, for the run too
        tokenizer, train = needs("tokenizer"), needs("train")
        done["agents"] = resolve_agents(cfg.grpo)
        return check_agents(done["agents"], cfg.model.model_name_or_path, tokenizer, train, cfg.grpo.reward_funcs)

    return [("data", prepared), ("eval", evaluation), ("warmup", lambda: check_warmup(cfg, needs("train"))),
            ("rewards", lambda: check_rewards(cfg, needs("tokenizer"), needs("train"), kept=done)),
            ("agents", agents)]


def reward_probe_batch(cfg: PipelineConfig, tokenizer: Any,
                       train: Any) -> tuple[list[Any], list[Any], dict[str, Any], str]:
    """prompts, completions and keywords as TRL's `GRPOTrainer._calculate_rewards` passes them: two prepared prompts
    with completions a reward will meet (right, wrong, plain text, empty)."""
    dataset = train.dataset.select(range(min(2, len(train.dataset))))
    columns = {name: list(dataset[name]) for name in dataset.column_names}
    texts = [[f"<reasoning>\nWorking it out.\n</reasoning>\n<answer>\n{answer or 0}\n</answer>\n",
              "<reasoning>\nA guess.\n</reasoning>\n<answer>\n0\n</answer>\n", f"The answer is {answer or 0}.", ""]
             for answer in columns[ANSWER]]
    per_prompt = len(texts[0]) if texts else 0
    repeat = lambda values: [value for value in values for _ in range(per_prompt)]  # noqa: E731
    prompts = repeat(columns["prompt"])
    flat = [text for group in texts for text in group]
    completions = [completion_like(prompt, text) for prompt, text in zip(prompts, flat, strict=True)]
    kwargs = reward_kwargs_outside_training(cfg.grpo.max_steps, removes_unused_columns(cfg.trl), tokenizer,
                                            {key: repeat(values) for key, values in columns.items()}, flat)
    return prompts, completions, kwargs, f"{len(completions)} completions of {len(texts)} prepared prompts"


def reward_kwargs_outside_training(max_steps: int, remove_unused_columns: bool, tokenizer: Any,
                                   columns: dict[str, list[Any]], texts: list[str]) -> dict[str, Any]:
    """The keywords of a reward call made without a trainer, by TRL's rule (rewards/trl_source.py): the columns,
    `completion_ids` of `texts`, a fresh `trainer_state` and `log_extra` / `log_metric` that keep nothing."""
    from transformers import TrainerState  # lazy: transformers imports torch

    trainer_objects = {"trainer_state": TrainerState(max_steps=max_steps),
                       "log_extra": lambda column, values: None, "log_metric": lambda name, value: None}
    return reward_call_kwargs(columns, remove_unused_columns, trainer_objects,
                              [tokenizer.encode(text, add_special_tokens=False) for text in texts])


def check_rewards(cfg: PipelineConfig, tokenizer: Any, train: Any, kept: Optional[dict[str, Any]] = None) -> str:
    """Call every reward as the trainer will, on the run's prepared prompts: a raise, a wrong signature or length, a
    non-number or NaN/inf is refused, naming the function. A user's module is probed in a fresh instance, so the
    run's is never called; `kept["rewards"]`: the resolved rewards, for the run's decisions."""
    prompts, completions, kwargs, what = reward_probe_batch(cfg, tokenizer, train)
    g = cfg.grpo
    try:
        funcs = get_reward_funcs(list(g.reward_funcs), fresh=True) if g.reward_funcs else []  # get_reward's
        if kept is not None:
            kept["rewards"] = funcs
        lines = probe_rewards(funcs, prompts, completions, kwargs, timeout=g.reward_timeout)
    except RewardFailure as err:
        removed = (" remove_unused_columns: true, so TRL passes the rewards no column of the dataset (it keeps "
                   "only `prompt`); set remove_unused_columns: false (TRL's GRPO default) to pass them."
                   if removes_unused_columns(cfg.trl) else "")
        raise ConfigError("reward_funcs", f"{str(err).rstrip('.')}. It was called before the model loads, as the "
                          f"trainer calls it, on {what}.{removed} The contract: docs/rewards.md.") from None
    except ValueError as err:  # a name that does not resolve (validate() names it first in a run)
        raise ConfigError("reward_funcs", str(err)) from None
    return f"called on {what}: " + ("; ".join(lines) or "none (an environment's get_reward is the reward)")


def resume_target(resume: str, output_dir: str) -> Optional[Path]:
    """The checkpoint a run would resume: with auto the newest complete one, as resolve_resume picks it (without
    moving broken ones aside). None: a fresh start, or a --resume that check_resume refuses."""
    if resume == "auto":
        complete = complete_checkpoints(absolute_path(output_dir))
        return complete[-1] if complete else None
    try:
        path = absolute_path(resume) if resume != "never" else None
    except ValueError:  # an empty path or an unset $VAR: check_resume names it
        return None
    return path if path is not None and path.is_dir() else None


def check_resume(resume: str, output_dir: str, mismatch: Callable[[Path], Optional[str]]) -> str:
    """`resume` is `auto`, `never`, or a complete checkpoint folder, whose weights are of this config's shape
    (`mismatch(checkpoint)` says how they differ, else None); anything else fails before the data and model load."""
    path = resume_target(resume, output_dir)
    if path is None and resume in ("auto", "never"):
        said = "resume: never" if resume == "never" else "resume: auto (no checkpoint yet: a fresh start)"
        earlier = previous_run_entries(absolute_path(output_dir))
        if earlier:  # what the run will do with them (set_aside_previous_run), said before it does
            said += (f"; the earlier run's {', '.join(e.name for e in earlier)} will be moved to "
                     f"{absolute_path(output_dir) / PREVIOUS_DIR}/ first (not deleted)")
        return said
    said = f"resume: auto, from {path}" if resume == "auto" else f"resume from {path}"
    if resume != "auto":
        try:  # an unset $VAR, an empty value, a symlink loop or a file on the way; a missing folder: below
            wanted = expand("resume", resume)
            if nearest_existing("resume", wanted) == wanted:
                config_paths({"resume": resume}, "resume")  # a file, not a folder; unreadable
        except PathError as err:
            raise ConfigError("resume", err.detail) from None
        if path is None:
            path = absolute_path(resume)
            if os.sep not in resume and "/" not in resume:
                raise ConfigError("resume", f"got {excerpt(resume)}, which is neither auto, never nor a checkpoint "
                                  f"folder ({path} does not exist). Use --resume auto (newest complete checkpoint), "
                                  "--resume never (start over), or a folder such as OUTPUT_DIR/checkpoint-50.")
            raise ConfigError("resume", f"no checkpoint folder at {path}. Use --resume auto to pick the newest "
                              f"complete checkpoint in {absolute_path(output_dir)}, or --resume never.")
        problem = checkpoint_problem(path)
        if problem:
            raise ConfigError("resume", f"{path} cannot be resumed from: {problem}. Pick another checkpoint, or "
                              "use --resume auto (it skips incomplete checkpoints).")
    # other LoRA shape or base model recorded, then what the files themselves hold: a size mismatch mid-load later
    differs = mismatch(path)
    if differs:
        raise ConfigError("resume", differs)
    return said


class CheckResults(list):
    """The checks' results, in order; `decisions`: the run's decisions when every check passed, else None."""
    decisions: Optional[RunDecisions] = None


def run_checks(cfg: PipelineConfig, stop_at_first: bool = True, choice: Any = None) -> CheckResults:
    """Run every check in order. With `stop_at_first`, the first failure raises; a failing data step raises after
    the other data steps ran, their failures appended ("also: ..."). All passed: `.decisions` holds the run's."""
    eval_off, _ = without_a_held_out_set(cfg)  # as the run has it (its callers print the line)
    cfg = cfg.replace(**eval_off) if eval_off else cfg
    done: dict[str, Any] = {}

    # Every step reads `cfg` itself, after the config check: validate normalises values in place.
    def chosen() -> Any:  # the backend, chosen once (when a step first needs it: choosing may refuse the recipe)
        if "choice" not in done:
            done["choice"] = choice or choose_backend(cfg.model.backend, cfg.model.fast_inference)
        return done["choice"]

    def after_backend(check: Callable[[], str]) -> Callable[[], str]:
        # The data, rewards and LoRA checks import torch/transformers: the backend's set-up (Unsloth's import) first.
        def step() -> str:
            load_backend(chosen().name).prepare_environment(cfg)
            return check()

        return step

    data_steps = [(name, after_backend(step)) for name, step in data_checks(cfg, done)]
    steps: list[tuple[str, Callable[[], Any]]] = [
        # first: a node started with another recipe or code is named on every node before any check can differ
        ("nodes", lambda: check_nodes(cfg.to_dict())),
        ("config", lambda: (validate(cfg, backend=choice.name if choice else None), "config values are valid")[1]),
        # TRL's own validation of its config; what the backend changes (effective_config.json)
        ("trl", after_backend(lambda: check_grpo_config(chosen().name, cfg))),
        ("effective_config", after_backend(lambda: check_effective_config(chosen().name, cfg))),
        ("output_dir", lambda: check_output_dir(cfg.to_dict())),
        # report_to's loggers and model_source's modelscope (refused when missing); a bitsandbytes `optim` is
        # replaced by adamw_torch when missing (resolve_optim's note, which `grpo train` applies)
        ("packages", lambda: "; ".join(filter(None, [check_report_to(cfg.grpo.reporters(), cfg.grpo.output_dir),
                                                     model_check.check_model_source(cfg.model.model_source),
                                                     resolve_optim(cfg)[1]]))),
        # a GPU recipe is never trained on CPU by accident
        ("gpu", lambda: (refuse_gpu_recipe_without_cuda(cfg, chosen()),
                         f"backend {chosen().name} ({chosen().reason})")[1]),
        ("model", lambda: model_check.check_model(cfg.model.model_name_or_path, cfg.model.model_source)),
        ("memory", lambda: memory_check(cfg)),  # the peak GPU memory against the GPU (pipeline/plan)
        ("resume", lambda: check_resume(cfg.grpo.resume, cfg.grpo.output_dir,
                                        lambda path: resume_mismatch(path, resume_key(cfg))
                                        or contents_problem(path, resume_key(cfg)))),
        *data_steps,  # then: the tokenizer, the prepared data, the rewards called on it
        ("lora", after_backend(lambda: check_lora_targets(  # the architecture, no weights
            cfg.model.model_name_or_path, cfg.model.trust_remote_code, cfg.lora.lora_target_modules,
            cfg.lora.lora_modules_to_save))),
        ("engine", after_backend(lambda: check_run_engine(load_backend(chosen().name), cfg,
                                                          trl_training_args(cfg), done))),
    ]
    results = _run_steps(steps, {name for name, _ in data_steps}, stop_at_first)
    if all(c.ok for c in results):
        results.decisions = run_decisions(chosen(), load_backend(chosen().name), reward_specs(
            cfg.grpo.reward_funcs, cfg.grpo.reward_weights, done["rewards"]), done["train"], cfg, eval_key(cfg),
            done["agents"], done["tokenizer"])
    return results


def _run_steps(steps: list[tuple[str, Callable[[], Any]]], data_names: set[str], stop_at_first: bool) -> CheckResults:
    # A check that reads the model says nothing new when the model could not be found.
    needs = {"lora": ("model",), "effective_config": ("trl",), "engine": ("model", "lora")}
    results = CheckResults()
    failures: list[Exception] = []
    for name, step in steps:
        failed = [c.name for c in results if not c.ok and c.name in needs.get(name, ())]
        if failed:
            results.append(Check(name, False, f"not checked: the {' and '.join(failed)} check failed"))
            continue
        try:
            results.append(Check(name, True, str(step())))
        except (ConfigError, PathError, DataError, DataFileError, FileNotFoundError) as err:
            if stop_at_first and name not in data_names:
                raise
            if stop_at_first:  # the data steps are all run, so one message says everything to fix in the data
                failures.append(err)
            results.append(Check(name, False, str(err)))
    if failures:
        first, others = failures[0], [f for f in failures[1:] if not isinstance(f, NotChecked)]
        if others:
            first.args = (str(first) + "".join(f"\nalso: {other}" for other in others),)
        raise first
    return results
