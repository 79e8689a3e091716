"""Training-health monitors, the observer reward function and the stop/adjust rules of HealthCallback."""

from __future__ import annotations

import math
import random

import pytest
from transformers import TrainerControl, TrainerState

from pipeline.config import HealthArguments, PipelineConfig
from pipeline.health.observer import HealthState, make_observer
from pipeline.health.rules import HEALTH_TRAINING_ARGS, HealthCallback, build_health, next_beta
from pipeline.health.metrics import (
    GARBLED_RATE,
    REPETITION_RATE,
    batch_health,
    byte_level_alphabet,
    garbled_rate,
    incomplete_utf8_share,
    incomplete_utf8_token_ids,
    is_byte_level_bpe,
    is_garbled,
    repetition_rate,
)

# Rare CJK characters; Qwen2.5's vocabulary has no single token for most of them, so they are
# encoded as 2-4 byte pieces. The tests search this list instead of trusting hand-listed ids.
RARE_CJK = "龘靐齉爩驫鸞灪麤鱻䨻𪚥𰻞"


@pytest.fixture(scope="module")
def qwen(qwen_tokenizer):
    """The real Qwen2.5 tokenizer (conftest loads it once per session; read-only here)."""
    return qwen_tokenizer


DERIVATION_SECONDS: list[float] = []


@pytest.fixture(scope="module")
def incomplete(qwen):
    import time

    start = time.perf_counter()
    ids = incomplete_utf8_token_ids(qwen)
    DERIVATION_SECONDS.append(time.perf_counter() - start)
    return ids


@pytest.fixture(scope="module")
def split_char(qwen, incomplete):
    """A rare CJK character the real tokenizer splits into several tokens, none valid UTF-8 alone."""
    for char in RARE_CJK:
        ids = qwen.encode(char, add_special_tokens=False)
        if len(ids) > 1 and all("\ufffd" in qwen.decode([i]) for i in ids):
            return char, ids
    pytest.fail(f"none of {RARE_CJK!r} is split into byte pieces by the Qwen2.5 tokenizer")


# --------------------------------------------------------------------------------------------
# Incomplete-UTF-8 token set, from the real Qwen2.5 tokenizer
# --------------------------------------------------------------------------------------------


def test_qwen_is_detected_as_byte_level_bpe(qwen):
    assert is_byte_level_bpe(qwen)


def test_byte_alphabet_matches_the_tokenizers_library():
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = byte_level_alphabet()
    assert set(alphabet) == set(ByteLevel.alphabet())
    assert sorted(alphabet.values()) == list(range(256))


def test_split_cjk_tokens_are_in_the_set_and_ascii_words_are_not(qwen, incomplete, split_char):
    char, ids = split_char
    assert all(i in incomplete for i in ids)
    assert qwen.decode(ids) == char  # together the pieces are the character again
    for word in ["hello", " world", " the", " answer", "<answer>", " 42", "\n"]:
        word_ids = qwen.encode(word, add_special_tokens=False)
        assert not any(i in incomplete for i in word_ids), word
    # Common Chinese words are whole tokens, valid on their own.
    assert not any(i in incomplete for i in qwen.encode("你好，世界", add_special_tokens=False))


def test_special_tokens_are_never_in_the_set(qwen, incomplete):
    assert qwen.all_special_ids
    assert not set(qwen.all_special_ids) & incomplete
    assert not set(qwen.added_tokens_decoder) & incomplete


def test_set_agrees_with_decoding_each_token_alone(qwen, incomplete):
    # Cross-check the byte-table derivation against the tokenizer's own decoder on a sample.
    rng = random.Random(0)
    vocab = qwen.backend_tokenizer.get_vocab(with_added_tokens=False)
    sample = rng.sample(sorted(vocab.values()), 3000) + sorted(incomplete)[:300]
    disagreements = [i for i in sample if (i in incomplete) != ("\ufffd" in qwen.decode([i]))]
    assert disagreements == []
    assert 500 < len(incomplete) < 5000  # single bytes + pieces of multi-byte characters


