"""Checks that run before anything heavy loads: config, output folder, packages, GPU, model, memory, resume,
data, eval set, warm-up, rewards, LoRA targets.

`run_checks` is the contract of `grpo train --check`: the run calls the same function before the model loads
(the first failure ends it with one message, exit 2), so when `--check` passes, the run does not fail for any
of these reasons. `grpo train --check` runs them all, prints one JSON object, and stops.

The data steps prepare everything the run will read (`prepare_run_data`: the training split, the eval set when
eval_before/eval_after is on, the format warm-up's examples) with the tokenizer only, and the run calls the same
function afterwards, which then loads the prepared data from the cache. The rewards check calls every reward
function on completions of the prepared prompts, with the training set's columns as TRL passes them; the LoRA
check builds the model's architecture on the meta device (no weights) to learn its module names. These import
torch, after the backend's `prepare_environment` (Unsloth must be imported first).

Everything else is cheap: no model weights, at most one short network probe (only when the model is neither a
local folder nor in the Hugging Face cache).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from env.text import excerpt
from pipeline.config import ConfigError, PipelineConfig, validate
from pipeline.data.prepare import ANSWER
from pipeline.data.prompts import completion_like, question_text

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


def config_paths(cfg: PipelineConfig | dict[str, Any], *fields: str) -> dict[str, Path]:
    """Check the config's path `fields` (env.path_check's table: output_dir, data_cache_dir, a local dataset_name
    or model folder, --resume PATH) before anything runs; each refusal is a ConfigError naming the field."""
    from env.path_check import PathError, check_command_paths

    try:
        return check_command_paths("train", cfg.to_dict() if isinstance(cfg, PipelineConfig) else cfg, only=fields)
    except PathError as err:
        raise ConfigError(err.option, err.detail) from None


def check_output_dir(cfg: PipelineConfig) -> str:
    """output_dir (and data_cache_dir) take new files, and are not inside the model or data they read."""
    import shutil

    from env.path_check import nearest_existing

    path = config_paths(cfg, "output_dir", "data_cache_dir")["output_dir"]
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


def check_packages(cfg: PipelineConfig) -> str:
    """The packages the config's options need: report_to's loggers and model_source's modelscope (refused when
    missing), and a bitsandbytes `optim` (replaced by adamw_torch when missing: pipeline.config.resolve_optim,
    which `grpo train` applies)."""
    from pipeline.config import resolve_optim

    _, optim_note = resolve_optim(cfg)
    return "; ".join(filter(None, [check_report_to(cfg.grpo.reporters(), cfg.grpo.output_dir),
                                   check_model_source(cfg.model.model_source), optim_note]))


def tensorboard_hint(output_dir: str | os.PathLike[str]) -> str:
    """Where transformers' TensorBoardCallback writes (TENSORBOARD_LOGGING_DIR, else output_dir/runs/<run>)."""
    logdir = os.environ.get("TENSORBOARD_LOGGING_DIR") or os.path.join(output_dir, "runs")
    from env.paths import shell_command

    return f"tensorboard logs go to {logdir}: run `{shell_command('tensorboard', '--logdir', logdir)}`"


def check_model_source(source: str) -> str:
    """`model_source: modelscope` needs the modelscope package: refused here, with the install command."""
    from env.hubs import HubSourceError, require_modelscope

    if source == "modelscope":
        try:
            require_modelscope()
        except HubSourceError as err:
            raise ConfigError("model_source", str(err)) from None
    return f"model_source: {source}"


