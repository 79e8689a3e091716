"""reward_timeout holds for every reward shape (rewards/worker.py): each call of a guarded reward runs in the
reward's own process, killed at the deadline. Over a table of the shapes a cooperative alarm could not stop (a C
call, math_verify's own alarm, an async reward that blocks its loop, a ThreadPoolExecutor's hung thread, a reward
called off the main thread, one that ignores signals), each call ends with the timeout's RewardFailure within the
deadline and a generous slack, and the next call of the same reward works (a fresh worker). Also what the worker
changes: state kept across calls, log_metric, an argument that cannot be pickled, a worker that dies.

The bound below (timeout + 3 s) is a behaviour assertion that the deadline holds, not a performance test: every
hang here lasts HANG s, so the old alarm's way out (after the hang) or no way out both fail it."""

import asyncio
import gc
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from grpo_pipeline.rewards.contract import RewardFailure, guard_reward
from grpo_pipeline.rewards.worker import stop_workers

TIMEOUT = 1.0
SLACK = 3.0
HANG = 20.0


def _python_loop():
    end = time.monotonic() + HANG
    while time.monotonic() < end:
        pass


def _c_sleep():
    time.sleep(HANG)


def _math_verify_then_hang():
    import math_verify  # its parse sets and then clears signal.alarm: the old deadline's alarm with it

    math_verify.parse("$\\frac{1}{2}$")
    time.sleep(HANG)


def _thread_pool_hang():
    with ThreadPoolExecutor(max_workers=2) as pool:  # the pool's exit waits for its hung thread
        pool.submit(time.sleep, HANG).result()


def _signals_ignored():
    for number in (signal.SIGALRM, signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGINT, signal.SIGTERM})
    _python_loop()


def _sync_reward(hang):
    def reward(prompts, completions, **kwargs):
        if completions[0] == "hang":
            hang()
        return [1.0] * len(completions)

    reward.__name__ = f"reward_{hang.__name__.strip('_')}"
    return reward


async def reward_async_blocking(prompts, completions, **kwargs):
    if completions[0] == "hang":
        time.sleep(HANG)  # blocks the event loop: asyncio.wait_for cannot preempt it
    return [1.0] * len(completions)


def _call_in_main_thread(guarded, completions):
    return guarded(prompts=["p"] * len(completions), completions=completions)


