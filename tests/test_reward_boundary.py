"""The user-code boundary around every reward (rewards/contract.py guard_reward): every way out of a reward but
a real signal fails only that reward, as one named RewardFailure, and each reward scores its own copy of
the batch. Over the class: every kind of BaseException, sync and async rewards, held (as the trainer calls
them) and not; every part of the batch a reward could edit in place."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from grpo_pipeline.rewards.contract import RewardFailure, SignalInterrupt, guard_reward


class LibraryAbort(BaseException):
    """A library's own BaseException subclass (not an Exception)."""


def _raise(kind):
    if kind is SystemExit:
        raise SystemExit(3)  # what sys.exit(3) does
    if kind is asyncio.CancelledError:
        raise asyncio.CancelledError()
    raise kind("boom")


# Every kind of way out: Exception subclasses, and each direct BaseException subclass a reward can raise
# (KeyboardInterrupt raised by user code itself: only a real signal's SignalInterrupt passes).
FAILURES = [ValueError, RuntimeError, SystemExit, KeyboardInterrupt, LibraryAbort, asyncio.CancelledError,
            MemoryError, RecursionError, AssertionError]


def _reward(kind, is_async):
    if is_async:
        async def ends(prompts, completions, **kwargs):
            _raise(kind)
        return ends

    def ends(prompts, completions, **kwargs):
        _raise(kind)
    return ends


def _call(func, **batch):
    out = func(**batch)
    return asyncio.run(out) if inspect.isawaitable(out) else out


BATCH = dict(prompts=["What is 1+1?", "What is 2+2?"], completions=["2", "4"], answer=["2", "4"])


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", FAILURES, ids=lambda k: k.__name__)
def test_every_way_out_of_a_reward_is_one_named_failure(kind, is_async):
    with pytest.raises(RewardFailure, match=rf"ends.*raised {kind.__name__}") as caught:
        _call(guard_reward(_reward(kind, is_async)), **BATCH)
    assert isinstance(caught.value.__cause__, kind)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", FAILURES, ids=lambda k: k.__name__)
def test_held_every_way_out_is_handed_over_and_the_batch_scores_zeros(kind, is_async):
    held = []
    assert _call(guard_reward(_reward(kind, is_async), hold=held.append), **BATCH) == [0.0, 0.0]
    [failure] = held
    assert isinstance(failure, RewardFailure) and f"raised {kind.__name__}" in str(failure)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", [SignalInterrupt, GeneratorExit], ids=lambda k: k.__name__)
def test_a_real_signal_and_generator_close_keep_their_meaning(kind, is_async):
    held = []
    with pytest.raises(kind):
        _call(guard_reward(_reward(kind, is_async), hold=held.append), **BATCH)
    assert held == []


def _editors():
    """Rewards that edit every part of the batch in place, each in its own way."""
    def completions_text(prompts, completions, **kw):
        completions[0] = "rewritten"
        return [0.0] * len(completions)

    def completions_messages(prompts, completions, **kw):
        completions[0][0]["content"] = "rewritten"
        completions.append([{"role": "assistant", "content": "extra"}])
        return [0.0] * (len(completions) - 1)

    def prompts_messages(prompts, completions, **kw):
        prompts[0][-1]["content"] = "rewritten"
        return [0.0] * len(completions)

    def a_column(prompts, completions, answer, **kw):
        answer.clear()
        return [0.0] * len(completions)

    def a_nested_column(prompts, completions, meta, **kw):
        meta[0]["tags"].append("rewritten")
        return [0.0] * len(completions)

    def completion_ids(prompts, completions, completion_ids, **kw):
        completion_ids[0].reverse()
        return [0.0] * len(completions)

    return [completions_text, completions_messages, prompts_messages, a_column, a_nested_column, completion_ids]


def _conversational_batch():
    return dict(prompts=[[{"role": "user", "content": "What is 1+1?"}]] * 2,
                completions=[[{"role": "assistant", "content": "2"}], [{"role": "assistant", "content": "4"}]],
                answer=["2", "4"], meta=[{"tags": ["a"]}, {"tags": ["b"]}], completion_ids=[[1, 2, 3], [4, 5]])


@pytest.mark.parametrize("editor", _editors(), ids=lambda f: f.__name__)
def test_a_reward_that_edits_the_batch_in_place_cannot_reach_the_next_reward(editor):
    batch = _conversational_batch()
    if editor.__name__ == "completions_text":
        batch["completions"] = ["2", "4"]
    before = repr(batch)
    seen = []

    def next_reward(prompts, completions, **kwargs):
        seen.append(repr(dict(prompts=prompts, completions=completions, **kwargs)))
        return [1.0] * len(completions)

    # the trainer calls every reward with the same batch (TRL's _calculate_rewards)
    assert guard_reward(editor)(**batch) == [0.0, 0.0]
    assert guard_reward(next_reward)(**batch) == [1.0, 1.0]
    assert repr(batch) == before and seen == [before]


def test_the_trainers_own_objects_are_passed_as_they_are():
    state, logged = object(), []

    def reads(prompts, completions, trainer_state, log_metric, **kwargs):
        log_metric("x", 1.0)
        return [float(trainer_state is state)] * len(completions)

    def log_metric(name, value):
        logged.append((name, value))

    assert guard_reward(reads)(prompts=["p"], completions=["c"], trainer_state=state, log_metric=log_metric) == [1.0]
    assert logged[0] == ("x", 1.0)  # the guard then logs its none_frac through the same function


def test_a_generated_completion_keeps_its_token_count_through_the_copy():
    import copy
    import pickle

    from grpo_pipeline.pipeline.backends import Completion

    done = Completion("<answer>4</answer>", tokens=7)
    for copied in (copy.deepcopy([done])[0], pickle.loads(pickle.dumps(done))):
        assert copied == done and copied.tokens == 7 and type(copied) is Completion


def test_the_signal_handlers_raise_the_interrupt_the_boundary_lets_through():
    import os
    import signal

    from grpo_pipeline.pipeline.run.stop import interrupts_raise

    with pytest.raises(SignalInterrupt, match="SIGTERM"):
        with interrupts_raise():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.5) if hasattr(signal, "sigtimedwait") else __import__("time").sleep(0.5)