def check_model(name: str, source: str = "hf") -> str:
    """A built-in name, a local model folder, a hub id in the local cache, or a hub id we can reach."""
    from env.hubs import endpoint as hub_endpoint
    from env.hubs import reachable
    from pipeline.demo.registry import builtin_model

    if builtin_model(name) is not None:
        return f"{name}: built in"
    from env.path_check import local_model

    if local_model(name):
        config_paths({"model_name_or_path": name}, "model_name_or_path")  # unset $VARS, loops, unreadable
    path = Path(name).expanduser()
    looks_local = path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1
    if path.exists() or looks_local:
        if not path.is_dir():
            raise ConfigError("model_name_or_path", f"{path.resolve()} is not a model folder (it does not exist "
                              "or is a file). Give a folder with config.json and the weights, or a hub id such "
                              "as unsloth/Qwen2.5-1.5B-Instruct.")
        if not (path / "config.json").is_file():
            raise ConfigError("model_name_or_path", f"{path.resolve()} has no config.json, so it is not a "
                              "transformers model folder. Point at the folder that holds config.json.")
        return f"{path.resolve()}: local folder"
    if source == "modelscope":
        check_model_source(source)
        address = hub_endpoint(source)
        if not reachable(address):
            raise ConfigError("model_name_or_path", f"model {excerpt(name)} is to come from ModelScope, but {address} "
                              "cannot be reached. Fixes: check the network (on AutoDL: `source /etc/network_turbo`), "
                              "set model_name_or_path to a local model folder, or set model_source: hf.")
        return f"{name}: from ModelScope ({address}; cached in MODELSCOPE_CACHE after the first download)"
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return f"{name}: in the Hugging Face cache"
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    endpoint = hub_endpoint("hf")
    if offline or not reachable(endpoint, timeout=3.0):
        why = "HF_HUB_OFFLINE is set" if offline else f"{endpoint} cannot be reached"
        raise ConfigError("model_name_or_path", f"model {excerpt(name)} is not in the local Hugging Face cache and "
                          f"{why}. Fixes: download it where there is network (`huggingface-cli download {name}`, "
                          "then copy ~/.cache/huggingface over) or set model_name_or_path to a local model folder; "
                          "in mainland China set HF_ENDPOINT=https://hf-mirror.com.")
    return f"{name}: will be downloaded from {endpoint}"


class NotChecked(ConfigError):
    """A data step whose input (the tokenizer, the training data) failed its own check."""


@dataclass
class RunData:
    """What the run reads: the prepared training data and the held-out rows ([] when evaluation is off)."""

    train: Any  # pipeline.data.prepare.PreparedData
    eval_rows: list[dict[str, Any]]

    def eval_overlap(self) -> list[str]:
        """Ids of eval rows whose question is also a training question: their numbers measure memory."""
        if not self.eval_rows:
            return []
        trained = {question_text(prompt) for prompt in self.train.dataset["prompt"]}
        return [row["id"] for row in self.eval_rows if question_text(row["prompt"]) in trained]

    def overlap_warning(self) -> str:
        ids = self.eval_overlap()
        if not ids:
            return ""
        return (f"warning: {len(ids)} of {len(self.eval_rows)} eval problems are also training questions "
                f"({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}); their before/after numbers measure "
                "memory, not reasoning. Remove them from one of the two sources.")


# The three data steps, in the order the run needs them; prepare_run_data runs them all, the check one by one.
def prepare_train(cfg: PipelineConfig, tokenizer: Any, report_dir: Any = None, write_report: bool = True) -> Any:
    from pipeline.data.prepare import prepare_dataset

    return prepare_dataset(cfg, tokenizer, report_dir=report_dir, write_report=write_report)


def without_a_held_out_set(cfg: PipelineConfig) -> tuple[PipelineConfig, str]:
    """One training file (or any one-split local source) and no eval_dataset_name: there are no held-out
    problems, so the run trains without evaluation, as TRL, Unsloth and open-r1 do, and says in one line how to
    turn it on. Returns the config (eval off) and that line; unchanged and "" otherwise. The one answer for
    `grpo train`, its --check and `grpo data` (a recipe's eval_before: true on such data trains, and says so).

    >>> cfg, note = without_a_held_out_set(PipelineConfig().replace(dataset_name="sample", eval_before=True))
    >>> cfg.eval.uses_eval_set(), note.startswith("eval: off")
    (False, True)
    """
    from pipeline.data.sources import SAMPLE_NAME, SAMPLE_PATH, SINGLE_FILE_SPLIT, local_layout, local_path

    e = cfg.eval
    if not e.uses_eval_set() or e.eval_dataset_name:
        return cfg, ""
    name = str(cfg.data.dataset_name).strip()
    path = SAMPLE_PATH if name == SAMPLE_NAME else local_path(name)
    if path is None:
        return cfg, ""  # a hub dataset (its splits are known once loaded) or a built-in one with its own test split
    try:
        splits = [SINGLE_FILE_SPLIT] if name == SAMPLE_NAME else sorted(local_layout(path, "dataset_name")[1])
    except (ConfigError, OSError, RuntimeError):  # RuntimeError: pathlib's symlink loop
        return cfg, ""  # the data check names what is wrong with the path
    if len(splits) != 1 or e.eval_split in splits:
        return cfg, ""
    note = (f"eval: off. {name} has one split ({splits[0]}: the training data) and no eval_dataset_name is set, so "
            "there are no held-out problems to score. To evaluate, set --eval_dataset_name test.jsonl (or make "
            "dataset_name a folder holding train.jsonl and test.jsonl).")
    return cfg.replace(eval_before=False, eval_after=False, eval_steps=0), note