def test_set_derivation_is_fast(incomplete):
    assert DERIVATION_SECONDS and DERIVATION_SECONDS[0] < 2.0


def test_fallback_for_non_byte_level_tokenizers_decodes_each_id():
    # A SentencePiece-style byte-fallback tokenizer (Llama-2 shape): <0xE4> <0xB8> <0x80> is "一".
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<0xE4>": 0, "<0xB8>": 1, "<0x80>": 2, "a": 3, "<unk>": 4}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    backend.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    assert not is_byte_level_bpe(tokenizer)
    assert tokenizer.encode("一a") == [0, 1, 2, 3]
    assert incomplete_utf8_token_ids(tokenizer) == frozenset({0, 1, 2})


# --------------------------------------------------------------------------------------------
# Text and token monitors
# --------------------------------------------------------------------------------------------


def test_garbled_characters():
    clean = ["<reasoning>2+2</reasoning>\n<answer>\n4\n</answer>", "tab\tand\r\nnewline", "中文答案：4"]
    assert not any(is_garbled(t) for t in clean)
    garbled = ["4\ufffd", "a\u200bb", "a\u200cb", "a\u200db", "a\u2060b", "\ufeffBOM", "nul\x00", "esc\x1b[0m",
               "del\x7f", "c1\x85", "c1\x9f"]
    assert all(is_garbled(t) for t in garbled)
    assert garbled_rate(clean + garbled[:3]) == pytest.approx(3 / 6)
    assert garbled_rate([]) == 0.0


def test_misordered_byte_pieces_decode_to_garbled_text(qwen, split_char):
    _, ids = split_char
    assert is_garbled(qwen.decode(ids[::-1]))  # the pieces in the wrong order: U+FFFD
    assert not is_garbled(qwen.decode(ids))


def test_incomplete_utf8_share_counts_real_byte_pieces(qwen, incomplete, split_char):
    _char, ids = split_char
    words = qwen.encode("The answer is 4.", add_special_tokens=False)
    completion = words + ids
    assert incomplete_utf8_share([completion], incomplete) == pytest.approx(len(ids) / len(completion))
    assert incomplete_utf8_share([words], incomplete) == 0.0
    assert incomplete_utf8_share([], incomplete) == 0.0


def test_repetition_rate_on_loops(qwen):
    prose = qwen.encode("Natalia sold 48 clips in April and half as many in May, so 72 in total.",
                        add_special_tokens=False)
    loop = qwen.encode("= 5 " * 40, add_special_tokens=False)
    assert repetition_rate(prose) == 0.0
    assert repetition_rate(loop) > 0.9
    assert 0.0 < repetition_rate(prose + prose) < repetition_rate(loop)
    assert repetition_rate([3] * 13) == pytest.approx(0.9)  # 10 identical 4-grams: 1 - 1/10
    for ids in ([], [1], [1, 2, 3, 4]):
        assert repetition_rate(ids) == 0.0
    # Bounded in [0, 1) for any input.
    rng = random.Random(1)
    for _ in range(50):
        ids = [rng.randrange(4) for _ in range(rng.randrange(60))]
        assert 0.0 <= repetition_rate(ids) < 1.0


def test_batch_health_values(qwen, incomplete):
    good = "<reasoning>2+2=4</reasoning>\n<answer>\n4\n</answer>"
    texts = [good, "I think it is 4", "\ufffd\ufffd\ufffd"]
    ids = [qwen.encode(t, add_special_tokens=False) for t in texts]
    metrics = batch_health(texts, ids, incomplete)
    assert metrics["health/garbled_rate"] == pytest.approx(1 / 3)
    assert metrics["health/no_answer_rate"] == pytest.approx(2 / 3)
    assert metrics["health/completion_length"] == pytest.approx(sum(map(len, ids)) / 3)
    assert metrics["health/repetition_rate"] == 0.0
    with pytest.raises(ValueError, match="completion_ids"):
        batch_health(texts, ids[:2], incomplete)


# --------------------------------------------------------------------------------------------
# Observer reward function
# --------------------------------------------------------------------------------------------