def _call_off_the_main_thread(guarded, completions):
    result = {}

    def target():
        try:
            result["value"] = _call_in_main_thread(guarded, completions)
        except BaseException as err:  # noqa: BLE001 - handed back to the test's thread
            result["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG + 10)
    if "error" in result:
        raise result["error"]
    return result["value"]


def _call_as_trl_calls_async(guarded, completions):
    """TRL 1.15 runs async rewards on a loop in a daemon thread and waits on .result() with no timeout."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        return asyncio.run_coroutine_threadsafe(
            guarded(prompts=["p"] * len(completions), completions=completions), loop).result()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


SHAPES = {
    "python loop": (_sync_reward(_python_loop), _call_in_main_thread),
    "blocking C call (time.sleep)": (_sync_reward(_c_sleep), _call_in_main_thread),
    "math_verify, then a hang": (_sync_reward(_math_verify_then_hang), _call_in_main_thread),
    "async def with a blocking call": (reward_async_blocking, _call_as_trl_calls_async),
    "ThreadPoolExecutor with a hung thread": (_sync_reward(_thread_pool_hang), _call_in_main_thread),
    "called off the main thread": (_sync_reward(_c_sleep), _call_off_the_main_thread),
    "ignores signals": (_sync_reward(_signals_ignored), _call_in_main_thread),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_deadline_holds_for_every_reward_shape_and_the_next_call_works(shape):
    func, call = SHAPES[shape]
    guarded = guard_reward(func, timeout=TIMEOUT)
    start = time.monotonic()
    with pytest.raises(RewardFailure, match=rf"`{func.__name__}` did not return within reward_timeout \(1 s\)"):
        call(guarded, ["hang"])
    assert time.monotonic() - start < TIMEOUT + SLACK, shape
    assert call(guarded, ["fine", "fine"]) == [1.0, 1.0]  # a fresh worker answers the next call


class Counter:
    """A reward that keeps state across calls: the calls it has seen."""

    def __init__(self):
        self.calls = 0

    def __call__(self, prompts, completions, **kwargs):
        self.calls += 1
        if completions[0] == "hang":
            time.sleep(HANG)
        return [float(self.calls)] * len(completions)


def test_state_a_reward_keeps_lives_in_its_worker_and_restarts_from_the_trainers_copy():
    counter = Counter()
    guarded = guard_reward(counter, timeout=TIMEOUT)
    assert [guarded(prompts=["p"], completions=["c"]) for _ in range(3)] == [[1.0], [2.0], [3.0]]
    assert counter.calls == 0  # the trainer's copy never sees the worker's calls
    with pytest.raises(RewardFailure, match="did not return within reward_timeout"):
        guarded(prompts=["p"], completions=["hang"])
    assert guarded(prompts=["p"], completions=["c"]) == [1.0]  # forked again from the trainer's copy
    # without a deadline there is no worker: the state is the trainer's own, as in TRL
    inline = guard_reward(counter)
    assert [inline(prompts=["p"], completions=["c"]) for _ in range(2)] == [[1.0], [2.0]]
    assert counter.calls == 2


class TrainerState:
    """Stands for transformers' TrainerState (importing it loads torch): what the worker reads of it."""

    def __init__(self, max_steps):
        self.max_steps, self.global_step, self.log_history = max_steps, 0, []


def test_log_metric_and_trainer_state_reach_the_reward_and_its_logs_come_back():
    def logs(prompts, completions, trainer_state, log_metric, log_extra, **kwargs):
        log_metric("judge/latency", 0.5)
        log_extra("why", ["short"] * len(completions))
        return [float(trainer_state.global_step + len(trainer_state.log_history))] * len(completions)

    seen = []
    state = TrainerState(max_steps=10)
    guarded = guard_reward(logs, timeout=TIMEOUT)
    kwargs = {"trainer_state": state, "log_metric": lambda *a: seen.append(("metric", a)),
              "log_extra": lambda *a: seen.append(("extra", a))}
    assert guarded(prompts=["p"], completions=["c"], **kwargs) == [0.0]
    state.global_step, state.log_history = 3, [{"loss": 1.0}, {"loss": 0.5}]
    assert guarded(prompts=["p"], completions=["c"], **kwargs) == [5.0]
    state.log_history.append({"loss": 0.2})  # only the new entry is sent; the worker's copy has all three
    assert guarded(prompts=["p"], completions=["c"], **kwargs) == [6.0]
    assert seen[:3] == [("metric", ("judge/latency", 0.5)), ("extra", ("why", ["short"])),
                        ("metric", ("rewards/logs/none_frac", 0.0))]


def test_an_argument_that_cannot_be_pickled_runs_the_call_here_warned_once_naming_it():
    warnings = []
    guarded = guard_reward(lambda prompts, completions, environments, **kw: [float(environments[0]())],
                           warn=warnings.append, timeout=TIMEOUT)
    guarded.__name__ = "env_reward"
    environments = [lambda: 2.0]  # a lambda does not pickle
    for _ in range(2):
        assert guarded(prompts=["p"], completions=["c"], environments=environments) == [2.0]
    assert len(warnings) == 1 and "gets environments, which cannot be sent" in warnings[0], warnings


def test_a_reward_that_ends_its_process_is_a_named_failure_and_the_next_call_works():
    def exits(prompts, completions, **kwargs):
        if completions[0] == "exit":
            os._exit(3)
        return [1.0]

    guarded = guard_reward(exits, timeout=TIMEOUT)
    with pytest.raises(RewardFailure, match=r"`exits` ended its own process \(exit code 3\)"):
        guarded(prompts=["p"], completions=["exit"])
    assert guarded(prompts=["p"], completions=["c"]) == [1.0]


def test_a_raise_in_the_worker_names_the_sample_and_the_line_as_in_the_trainers_process():
    def picky(prompts, completions, **kwargs):
        if "bad" in completions:
            raise ValueError("cannot read this one")
        return [1.0] * len(completions)

    with pytest.raises(RewardFailure, match=r"raised ValueError: cannot read this one on prompt 'q', completion "
                                            r"'bad' \(at .*test_reward_deadline.py line \d+\)"):
        guard_reward(picky, timeout=TIMEOUT)(prompts=["p", "q"], completions=["good", "bad"])


def test_the_worker_ends_with_the_guarded_reward():
    guarded = guard_reward(lambda prompts, completions, **kw: [float(os.getpid())], timeout=TIMEOUT)
    pid = int(guarded(prompts=["p"], completions=["c"])[0])
    assert pid != os.getpid()
    del guarded
    gc.collect()
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pid, 0)


def test_the_health_observer_stays_in_the_trainers_process_and_the_recipes_rewards_get_their_own():
    """pipeline/trainer/build.py: the observer's state is read by the health callback, in the trainer's process."""
    from grpo_pipeline.pipeline.trainer.build import guarded_rewards

    def observer(prompts, completions, **kwargs):
        return [float(os.getpid())] * len(completions)

    def mine(prompts, completions, **kwargs):
        return [float(os.getpid())] * len(completions)

    held = []
    guarded_mine, guarded_observer = guarded_rewards([mine, observer], observer, held.append, TIMEOUT)
    assert guarded_observer(prompts=["p"], completions=["c"]) == [float(os.getpid())]
    assert guarded_mine(prompts=["p"], completions=["c"]) != [float(os.getpid())]
    assert held == []


def _reports_its_freeze(prompts, completions, **kwargs):
    """Scores with the worker's own count of frozen objects: > 0 once the child froze what it inherited."""
    return [float(gc.get_freeze_count())] * len(completions)


def test_forking_a_worker_leaves_the_trainers_gc_freeze_as_it_was_and_the_worker_freezes_its_own():
    """A process that froze its objects (a user's gc.freeze, or a server's before it forks) keeps them frozen after
    a worker is forked, and a process that froze nothing has nothing frozen after it: the worker freezes what it
    inherited in its own process, never around the fork in the trainer's."""
    gc.unfreeze()
    try:
        guarded = guard_reward(_reports_its_freeze, timeout=30)
        assert guarded(prompts=["p"], completions=["c"])[0] > 0  # the worker froze its inherited objects
        assert gc.get_freeze_count() == 0
        stop_workers()
        gc.freeze()
        frozen = gc.get_freeze_count()
        guarded = guard_reward(_reports_its_freeze, timeout=30)
        assert guarded(prompts=["p"], completions=["c"])[0] > 0
        assert gc.get_freeze_count() > frozen // 2  # still frozen (a frozen object freed since leaves the count)
    finally:
        stop_workers()
        gc.unfreeze()
        gc.collect()
        gc.freeze()  # as tests/conftest.py leaves each test process: what is alive frozen, nothing collectable