def prepare_eval(cfg: PipelineConfig, tokenizer: Any, report_dir: Any = None,
                 write_report: bool = True) -> list[dict[str, Any]]:
    """The held-out rows when the run evaluates (eval_before, eval_after or eval_steps), else []."""
    if not cfg.eval.uses_eval_set():
        return []
    from pipeline.infer.evaluate import load_eval_rows

    return load_eval_rows(cfg, tokenizer, report_dir=report_dir, write_report=write_report)


def check_warmup(cfg: PipelineConfig, train: Any) -> str:
    """The format warm-up's examples exist (ConfigError naming sft_warmup_steps otherwise)."""
    if cfg.health.sft_warmup_steps <= 0:
        return "no format warm-up (sft_warmup_steps: 0)"
    from pipeline.trainer.warmup import warmup_examples

    return f"format warm-up: {len(warmup_examples(cfg, train))} examples"


def prepare_run_data(cfg: PipelineConfig, tokenizer: Any, report_dir: Any = None,
                     write_report: bool = True) -> RunData:
    """Prepare every split the run uses and check the warm-up's needs: the same steps as the check's.

    Raises ConfigError (naming the option), DataError or DataFileError; the prepared splits are cached, so
    the run's call after the check loads them instead of preparing them again."""
    train = prepare_train(cfg, tokenizer, report_dir, write_report)
    eval_rows = prepare_eval(cfg, tokenizer, report_dir, write_report)
    check_warmup(cfg, train)
    data = RunData(train, eval_rows)
    if write_report and data.overlap_warning():
        print(f"[grpo] {data.overlap_warning()}", file=sys.stderr, flush=True)
    return data


def _data_tokenizer(cfg: PipelineConfig) -> Any:
    from pipeline.data.tokenizer import load_tokenizer

    try:
        return load_tokenizer(cfg.model.model_name_or_path, cfg.model.trust_remote_code, cfg.model.model_source)
    except ConfigError:
        raise
    except (OSError, ValueError) as err:
        raise ConfigError("model_name_or_path", f"the tokenizer of {excerpt(cfg.model.model_name_or_path)} could not "
                          f"be loaded to check the data ({type(err).__name__}: {err}).") from None


def data_checks(cfg: PipelineConfig) -> list[tuple[str, Callable[[], Any]]]:
    """The check's data steps (data, eval, warmup): prepare_run_data's steps, each reported on its own and
    writing nothing outside the cache. A step whose input failed says so and fails too."""
    from pipeline.data.report import accounting_line, prompt_line

    done: dict[str, Any] = {}

    def data() -> str:
        config_paths(cfg, "dataset_name", "eval_dataset_name", "data_cache_dir")  # env.path_check's table, first
        done["tokenizer"] = _data_tokenizer(cfg)
        done["train"] = prepare_train(cfg, done["tokenizer"], write_report=False)
        report = done["train"].report
        return f"train: {accounting_line(report)}\n    prompts: {prompt_line(report)}"

    def needs(key: str) -> Any:
        if key not in done:
            raise NotChecked("dataset_name", "not checked: the data check failed (see its message).")
        return done[key]

    def evaluation() -> str:
        if not cfg.eval.uses_eval_set():
            return "no evaluation (eval_before and eval_after are false, eval_steps is 0)"
        data = RunData(needs("train"), prepare_eval(cfg, needs("tokenizer"), write_report=False))
        return "; ".join(filter(None, [f"eval set: {len(data.eval_rows)} problems", data.overlap_warning()]))

    return [("data", data), ("eval", evaluation), ("warmup", lambda: check_warmup(cfg, needs("train"))),
            ("rewards", lambda: check_rewards(cfg, needs("tokenizer"), needs("train")))]