def _recorder():
    logged: list[tuple[str, float]] = []
    return logged, lambda name, value: logged.append((name, value))


def test_observer_logs_metrics_for_both_completion_shapes(qwen):
    observer, callback = build_health(PipelineConfig(), qwen)
    assert observer.__name__ == "health"
    texts = ["<answer>7</answer>", "loop " * 30, "bad\u200b"]
    ids = [qwen.encode(t, add_special_tokens=False) for t in texts]
    conversational = [[{"role": "assistant", "content": t}] for t in texts]
    for completions in (texts, conversational):
        logged, log_metric = _recorder()
        rewards = observer(prompts=["q"] * 3, completions=completions, completion_ids=ids, log_metric=log_metric,
                           answer=["7"] * 3, trainer_state=None)
        assert rewards == [0.0, 0.0, 0.0]
        values = dict(logged)
        assert values["health/garbled_rate"] == pytest.approx(1 / 3)
        assert values["health/no_answer_rate"] == pytest.approx(2 / 3)
        assert values["health/repetition_rate"] == pytest.approx(repetition_rate(ids[1]) / 3)
        assert values["health/completion_length"] == pytest.approx(sum(map(len, ids)) / 3)
        assert values["health/incomplete_utf8_share"] == 0.0
        assert "health/beta" not in values  # beta = 0: no KL term, nothing to log
    assert callback.state.batches == 2


def test_observer_without_log_metric_or_ids_feeds_the_callback(qwen, incomplete):
    state = HealthState()
    observer = make_observer(state, incomplete, qwen)
    callback = HealthCallback(HealthArguments(garbled_window=1, garbled_threshold=0.3), beta=0.0, state=state)
    rewards = observer(prompts=["q", "q"], completions=["\ufffd", "\x00"])  # no ids, no log_metric
    assert rewards == [0.0, 0.0]
    control = TrainerControl()
    logs = {"loss": 0.1}
    callback.on_log(None, TrainerState(global_step=4), control, logs=logs)
    assert logs["health/garbled_rate"] == 1.0  # taken from the shared state
    assert control.should_training_stop and callback.stop_rule == "garbled"


def test_observer_logs_beta_when_kl_is_on(incomplete):
    state = HealthState()
    observer = make_observer(state, incomplete)
    HealthCallback(HealthArguments(), beta=0.04, state=state)
    logged, log_metric = _recorder()
    observer(completions=["a"], completion_ids=[[64]], log_metric=log_metric)
    assert dict(logged)["health/beta"] == 0.04
    with pytest.raises(ValueError, match="completion_ids"):
        observer(completions=["a"])  # no ids and no tokenizer to rebuild them


# --------------------------------------------------------------------------------------------
# HealthCallback rules, with real TrainerControl / TrainerState
# --------------------------------------------------------------------------------------------


def _callback(beta: float = 0.0, **health) -> HealthCallback:
    return HealthCallback(HealthArguments(**health), beta=beta)


def _log(callback: HealthCallback, step: int, **logs) -> TrainerControl:
    control = TrainerControl()
    state = TrainerState(global_step=step)
    result = callback.on_log(None, state, control, logs=dict(logs))
    assert result is control
    return control


@pytest.mark.parametrize("key,value", [("loss", math.nan), ("loss", math.inf), ("grad_norm", math.inf),
                                       ("grad_norm", math.nan), ("kl", math.nan)])
def test_non_finite_always_stops_and_saves(key, value):
    callback = _callback(beta=0.04, garbled_action="warn", kl_action="warn")
    logs = {"loss": 0.1, "grad_norm": 0.5, "kl": 0.01, key: value}
    assert not _log(callback, 4, loss=0.1, grad_norm=0.5).should_training_stop
    control = _log(callback, 5, **logs)
    assert control.should_training_stop and control.should_save
    assert callback.stop_rule == "non_finite" and callback.stop_step == 5
    assert f"{key} is {value}" in callback.stop_reason and "step 5" in callback.stop_reason


