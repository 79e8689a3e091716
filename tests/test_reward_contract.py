"""The reward contract (rewards/contract.py) over the class of reward behaviours, before the model loads
(`run_checks`, the same function `grpo train --check` and the run call) and while training."""

from __future__ import annotations

import json

import pytest

from grpo_pipeline.pipeline import cli
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer
from grpo_pipeline.pipeline.data.run_data import prepare_train
from grpo_pipeline.pipeline.preflight import check_rewards, run_checks
from grpo_pipeline.rewards.contract import RewardFailure, guard_reward
from train_helpers import PRODUCT_REWARD_TIMEOUT, demo_config

CASES = "reward_contract_cases"

# name -> None (accepted) or a phrase the refusal must contain (besides the function's name)
TABLE = {
    "good": None,
    "returns_tuple": None,
    "returns_none_mix": None,
    "returns_all_none": None,
    "returns_numpy_floats": None,
    "returns_numpy_array": None,
    "uses_answer_and_state": None,
    "async_good": None,
    "raises": "raised KeyError",
    "raises_on_empty": "division by zero on prompt",
    "wrong_arity": "cannot be called the way TRL calls it",
    "no_kwargs": "cannot be called the way TRL calls it",
    "returns_scalar": "returned 1.0 (a float), not a list",
    "returns_none": "returned None (a NoneType), not a list",
    "returns_generator": "(a generator), not a list",
    "returns_string": "(a str), not a list",
    "returns_dict": "(a dict), not a list",
    "returns_too_few": "returned 7 values for 8 completions",
    "returns_strings": "returned '1.0' (a str) for completion 0",
    "returns_bools": "returned True (a bool) for completion 0",
    "returns_nan": "returned nan for completion 0",
    "returns_inf": "returned inf for completion 7",
}


def probe_config(tmp_path, reward: str):
    return demo_config(tmp_path / "run", reward_funcs=["xmlcount", f"{CASES}:{reward}"], data_cache_dir=str(tmp_path / "c"),
                       reward_timeout=PRODUCT_REWARD_TIMEOUT)  # each reward in its own process, as users run it


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """(tokenizer, the prepared training data) of the table's runs: prepared once (the rows and prompts do not depend
    on reward_funcs, only the rewards step does)."""
    cfg = probe_config(tmp_path_factory.mktemp("prepared"), "good")
    tokenizer = load_tokenizer(cfg.model.model_name_or_path)
    return tokenizer, prepare_train(cfg, tokenizer, write_report=False)


def rewards_check(cfg, prepared) -> str:
    """The rewards step of the data check: the rewards called on the run's prepared prompts."""
    tokenizer, train = prepared
    return check_rewards(cfg, tokenizer, train)


@pytest.mark.parametrize("reward", sorted(TABLE))
def test_each_reward_behaviour_is_accepted_or_refused_naming_it(tmp_path, reward, prepared):
    expected = TABLE[reward]
    cfg = probe_config(tmp_path, reward)
    if expected is None:
        message = rewards_check(cfg, prepared)
        assert f"{reward}: [" in message and "8 completions of 2 prepared prompts" in message
        return
    with pytest.raises(ConfigError) as err:
        rewards_check(cfg, prepared)
    assert err.value.field == "reward_funcs"
    assert f"reward function `{reward}`" in str(err.value) and expected in str(err.value)


def test_run_checks_is_the_contract_and_stops_before_anything_loads(tmp_path):
    """The run calls run_checks(stop_at_first=True): the same refusal, as the first error."""
    cfg = probe_config(tmp_path, "returns_nan")
    with pytest.raises(ConfigError, match="returns_nan"):
        run_checks(cfg)
    checks = {c.name: c for c in run_checks(cfg, stop_at_first=False)}
    assert not checks["rewards"].ok and checks["lora"].ok and checks["data"].ok


