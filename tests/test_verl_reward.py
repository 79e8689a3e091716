"""rewards/verl.py as verl uses it: loaded by path (verl's `custom_reward_function.path`, through
importlib.util.spec_from_file_location, as verl/trainer/ppo/reward.py get_custom_reward_fn does) and called once per
completion with the keyword arguments of verl's reward managers (data_source=, solution_str=, ground_truth=,
extra_info=). No verl is needed: the call shape is the contract."""

import importlib.util
import math
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "rewards" / "verl.py"
RIGHT = "<reasoning>\n6 x 7 = 42\n</reasoning>\n<answer>\n42\n</answer>\n"


@pytest.fixture(scope="module")
def compute_score():
    spec = importlib.util.spec_from_file_location("custom_module", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score


def call(compute_score, solution_str, ground_truth="42", extra_info=None, **reward_kwargs):
    score = compute_score(data_source="openai/gsm8k", solution_str=solution_str, ground_truth=ground_truth,
                          extra_info=extra_info, **reward_kwargs)
    assert isinstance(score, float) and math.isfinite(score)
    return score


def test_a_right_answer_in_the_format_scores_the_sum_of_our_rewards(compute_score):
    assert call(compute_score, RIGHT) == 4.0  # correctness 2 + int 0.5 + soft 0.5 + strict 0.5 + xmlcount 0.5


def test_wrong_and_malformed_completions_score_less_and_never_raise(compute_score):
    wrong = call(compute_score, RIGHT.replace("42", "41"))
    assert wrong == 2.0  # the format, not the answer
    assert call(compute_score, "The answer is 42.") == 0.0
    for odd in ["", "<answer>", "<answer>\n42", "\x00" * 10, "<reasoning>" * 1000]:
        assert 0.0 <= call(compute_score, odd) < 4.0


def test_a_reference_without_a_number_counts_zero_not_none(compute_score):
    assert call(compute_score, RIGHT, ground_truth="forty two") == 2.0  # correctness cannot judge: 0 here
    assert call(compute_score, RIGHT, ground_truth=None) == 2.0


def test_the_reward_set_and_weights_come_from_extra_info_or_verl_reward_kwargs(compute_score):
    only = {"reward_funcs": ["correctness"], "reward_weights": [0.5]}
    assert call(compute_score, RIGHT, extra_info=only) == 1.0
    assert call(compute_score, RIGHT, reward_funcs=["correctness", "int"]) == 2.5
    assert call(compute_score, RIGHT, extra_info={"index": 3, "split": "train"}) == 4.0  # verl's own extra_info
    with pytest.raises(ValueError):
        call(compute_score, RIGHT, reward_funcs=["correctness"], reward_weights=[1.0, 2.0])