def test_finite_logs_do_not_stop():
    callback = _callback(beta=0.04)
    for step in range(1, 20):
        control = _log(callback, step, loss=-0.02, grad_norm=0.3, kl=0.05, **{GARBLED_RATE: 0.1, REPETITION_RATE: 0.2})
        assert not control.should_training_stop and not control.should_save
    assert callback.stop_reason is None and callback.warnings == []


def test_garbled_stops_only_when_the_window_average_exceeds_the_threshold():
    callback = _callback(garbled_threshold=0.3, garbled_window=3)
    assert not _log(callback, 1, loss=0.1, **{GARBLED_RATE: 0.9}).should_training_stop
    assert not _log(callback, 2, loss=0.1, **{GARBLED_RATE: 0.9}).should_training_stop  # window not full
    control = _log(callback, 3, loss=0.1, **{GARBLED_RATE: 0.9})
    assert control.should_training_stop and control.should_save
    assert callback.stop_rule == "garbled"
    assert "0.900" in callback.stop_reason and "0.3" in callback.stop_reason and "3 logged steps" in callback.stop_reason


def test_garbled_spike_below_window_average_does_not_stop():
    callback = _callback(garbled_threshold=0.3, garbled_window=3)
    for step, rate in enumerate([0.0, 0.0, 0.9, 0.0, 0.0, 0.29, 0.29, 0.29], start=1):
        assert not _log(callback, step, loss=0.1, **{GARBLED_RATE: rate}).should_training_stop
    assert callback.stop_reason is None


def test_warn_action_warns_without_stopping_and_rate_limits():
    callback = HealthCallback(HealthArguments(garbled_action="warn", garbled_window=1), beta=0.0, warn_every_steps=10)
    for step in range(1, 25):
        control = _log(callback, step, loss=0.1, **{GARBLED_RATE: 0.8})
        assert not control.should_training_stop and not control.should_save
    assert callback.stop_reason is None
    assert len(callback.warnings) == 3  # steps 1, 11, 21
    assert callback.warnings[0].startswith("step 1:") and "garbled" in callback.warnings[0]


def test_repetition_warns_by_default_and_can_stop():
    callback = _callback()
    assert not _log(callback, 1, loss=0.1, **{REPETITION_RATE: 0.95}).should_training_stop
    assert len(callback.warnings) == 1 and "repetition" in callback.warnings[0]
    stopper = _callback(repetition_action="stop")
    assert _log(stopper, 1, loss=0.1, **{REPETITION_RATE: 0.95}).should_training_stop
    assert stopper.stop_rule == "repetition"


def test_kl_ceiling_stops_when_beta_positive():
    callback = _callback(beta=0.04, kl_ceiling=1.0)
    assert not _log(callback, 1, loss=0.1, kl=0.9).should_training_stop
    control = _log(callback, 2, loss=0.1, kl=3.5)
    assert control.should_training_stop and control.should_save and callback.stop_rule == "kl"
    assert "kl 3.5" in callback.stop_reason and "kl_ceiling 1.0" in callback.stop_reason
    # beta = 0 has no KL term; a kl value (from elsewhere) is not acted on.
    assert not _log(_callback(beta=0.0, kl_ceiling=1.0), 1, loss=0.1, kl=3.5).should_training_stop
    warner = _callback(beta=0.04, kl_action="warn")
    assert not _log(warner, 1, loss=0.1, kl=3.5).should_training_stop and len(warner.warnings) == 1


def test_after_a_stop_later_logs_change_nothing():
    callback = _callback()
    _log(callback, 3, loss=math.nan)
    reason = callback.stop_reason
    _log(callback, 4, loss=math.inf, **{GARBLED_RATE: 1.0})
    assert callback.stop_reason == reason and callback.stop_step == 3


def test_eval_and_summary_logs_are_ignored():
    callback = _callback(garbled_window=1)
    assert not _log(callback, 3, eval_loss=math.nan).should_training_stop
    assert not _log(callback, 3, train_runtime=12.0, train_loss=math.nan).should_training_stop