PROBE_PROMPTS = 2  # prompts from the data, each with the completions below (TRL repeats a prompt per completion)


def _probe_completions(answer: str) -> list[str]:
    """Completions a reward will meet: right and wrong in the format, plain text, and empty."""
    return [f"<reasoning>\nWorking it out.\n</reasoning>\n<answer>\n{answer}\n</answer>\n",
            "<reasoning>\nA guess.\n</reasoning>\n<answer>\n0\n</answer>\n",
            f"The answer is {answer}.", ""]


def reward_probe_batch(cfg: PipelineConfig, tokenizer: Any, train: Any) -> tuple[list[Any], list[Any], dict[str, Any],
                                                                               str]:
    """prompts, completions and keyword arguments as TRL's `GRPOTrainer._calculate_rewards` passes them: the
    first prepared prompts (completions in their format: strings for standard prompts,
    `[{"role": "assistant", ...}]` for chats), the training set's other
    columns, `completion_ids`, `trainer_state`, `log_extra` and `log_metric`."""
    from transformers import TrainerState

    dataset = train.dataset.select(range(min(PROBE_PROMPTS, len(train.dataset))))
    columns = {name: list(dataset[name]) for name in dataset.column_names}
    texts = [_probe_completions(str(answer or 0)) for answer in columns[ANSWER]]
    per_prompt = len(texts[0]) if texts else 0
    repeat = lambda values: [value for value in values for _ in range(per_prompt)]  # noqa: E731
    prompts = repeat(columns.pop("prompt"))
    flat = [text for group in texts for text in group]
    completions = [completion_like(prompt, text) for prompt, text in zip(prompts, flat, strict=True)]
    kwargs: dict[str, Any] = {key: repeat(values) for key, values in columns.items()}
    kwargs["completion_ids"] = [tokenizer.encode(text, add_special_tokens=False) for text in flat]
    kwargs["trainer_state"] = TrainerState(max_steps=cfg.grpo.max_steps)
    kwargs["log_extra"] = lambda column, values: None
    kwargs["log_metric"] = lambda name, value: None
    return prompts, completions, kwargs, f"{len(completions)} completions of {len(texts)} prepared prompts"


def check_rewards(cfg: PipelineConfig, tokenizer: Any, train: Any) -> str:
    """Call every reward function as the trainer will, on completions of the run's prepared prompts: a raise, a
    wrong signature, a wrong length, a non-number or NaN/inf is refused here, naming the function and what it did."""
    from rewards import get_reward_funcs
    from rewards.contract import RewardFailure, probe_rewards

    prompts, completions, kwargs, what = reward_probe_batch(cfg, tokenizer, train)
    try:
        lines = probe_rewards(get_reward_funcs(list(cfg.grpo.reward_funcs)), prompts, completions, kwargs)
    except RewardFailure as err:
        raise ConfigError("reward_funcs", f"{err}. It was called before the model loads, as the trainer calls "
                          f"it, on {what}. The contract: docs/rewards.md.") from None
    except ValueError as err:  # a name that does not resolve (validate() names it first in a run)
        raise ConfigError("reward_funcs", str(err)) from None
    return f"called on {what}: " + "; ".join(lines)


# The module classes peft's LoRA can adapt (peft.tuners.lora.model LoraModel._create_new_module dispatchers).
LORA_MODULE_TYPES = ("Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d", "Conv1D")


