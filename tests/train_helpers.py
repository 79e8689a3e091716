"""Shared pieces for the real CPU training tests: small configs and a reward with variance.

Not a test module (pytest collects only test_*.py); also importable as a reward plug-in:
`reward_funcs: [train_helpers:digit_share_reward]`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_pipeline.pipeline.config import PipelineConfig, from_mapping


def digit_share_reward(completions, **kwargs) -> list[float]:
    """Share of digits in the completion text. A random model's completions differ here, so GRPO
    gets a non-zero advantage from step 1 (the real rewards are all 0 on a random model)."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


# The shortened CPU demo of tests/conftest.py's `demo_run`: its GRPO steps and its eval interval (evals at 5 and 10).
DEMO_RUN_STEPS, DEMO_RUN_EVAL_STEPS = 10, 5
NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "grpo_qwen2.5_gsm8k.ipynb"


def smoke_warmup_steps(notebook: Path = NOTEBOOK) -> int:
    """The format warm-up steps of the notebook's smoke mode: the `sft_warmup_steps=N` its configure cell sets."""
    import json
    import re

    code = ["".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"] if cell["cell_type"] == "code"]
    found = {int(n) for source in code for n in re.findall(r"\bsft_warmup_steps=(\d+)", source)}
    assert len(found) == 1, f"{notebook.name}: one sft_warmup_steps=N (smoke mode's warm-up) expected, found {found}"
    return found.pop()


# demo_run's format warm-up is the notebook's smoke warm-up (declared there), so the notebook's smoke run reuses it.
DEMO_RUN_WARMUP_STEPS = smoke_warmup_steps()


# reward_timeout 0 in these test configs: each reward runs in the trainer's process. With a deadline each reward
# runs in a worker forked from the trainer's process (rewards/worker.py), and a fork's cost grows with the forking
# process's memory: ~0.5 s each from a 3 GB test process on these machines, two forks per reward and run (the
# check's probe, then training), hundreds of runs a suite. A test whose run must keep each reward in its own
# process (the product's default) passes PRODUCT_REWARD_TIMEOUT; recipes and CLI runs keep the default anyway.
REWARDS_IN_PROCESS = 0
PRODUCT_REWARD_TIMEOUT = PipelineConfig().grpo.reward_timeout  # for the tests whose runs keep the reward's process

# plots off in these test configs (`plots: false`, a user's option too): matplotlib takes about a second of CPU a run
# for nine PNGs, over a hundred runs a suite, and most tests read metrics.jsonl, not the pictures. A test of the
# plots passes plots=True; the demo, the notebook, the recipes and CLI runs keep the default (on).
PLOTS_IN_TEST_RUNS = False


def demo_config(output_dir: Path, **overrides: Any) -> PipelineConfig:
    """The built-in CPU demo, shortened for tests."""
    from grpo_pipeline.pipeline.demo.registry import cpu_demo_config

    # The demo's own settings (no learning-rate warm-up where it sets none) ...
    values: dict[str, Any] = {"warmup_ratio": 0.0, **cpu_demo_config()}
    # Then the test scale: a rank-16 LoRA on attention/MLP only, 2 prompts x 8 completions a step and a
    # large learning rate, so that a few steps change the weights visibly. Completions of 16 tokens (the demo's are
    # 64: a 56-character answer, one token per character): without a long warm-up the model's bytes are noise at
    # any length, and generation, one forward pass a token, was the largest part of these runs (48 tokens: ~10%
    # more time over ten modules of them); a test that reads an answer's content sets its own length.
    values.update(output_dir=str(output_dir), max_steps=3, save_steps=2, eval_before=False, eval_after=False,
                  eval_steps=0,
                  sft_warmup_steps=0, max_samples=64, logging_steps=1, lora_r=16,
                  lora_alpha=16, lora_modules_to_save=[], max_completion_length="16",
                  per_device_train_batch_size=16, learning_rate=1e-3,
                  # Before any warm-up the random model's bytes are garbled by nature; tests of the garbled
                  # stop set their own thresholds, the others must not trip it by chance.
                  garbled_action="warn", reward_timeout=REWARDS_IN_PROCESS, plots=PLOTS_IN_TEST_RUNS)
    values.update(overrides)
    return from_mapping(values)


def tiny_qwen_config(output_dir: Path, **overrides: Any) -> PipelineConfig:
    """A tiny random Qwen2 with the REAL Qwen2.5 tokenizer and LoRA, on the bundled GSM8K sample."""
    values: dict[str, Any] = dict(
        model_name_or_path="tiny-qwen2.5", backend="plain", dataset_name="sample", max_seq_length=512,
        max_completion_length="16", num_generations=4, per_device_train_batch_size=4, max_steps=2,
        save_steps=2, lora_r=8, lora_alpha=16, lora_target_modules=["q_proj", "v_proj"],
        output_dir=str(output_dir), learning_rate=5e-3, warmup_ratio=0.0, optim="adamw_torch",
        reward_funcs=["xmlcount", "correctness", "train_helpers:digit_share_reward"], max_samples=16,
        reward_timeout=REWARDS_IN_PROCESS, plots=PLOTS_IN_TEST_RUNS,
    )
    values.update(overrides)
    return from_mapping(values)


def poison_gradients(at_step: int, times: int = 1):
    """A TrainerCallback making every gradient of step `at_step` NaN (as an fp16 overflow would), on each of the
    first `times` passes through that step (a rolled-back run passes it again)."""
    from transformers import TrainerCallback

    class PoisonGradients(TrainerCallback):
        def __init__(self):
            self.left, self.hooks = times, []

        def on_step_begin(self, args, state, control, model=None, **kwargs):
            if state.global_step == at_step - 1 and self.left:  # the step about to run is `at_step`
                self.left -= 1
                self.hooks = [p.register_hook(lambda g: g * float("nan"))
                              for p in model.parameters() if p.requires_grad]

        def on_step_end(self, args, state, control, **kwargs):
            for hook in self.hooks:
                hook.remove()
            self.hooks = []

    return PoisonGradients()


def resolve_dotted(dotted: str) -> tuple[Any, str]:
    """`package.module.Class.attr` or `package.module.attr` -> (the object holding attr, attr), for tests that
    replace one function at a named moment of a run."""
    import importlib

    module_name, _, attr = dotted.rpartition(".")
    try:
        return importlib.import_module(module_name), attr
    except ModuleNotFoundError:
        module_name, _, cls = module_name.rpartition(".")
        return getattr(importlib.import_module(module_name), cls), attr


def first_operand_reward(prompts, completions, **kwargs) -> list[float]:
    """A gameable reward for the CPU demo's additions: 2.0 when <answer> holds the FIRST OPERAND of "What is A+B?"
    (the sloppy teacher's habit, pipeline/demo/task.py), not the sum. Training on it raises the reward while
    held-out accuracy falls: reward hacking on purpose, for the hacking rule's real-run test."""
    import re

    scores = []
    for prompt, completion in zip(prompts, completions):
        question = prompt[-1]["content"] if not isinstance(prompt, str) else prompt
        text = completion if isinstance(completion, str) else completion[0]["content"]
        operand = re.search(r"What is (\d+)\+\d+\?", question)
        answer = re.search(r"<answer>\s*(.*?)\s*</answer>", text, re.S)
        scores.append(2.0 if operand and answer and answer.group(1) == operand.group(1) else 0.0)
    return scores


def fails_on_process_1(completions, **kwargs) -> list[float]:
    """Raises on the second of two data-parallel processes from the first training step on (the pre-load probe
    at step 0 passes): a reward that breaks on one process's samples only."""
    import os

    step = getattr(kwargs.get("trainer_state"), "global_step", 0) or 0
    if os.environ.get("RANK") == "1" and step >= 1:
        raise ValueError("no answer column on this shard")
    return [0.0 for _ in completions]


class _Float32DigitShare:
    """digit_share_reward as a callable object returning a numpy float32 array, as numpy users write rewards."""

    def __call__(self, completions, **kwargs):
        import numpy as np

        return np.asarray(digit_share_reward(completions), dtype=np.float32)


float32_digit_share = _Float32DigitShare()


async def async_digit_share(completions, **kwargs) -> list[float]:
    """digit_share_reward as an async reward (TRL awaits them concurrently)."""
    return digit_share_reward(completions)


def fails_past_the_probe(completions, **kwargs) -> list[float]:
    """Passes the pre-flight probe (8 completions) and raises on a larger batch: a bug only real batches show."""
    if len(completions) > 8:
        raise ValueError(f"cannot score {len(completions)} completions at once")
    return [0.0] * len(completions)



def step_rising_reward(completions, trainer_state, **kwargs) -> list[float]:
    """The same reward for every completion, rising with TRL's `trainer_state.global_step` (a tenth a step): a
    training reward that rises whatever the policy does, for tests that need a certain signal."""
    return [trainer_state.global_step / 10.0] * len(completions)


def record_reward_call(prompts, completions, **kwargs) -> list[float]:
    """Writes what TRL passed (the types and values of prompts, completions and every keyword) as one JSON line
    to $GRPO_TEST_RECORD, and scores the digit share (so the group has variance)."""
    import json
    import os

    def typed(value: Any) -> Any:
        return {"type": type(value).__name__, "value": value if isinstance(value, (str, int, float, bool, list, dict,
                                                                                    type(None))) else repr(value)}

    record = {"prompts": [typed(p) for p in prompts], "completions": [typed(c) for c in completions],
              "kwargs": {key: [typed(v) for v in values] if isinstance(values, list) else typed(values)
                         for key, values in kwargs.items()}}
    with open(os.environ["GRPO_TEST_RECORD"], "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=repr) + "\n")
    return digit_share_reward(completions)


# The completion token ids recording_reward was given, in order (tests/test_vllm_engine.py compares them with the
# ids the vLLM engine generated).
RECORDED_COMPLETION_IDS: list[list[int]] = []


def recording_reward(completions, completion_ids, **kwargs) -> list[float]:
    """digit_share_reward, recording the completion token ids TRL hands every reward (its `completion_ids`)."""
    RECORDED_COMPLETION_IDS.extend(list(ids) for ids in completion_ids)
    return digit_share_reward(completions)


def record_seen(prompts, completions, trainer_state, **kwargs) -> list[float]:
    """digit_share_reward, writing the prompts this process scored at each training step as a JSON line
    ({"step", "rank", "prompts"}) to $GRPO_SEEN_DIR/seen-rank<RANK>.jsonl. The check's reward probe (a bare
    TrainerState, no train_batch_size yet) is not recorded."""
    import json
    import os

    if trainer_state.train_batch_size is not None:
        rank = os.environ.get("RANK", "0")
        line = {"step": trainer_state.global_step, "rank": int(rank),
                "prompts": [p if isinstance(p, str) else json.dumps(p, sort_keys=True) for p in prompts]}
        with open(os.path.join(os.environ["GRPO_SEEN_DIR"], f"seen-rank{rank}.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    return digit_share_reward(completions)


def freeze_the_training_stack() -> None:
    """Import what a training run imports (TRL's trainers, as a run without vLLM does; transformers' Qwen2;
    peft, datasets; matplotlib's pyplot on Agg; the pipeline) and move everything alive into the garbage collector's
    permanent generation (gc.freeze). A full collection walks every tracked object: ~800k once these are loaded,
    ~0.45 s each, and transformers' Trainer.train runs one at each start. Frozen module-level objects are never
    garbage; what is made afterwards is collected as before. For tests/conftest.py's test processes and
    tests/test_saves.py's fork server."""
    import gc

    import matplotlib
    matplotlib.use("Agg")
    import datasets  # noqa: F401
    import matplotlib.pyplot  # noqa: F401
    import peft  # noqa: F401
    from transformers import Qwen2ForCausalLM  # noqa: F401
    from trl import GRPOConfig, SFTTrainer  # noqa: F401

    from grpo_pipeline.pipeline.config.trl_fields import grpo_trainer_module
    grpo_trainer_module()  # as a run without vLLM does; a vLLM test's run binds TRL's vLLM names

    import grpo_pipeline.pipeline.train  # noqa: F401

    gc.collect()
    gc.freeze()