class StandInTrainer:
    """Anything with a `beta` attribute: what the callback reads and sets on a GRPOTrainer."""

    def __init__(self, beta: float):
        self.beta = beta


def test_adaptive_beta_moves_toward_the_target_within_bounds():
    settings = {"adaptive_beta": True, "kl_target": 0.05, "beta_min": 0.01, "beta_max": 0.1, "kl_ceiling": 100.0}
    trainer = StandInTrainer(0.04)
    callback = _callback(beta=0.04, **settings).attach(trainer)
    callback.on_train_begin(None, TrainerState(), TrainerControl())

    logs = {"loss": 0.1, "kl": 1.0}
    callback.on_log(None, TrainerState(global_step=1), TrainerControl(), logs=logs)
    assert trainer.beta == pytest.approx(0.06) and logs["health/beta"] == pytest.approx(0.06)  # high KL: up
    for step in range(2, 10):
        _log(callback, step, loss=0.1, kl=1.0)
    assert trainer.beta == 0.1  # capped at beta_max

    _log(callback, 10, loss=0.1, kl=0.05)
    assert trainer.beta == 0.1  # inside the dead band: unchanged
    _log(callback, 11, loss=0.1, kl=0.001)
    assert trainer.beta == pytest.approx(0.1 / 1.5)  # low KL: down
    for step in range(12, 30):
        _log(callback, step, loss=0.1, kl=0.001)
    assert trainer.beta == 0.01  # floored at beta_min
    assert callback.summary()["final_beta"] == 0.01
    assert callback.state.beta == 0.01  # the observer logs the live value


def test_adaptive_beta_needs_an_attached_trainer():
    callback = _callback(beta=0.04, adaptive_beta=True)
    with pytest.raises(RuntimeError, match="attach"):
        callback.on_train_begin(None, TrainerState(), TrainerControl())


def test_next_beta_direction():
    assert next_beta(0.04, 1.0, 0.05, 0.001, 0.5) > 0.04
    assert next_beta(0.04, 0.0, 0.05, 0.001, 0.5) < 0.04
    assert next_beta(0.04, 0.06, 0.05, 0.001, 0.5) == 0.04
    assert next_beta(0.0011, 0.0, 0.05, 0.001, 0.5) == 0.001


def test_bad_action_is_a_config_error():
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match="garbled_action"):
        _callback(garbled_action="halt")


def test_on_train_begin_turns_off_the_nan_filter(tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    assert args.logging_nan_inf_filter  # HF default hides NaN losses
    _callback().on_train_begin(args, TrainerState(), TrainerControl())
    assert args.logging_nan_inf_filter is False
    assert HEALTH_TRAINING_ARGS == {"logging_nan_inf_filter": False}


# --------------------------------------------------------------------------------------------
# A real (tiny, non-GRPO) HF Trainer: the stop lands with a checkpoint of the failing step.
# --------------------------------------------------------------------------------------------


def test_nan_in_a_real_trainer_stops_and_keeps_the_checkpoint(tmp_path):
    import torch
    from transformers import Trainer, TrainingArguments

    class Tiny(torch.nn.Module):
        """Its 4th forward pass (step 4) sees a NaN input, so that step's loss and gradients are NaN."""

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(2))
            self.calls = 0

        def forward(self, x, labels=None):
            self.calls += 1
            if self.calls == 4:
                x = x * math.nan
            return {"loss": ((self.weight * x).sum() - 1.0) ** 2}

    data = [{"x": torch.tensor([0.1, 0.2])} for _ in range(20)]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=1, max_steps=20,
                             logging_steps=1, save_steps=1000, report_to="none", use_cpu=True,
                             learning_rate=1e-3, max_grad_norm=1.0, save_only_model=True)
    callback = _callback()
    trainer = Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    assert trainer.state.global_step == 4
    assert callback.stop_step == 4 and callback.stop_rule == "non_finite"
    assert (tmp_path / "checkpoint-4").is_dir()
    assert not any(p.name.startswith("checkpoint-") and p.name != "checkpoint-4" for p in tmp_path.iterdir())