def model_module_types(name: str, trust_remote_code: bool = False) -> dict[str, str]:
    """Every module path of the model -> its class name, from the architecture alone: the config read from the
    built-in folder, a local folder or the HF cache (else downloaded: config.json only), the model built on the
    meta device (accelerate's `init_empty_weights`), so no weights are read or allocated."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    from pipeline.data.tokenizer import resolve_model_path

    def read_config(local_only: bool):
        return AutoConfig.from_pretrained(resolve_model_path(name), trust_remote_code=trust_remote_code,
                                          local_files_only=local_only)

    try:
        try:  # a local folder or the HF cache first: no network round-trip for a model already here
            config = read_config(local_only=True)
        except OSError:
            config = read_config(local_only=False)  # config.json only
        with init_empty_weights():
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:  # no config.json, an architecture transformers lacks
        raise ConfigError("model_name_or_path", f"cannot read the architecture of {name} ({type(err).__name__}: "
                          f"{err}). Point at a causal-LM model folder or hub id, e.g. unsloth/Qwen2.5-1.5B-Instruct."
                          ) from None
    return {path: type(module).__name__ for path, module in model.named_modules() if path}


def _matches(target: str, path: str) -> bool:
    """peft's suffix rule (peft.tuners.tuners_utils.check_target_module_exists): the name or a `.name` tail."""
    return path == target or path.endswith("." + target)


def check_lora_targets(cfg: PipelineConfig) -> str:
    """Each `lora_target_modules` entry names LoRA-capable modules of this model, and each
    `lora_modules_to_save` entry names a module it has; otherwise refused, listing the names it has."""
    lo = cfg.lora
    types = model_module_types(cfg.model.model_name_or_path, cfg.model.trust_remote_code)
    adaptable = sorted({path.rsplit(".", 1)[-1] for path, kind in types.items() if kind in LORA_MODULE_TYPES})
    for target in lo.lora_target_modules:
        kinds = sorted({kind for path, kind in types.items() if _matches(str(target), path)})
        if not kinds:
            raise ConfigError("lora_target_modules", f"{cfg.model.model_name_or_path} has no module named "
                              f"{excerpt(target)}. Its layers LoRA can adapt: {', '.join(adaptable)}.")
        if not set(kinds) & set(LORA_MODULE_TYPES):
            raise ConfigError("lora_target_modules", f"{excerpt(target)} names {', '.join(kinds)} modules, which LoRA "
                              f"cannot adapt; name their layers instead: {', '.join(adaptable)}.")
    names = sorted({path.rsplit(".", 1)[-1] for path in types})
    for target in lo.lora_modules_to_save:
        # peft's rule here (peft.utils.other._set_trainable) is a plain suffix: `layernorm` takes input_layernorm
        if not any(path.endswith(str(target)) for path in types):
            raise ConfigError("lora_modules_to_save", f"{cfg.model.model_name_or_path} has no module named "
                              f"{excerpt(target)}. Its module names: {', '.join(names)}.")
    saved = f"; trained in full: {', '.join(map(str, lo.lora_modules_to_save))}" if lo.lora_modules_to_save else ""
    return f"LoRA on {', '.join(map(str, lo.lora_target_modules))}{saved} (all found in the model)"


def check_resume(cfg: PipelineConfig) -> str:
    """`auto`, `never`, or a complete checkpoint folder, and the checkpoint it picks holds weights of this config's
    shape (LoRA rank, alpha, targets, base model); anything else fails before the data and the model load."""
    from env.paths import absolute_path
    from pipeline.run.checkpoints import PREVIOUS_DIR, checkpoint_problem, complete_checkpoints, previous_run_entries
    from pipeline.run.resume import resume_mismatch

    resume, output_dir = cfg.grpo.resume, cfg.grpo.output_dir
    # the newest complete one, as resolve_resume picks it (which also moves broken ones aside; not here)
    complete = complete_checkpoints(absolute_path(output_dir)) if resume == "auto" else []
    if resume == "never" or (resume == "auto" and not complete):
        said = "resume: never" if resume == "never" else "resume: auto (no checkpoint yet: a fresh start)"
        earlier = previous_run_entries(absolute_path(output_dir))
        if earlier:  # what the run will do with them (set_aside_previous_run), said before it does
            said += (f"; the earlier run's {', '.join(e.name for e in earlier)} will be moved to "
                     f"{absolute_path(output_dir) / PREVIOUS_DIR}/ first (not deleted)")
        return said
    if resume == "auto":
        path, said = complete[-1], f"resume: auto, from {complete[-1]}"
    else:
        from env.path_check import PathError, expand, nearest_existing

        try:  # an unset $VAR, an empty value, a symlink loop or a file on the way; a missing folder: below
            wanted = expand("resume", resume)
            if nearest_existing("resume", wanted) == wanted:
                config_paths({"resume": resume}, "resume")  # a file, not a folder; unreadable
        except PathError as err:
            raise ConfigError("resume", err.detail) from None
        path = absolute_path(resume)
        if not path.is_dir():
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
        said = f"resume from {path}"
    mismatch = resume_mismatch(path, cfg)  # other LoRA shape or base model: a size-mismatch traceback later
    if mismatch:
        raise ConfigError("resume", mismatch)
    return said