def test_grpo_train_check_exits_2_naming_the_reward(tmp_path, monkeypatch, capsys):
    """`grpo train --check` through the CLI's main, in this process (a process of its own imports torch before it
    stops, ~10 s; `python -m grpo_pipeline.pipeline`'s own exit status: tests/test_faults.py)."""
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "--check", "--output_dir", str(tmp_path / "r"), "--reward_funcs", "xmlcount",
                     f"{CASES}:raises"])
    assert code == 2
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout is the JSON alone
    rewards = next(c for c in report["checks"] if c["name"] == "rewards")
    assert not rewards["ok"] and "`raises` raised KeyError" in rewards["message"]
    assert "Traceback" not in captured.err


def test_guard_logs_none_share_and_warns_once():
    logged, warnings = [], []
    guarded = guard_reward(lambda prompts, completions, **kw: [None, 1.0, None, 2.0], warn=warnings.append)
    assert guarded.__name__ == "<lambda>"
    for _ in range(3):
        assert guarded(prompts=[""] * 4, completions=["a"] * 4, log_metric=lambda k, v: logged.append((k, v))) \
            == [None, 1.0, None, 2.0]
    assert logged == [("rewards/<lambda>/none_frac", 0.5)] * 3
    assert len(warnings) == 1 and "50%" in warnings[0] and "none_frac" in warnings[0]


def test_guard_keeps_the_name_trl_logs_under():
    from grpo_pipeline.rewards import get_reward_funcs

    for func in get_reward_funcs(["xmlcount", "correctness"]):
        assert guard_reward(func).__name__ == func.__name__


def test_guard_names_the_failing_sample():
    def picky(prompts, completions, answer, **kwargs):
        return [1.0 / int(a) for a in answer]

    with pytest.raises(RewardFailure) as err:
        guard_reward(picky)(prompts=["p1", "p2"], completions=["c1", "c2"], answer=["4", "0"])
    assert "`picky` raised ZeroDivisionError" in str(err.value) and "completion 'c2'" in str(err.value)
    assert "answer='0'" in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("way_out", [lambda: KeyError("final"), lambda: SystemExit(0), lambda: KeyboardInterrupt()],
                         ids=["KeyError", "sys.exit(0)", "KeyboardInterrupt"])
def test_reward_raising_at_step_2_stops_cleanly_with_a_checkpoint(tmp_path, capsys, monkeypatch, way_out):
    """Every way out of a reward mid-run (an error, a sys.exit() in user code, a KeyboardInterrupt it raises itself)
    stops the run as one named failure: exit 2, a checkpoint, summary.json, no traceback."""
    from grpo_pipeline.pipeline.train import EXIT_HEALTH_STOP, run_training

    run_dir = tmp_path / "run"
    # 2 prompts x 4 completions of 16 tokens a step: the way out at step 2 needs a step before it, not a large one
    cfg = demo_config(run_dir, max_steps=5, save_steps=100, reward_funcs=["xmlcount", f"{CASES}:raises_at_step"],
                      reward_timeout=PRODUCT_REWARD_TIMEOUT,  # each reward in its own process, as users run it
                      data_cache_dir=str(tmp_path / "c"), per_device_train_batch_size=8, max_completion_length="16")
    import reward_contract_cases

    monkeypatch.setattr(reward_contract_cases, "RAISE", way_out)
    monkeypatch.setattr(reward_contract_cases, "RAISE_AT_STEP", 1_000)  # the pre-load probe runs at step 0: pass
    checks = run_checks(cfg, stop_at_first=False)
    assert all(c.ok for c in checks)
    monkeypatch.setattr(reward_contract_cases, "RAISE_AT_STEP", 2)
    result = run_training(cfg)
    assert result.status == "stopped" and result.exit_code == EXIT_HEALTH_STOP and result.steps == 1
    assert (run_dir / "checkpoint-1" / "trainer_state.json").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped"
    assert "step 2" in summary["stop_reason"]
    assert f"`raises_at_step` raised {type(way_out()).__name__}" in summary["stop_reason"]
    assert "completion" in summary["stop_reason"]
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert not (run_dir / "lora").exists()
    # none_frac is logged per reward in metrics.jsonl
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert first["rewards/raises_at_step/none_frac"] == 0.0
