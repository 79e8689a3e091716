"""Training-health monitors and the observer reward function, on the real Qwen2.5 tokenizer.

The stop/adjust rules of HealthCallback are in tests/test_health_rules.py."""

from __future__ import annotations

import random

import pytest
from transformers import TrainerControl, TrainerState

from grpo_pipeline.pipeline.config import HealthArguments, PipelineConfig
from grpo_pipeline.pipeline.health.metrics import HealthState, make_observer
from grpo_pipeline.pipeline.health.rules import HealthCallback, build_health
from grpo_pipeline.pipeline.health.metrics import (
    batch_health,
    byte_level_alphabet,
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


@pytest.fixture(scope="module")
def incomplete(qwen):
    return incomplete_utf8_token_ids(qwen)


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


def test_every_kind_of_byte_level_token_is_judged_as_decoding_it_alone_would():
    """Over a byte-level BPE vocabulary built here: whole characters, lone pieces of multi-byte ones, and tokens with
    characters outside the byte alphabet, below 256 (a plain space, a tab, NUL) and above it (CJK written as such):
    the set is exactly the tokens whose own decoding shows U+FFFD."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = {b: char for char, b in byte_level_alphabet().items()}
    def as_token(data: bytes) -> str:
        return "".join(alphabet[b] for b in data)

    pieces = [b"a", b" the", "é".encode(), "你".encode(), "你".encode()[:1], "你".encode()[1:], "😀".encode()[:3],
              b"\xff", "€".encode()[:2], b"\n"]
    # not byte tokens, judged by decoding (which keeps them as written): read as latin-1 bytes, "\x80\x81" would be
    # invalid UTF-8
    raw = [" plain space", "tab\there", "nul\x00", "\x80\x81", "中文", "Ġ中"]
    vocab = {token: i for i, token in enumerate([as_token(p) for p in pieces] + raw + ["<unk>"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    assert is_byte_level_bpe(tokenizer)
    expected = {i for token, i in vocab.items() if token != "<unk>" and "\ufffd" in tokenizer.decode([i])}
    assert incomplete_utf8_token_ids(tokenizer) == frozenset(expected)
    assert {vocab[as_token(p)] for p in pieces[4:9]} <= expected and vocab[as_token("你".encode())] not in expected


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
    texts = clean + garbled[:3]
    assert batch_health(texts, [[]] * len(texts), frozenset())["health/garbled_rate"] == pytest.approx(3 / 6)
    assert batch_health([], [], frozenset())["health/garbled_rate"] == 0.0


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