def check_gpu(cfg: PipelineConfig, choice: Any = None) -> str:
    from pipeline.backends import choose_backend, refuse_gpu_recipe_without_cuda

    choice = choice or choose_backend(cfg.model.backend, cfg.model.fast_inference)
    refuse_gpu_recipe_without_cuda(cfg, choice)  # a GPU recipe is never trained on CPU by accident
    return f"backend {choice.name} ({choice.reason})"


def check_memory(cfg: PipelineConfig) -> str:
    """Estimated peak GPU memory against the GPU (pipeline/plan): a warning when over, a refusal when far over."""
    from pipeline.plan.fit import memory_check

    return memory_check(cfg)


def run_checks(cfg: PipelineConfig, stop_at_first: bool = True, choice: Any = None) -> list[Check]:
    """Run every check in order. With `stop_at_first`, the first failure raises its error; a failing data step
    (data, eval, warmup, rewards) raises after the other data steps ran, with their failures appended
    ("also: ...").

    `choice` is a BackendChoice already made by the caller (the gpu check then reports it)."""
    from env.path_check import PathError
    from pipeline.backends import choose_backend, load_backend
    from pipeline.data.prepare import DataError
    from pipeline.data.sources import DataFileError
    from pipeline.trainer.build import check_effective_config, check_grpo_config

    cfg, _ = without_a_held_out_set(cfg)  # as the run has it (its callers print the line)

    def after_backend(check: Callable[[], str]) -> Callable[[], str]:
        # The data, rewards and LoRA checks import torch/transformers: the backend's set-up (Unsloth's import) first.
        def step() -> str:
            resolved = choice or choose_backend(cfg.model.backend, cfg.model.fast_inference)
            load_backend(resolved.name).prepare_environment(cfg)
            return check()

        return step

    data_steps = [(name, after_backend(step)) for name, step in data_checks(cfg)]
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("config", lambda: (validate(cfg, backend=choice.name if choice else None), "config values are valid")[1]),
        ("trl", after_backend(lambda: check_grpo_config(cfg, (choice or choose_backend(
            cfg.model.backend, cfg.model.fast_inference)).name))),  # TRL's own validation of its config
        ("effective_config", after_backend(lambda: check_effective_config(cfg, (choice or choose_backend(
            cfg.model.backend, cfg.model.fast_inference)).name))),  # what the backend changes (effective_config.json)
        ("output_dir", lambda: check_output_dir(cfg)),
        ("packages", lambda: check_packages(cfg)),
        ("gpu", lambda: check_gpu(cfg, choice)),
        ("model", lambda: check_model(cfg.model.model_name_or_path, cfg.model.model_source)),
        ("memory", lambda: check_memory(cfg)),
        ("resume", lambda: check_resume(cfg)),
        *data_steps,  # then: the tokenizer, the prepared data, the rewards called on it
        ("lora", after_backend(lambda: check_lora_targets(cfg))),  # the architecture, no weights
    ]
    # A check that reads the model says nothing new when the model could not be found.
    needs = {"lora": ("model",), "effective_config": ("trl",)}
    data_names = {name for name, _ in data_steps}
    results: list[Check] = []
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


def as_json(results: list[Check]) -> dict[str, Any]:
    return {"ok": all(c.ok for c in results), "checks": [asdict(c) for c in results]}
