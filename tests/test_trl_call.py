"""What a reward receives is TRL's rule, read in one place (rewards/trl_source.py), and the check's probe uses it.

The one place is held against the pinned TRL itself: the real GRPOTrainer trains one step with a spy reward over
a table of dataset shapes (TRL's standard prompts, trl-lib/tldr's prompt + completion as text and as chats, verl's
nested columns beside a chat prompt, a completion_ids column) x remove_unused_columns, and the spy's keyword set must be the one
`reward_keywords` computes. The check calls rewards with those keywords (a reward reading `completion` is refused
before the model loads, as the run would fail at step 1) and leaves a user's module as never called.
"""

from __future__ import annotations

import textwrap

import pytest

from grpo_pipeline.rewards.trl_source import reward_keywords

CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
SHAPES = {
    "standard": {"prompt": ["2 + 2 =", "3 + 3 ="], "solution": ["4", "6"]},
    "tldr": {"prompt": ["A long post. TL;DR:", "Another post. TL;DR:"], "completion": [" short", " shorter"]},
    "tldr_chat": {"prompt": [CHAT, CHAT], "completion": [[{"role": "assistant", "content": "4"}]] * 2},
    "verl": {"data_source": ["openai/gsm8k"] * 2, "prompt": [CHAT, CHAT], "ability": ["math"] * 2,
             "reward_model": [{"style": "rule", "ground_truth": "4"}] * 2, "extra_info": [{"index": 0}, {"index": 1}]},
    "completion_ids": {"prompt": ["2 + 2 =", "1 + 1 ="], "completion_ids": [[1, 2], [3]], "answer": ["4", "2"]},
}


@pytest.fixture(scope="module")
def spy_trainer(tmp_path_factory):
    """`run(shape, remove_unused_columns)` -> the keyword set the real trainer passed a reward in one step."""
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_pipeline.pipeline.backends.trl_cpu_compat import ensure_trl_logprob_kernel
    from grpo_pipeline.pipeline.demo.model import demo_model_dir

    ensure_trl_logprob_kernel()
    folder = demo_model_dir()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    seen: list[set[str]] = []

    def spy(prompts, completions, **kwargs):
        seen.append({"prompts", "completions", *kwargs})
        return [float(len(str(c))) for c in completions]

    def run(shape: str, remove_unused_columns: bool) -> set[str]:
        seen.clear()
        args = trl.GRPOConfig(output_dir=str(tmp_path_factory.mktemp("spy")), max_steps=1, num_generations=2,
                              per_device_train_batch_size=2, max_completion_length=4, report_to=[],
                              save_strategy="no", logging_steps=1, use_cpu=True, bf16=False,
                              remove_unused_columns=remove_unused_columns, disable_tqdm=True)
        trl.GRPOTrainer(model=model, reward_funcs=[spy], args=args, train_dataset=Dataset.from_dict(SHAPES[shape]),
                        processing_class=tokenizer).train()
        assert seen, "the trainer never called the reward"
        return seen[0]

    return run


@pytest.mark.parametrize("remove_unused_columns", [False, True])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_one_rule_is_the_pinned_trainers_own(spy_trainer, shape, remove_unused_columns):
    assert spy_trainer(shape, remove_unused_columns) == reward_keywords(SHAPES[shape], remove_unused_columns)


@pytest.fixture(autouse=True)
def _own_import_path(monkeypatch):
    """This module's reward files leave sys.path and sys.modules as they were (another test may use the name)."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [m for m in sys.modules if m.startswith("trl_call_rewards")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m.startswith("trl_call_rewards")]:
        del sys.modules[name]


def _write_rewards(folder, body: str) -> None:
    (folder / "trl_call_rewards.py").write_text(textwrap.dedent(body))


def _check(tmp_path, monkeypatch, rows, rewards, **overrides):
    """The rewards step of `grpo train --check` on a JSONL of `rows`, from a folder holding trl_call_rewards.py."""
    import json

    from grpo_pipeline.pipeline.data.run_data import prepare_train
    from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer
    from grpo_pipeline.pipeline.preflight import check_rewards
    from train_helpers import demo_config

    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = demo_config(tmp_path / "run", dataset_name=str(data), reward_funcs=rewards,
                      reward_weights=[1.0] * len(rewards), data_cache_dir=str(tmp_path / "cache"), **overrides)
    tokenizer = load_tokenizer(cfg.model.model_name_or_path)
    return check_rewards(cfg, tokenizer, prepare_train(cfg, tokenizer, write_report=False))


TLDR_ROWS = [{"prompt": f"Post {i}. TL;DR:", "completion": f" summary {i}"} for i in range(4)]


def test_a_reward_reading_completion_is_refused_by_the_check_as_the_run_would_fail(tmp_path, monkeypatch):
    _write_rewards(tmp_path, """
        def reads_completion(prompts, completions, completion, **kwargs):
            return [1.0 for _ in completions]

        def reads_kwargs(prompts, completions, **kwargs):
            assert "completion" not in kwargs and "completion_ids" in kwargs
            return [1.0 for _ in completions]
        """)
    assert "reads_kwargs: [1" in _check(tmp_path, monkeypatch, TLDR_ROWS, ["trl_call_rewards:reads_kwargs"])
    from grpo_pipeline.pipeline.config import ConfigError

    with pytest.raises(ConfigError, match="reads_completion.*completion") as err:
        _check(tmp_path, monkeypatch, TLDR_ROWS, ["trl_call_rewards:reads_completion"])
    assert "TRL never passes a dataset column named 'completion'" in str(err.value)


def test_remove_unused_columns_leaves_trls_accuracy_reward_without_solution_and_the_check_says_so(tmp_path,
                                                                                                 monkeypatch):
    from grpo_pipeline.pipeline.config import ConfigError

    rows = [{"prompt": [{"role": "user", "content": f"{i} + 1?"}], "solution": str(i + 1)} for i in range(4)]
    assert "accuracy_reward: [" in _check(tmp_path, monkeypatch, rows, ["accuracy_reward"])
    with pytest.raises(ConfigError, match="solution") as err:
        _check(tmp_path, monkeypatch, rows, ["accuracy_reward"], remove_unused_columns=True)
    assert "remove_unused_columns: false" in str(err.value)


def test_the_check_leaves_a_stateful_user_module_as_never_called(tmp_path, monkeypatch, capsys):
    """The Unsloth Qwen3 notebook's check_numbers prints a sample every 5th call: the run's first call must be the
    module's first, whatever the check did."""
    _write_rewards(tmp_path, """
        CALLS = []
        PRINT_EVERY = 5

        def check_numbers(prompts, completions, **kwargs):
            if len(CALLS) % PRINT_EVERY == 0:
                print("SAMPLE", completions[0])
            CALLS.append(len(completions))
            return [0.5 for _ in completions]
        """)
    said = _check(tmp_path, monkeypatch, TLDR_ROWS, ["trl_call_rewards:check_numbers"])
    assert "check_numbers: [0.5" in said and capsys.readouterr().out.count("SAMPLE") == 1  # the probe's own copy
    from grpo_pipeline.rewards import get_reward_funcs
    from grpo_pipeline.rewards.user_code import import_user_module

    (run_reward,) = get_reward_funcs(["trl_call_rewards:check_numbers"])
    assert import_user_module("trl_call_rewards").CALLS == []
    run_reward(prompts=["p"], completions=["c"])
    assert import_user_module("trl_call_rewards").CALLS == [1] and "SAMPLE c" in capsys.readouterr().out
