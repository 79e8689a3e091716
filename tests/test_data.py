"""grpo_pipeline.pipeline.data.prepare with the real Qwen2.5 tokenizer, offline: token counts, the system prompt, limits.

Cleaning, rejections and the sample end to end are in tests/test_data_cleaning.py; the cache and hub copies in
tests/test_data_cache.py."""

import json

import pytest

from grpo_pipeline.pipeline.config import DEFAULT_SYSTEM_PROMPT, ConfigError
from grpo_pipeline.pipeline.data.prepare import DataError, prepare_dataset
from grpo_pipeline.pipeline.data.prompts import (
    check_system_prompt_survives,
    count_prompt_tokens,
    round_up,
    system_prompt_tokens,
)
from grpo_pipeline.rewards.completions import build_prompt
from tests.data_helpers import assert_counts_add_up, make_cfg, sample_rows


def template_count(tokenizer, messages):
    """Independent count: the tokenizer's own apply_chat_template(tokenize=True)."""
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return len(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


# ---------------------------------------------------------------------------------------------
# Token counts
# ---------------------------------------------------------------------------------------------


def test_known_prompt_is_27_tokens(qwen_tokenizer):
    chat = build_prompt("You are a helpful assistant.", "What is 2 plus 2?")
    assert count_prompt_tokens(qwen_tokenizer, [chat]).counts == [27]
    assert template_count(qwen_tokenizer, chat) == 27


def test_batched_counts_equal_apply_chat_template_counts(qwen_tokenizer):
    chats = [build_prompt(DEFAULT_SYSTEM_PROMPT, row["question"]) for row in sample_rows()]
    chats.append(build_prompt("", "no system prompt: the template adds its own"))
    counts = count_prompt_tokens(qwen_tokenizer, chats).counts
    assert counts == [template_count(qwen_tokenizer, chat) for chat in chats]


def test_system_prompt_floor_is_the_system_only_chat(qwen_tokenizer):
    floor = system_prompt_tokens(qwen_tokenizer, DEFAULT_SYSTEM_PROMPT)
    assert floor == template_count(qwen_tokenizer, build_prompt(DEFAULT_SYSTEM_PROMPT, ""))
    assert floor < template_count(qwen_tokenizer, build_prompt(DEFAULT_SYSTEM_PROMPT, "What is 1 + 1?"))


# ---------------------------------------------------------------------------------------------
# The system prompt must survive the chat template
# ---------------------------------------------------------------------------------------------


def test_default_system_prompt_survives_with_its_newlines(qwen_tokenizer):
    rendered = check_system_prompt_survives(qwen_tokenizer, DEFAULT_SYSTEM_PROMPT)
    assert "\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n" in rendered
    assert "\\n" not in rendered


@pytest.mark.parametrize("template", [
    # escapes newlines, so the system prompt's layout reaches the model as a literal \\n
    ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | replace('\n', '\\\\n') }}<|im_end|>\n"
     "{% endfor %}<|im_start|>assistant\n"),
    # drops the system message
    ("{% for m in messages %}{% if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
     "<|im_end|>\n{% endif %}{% endfor %}<|im_start|>assistant\n"),
])
def test_template_that_mangles_the_system_prompt_is_refused(qwen_tokenizer, monkeypatch, tmp_path, template):
    monkeypatch.setattr(qwen_tokenizer, "chat_template", template)
    with pytest.raises(ConfigError, match="chat template") as err:
        prepare_dataset(make_cfg(tmp_path), qwen_tokenizer)
    assert err.value.field == "system_prompt"
    assert not (tmp_path / "cache").exists()  # refused before reading any data


def test_tokenizer_without_chat_template_is_refused(qwen_tokenizer, monkeypatch):
    monkeypatch.setattr(qwen_tokenizer, "chat_template", None)
    with pytest.raises(ConfigError, match="no chat template") as err:
        check_system_prompt_survives(qwen_tokenizer, DEFAULT_SYSTEM_PROMPT)
    assert err.value.field == "system_prompt"


# ---------------------------------------------------------------------------------------------
# Limits
# ---------------------------------------------------------------------------------------------


def test_auto_limits_from_the_longest_prompt(qwen_tokenizer, tmp_path):
    data = prepare_dataset(make_cfg(tmp_path, max_seq_length=512), qwen_tokenizer)
    expected = [template_count(qwen_tokenizer, build_prompt(DEFAULT_SYSTEM_PROMPT, row["question"]))
                for row in sample_rows()]
    assert data.dataset["grpo_prompt_tokens"] == expected
    assert data.max_prompt_length == round_up(max(expected)) and data.max_prompt_length % 16 == 0
    assert max(expected) <= data.max_prompt_length < max(expected) + 16
    assert data.max_completion_length == 512 - data.max_prompt_length
    stats = data.report["prompt_tokens"]
    assert stats["max"] == max(expected) and stats["min"] == min(expected)
    assert stats["p50"] <= stats["p90"] <= stats["p99"] <= stats["max"]
    assert data.report["limits"]["max_prompt_length"] == data.max_prompt_length


def test_auto_prompt_limit_with_fixed_completion_limit_stays_within_max_seq_length(qwen_tokenizer, tmp_path):
    longest = max(template_count(qwen_tokenizer, build_prompt(DEFAULT_SYSTEM_PROMPT, r["question"]))
                  for r in sample_rows())
    # Leave exactly `longest` tokens for the prompt: rounding up to 16 must not go past it.
    cfg = make_cfg(tmp_path, max_seq_length=longest + 200, max_completion_length="200")
    data = prepare_dataset(cfg, qwen_tokenizer)
    assert data.report["rows_kept"] == 50
    assert (data.max_prompt_length, data.max_completion_length) == (longest, 200)


def test_auto_completion_limit_with_no_room_left_names_the_fields(qwen_tokenizer, tmp_path):
    longest = max(template_count(qwen_tokenizer, build_prompt(DEFAULT_SYSTEM_PROMPT, r["question"]))
                  for r in sample_rows())
    with pytest.raises(ConfigError, match="max_seq_length.*max_prompt_length") as err:
        prepare_dataset(make_cfg(tmp_path, max_seq_length=round_up(longest)), qwen_tokenizer)
    assert err.value.field == "max_completion_length"


def test_fixed_limit_drops_longer_prompts_and_lists_them(qwen_tokenizer, tmp_path):
    counts = {f"train-{i}": template_count(qwen_tokenizer, build_prompt(DEFAULT_SYSTEM_PROMPT, row["question"]))
              for i, row in enumerate(sample_rows())}
    limit = sorted(counts.values())[25]  # about half the prompts are longer
    data = prepare_dataset(make_cfg(tmp_path, max_prompt_length=str(limit)), qwen_tokenizer)
    too_long = sorted((i for i, n in counts.items() if n > limit), key=lambda i: int(i.split("-")[1]))
    assert 0 < len(too_long) < 50
    assert set(data.dataset["grpo_id"]) == {i for i, n in counts.items() if n <= limit}
    assert max(data.dataset["grpo_prompt_tokens"]) <= limit
    report = data.report
    assert report["rows_rejected"]["prompt_too_long"] == {"count": len(too_long), "ids": too_long[:20]}
    assert (data.max_prompt_length, data.max_completion_length) == (limit, 1024 - limit)
    assert_counts_add_up(report)
    on_disk = json.loads((tmp_path / "run" / "data_report.json").read_text(encoding="utf-8"))
    assert on_disk["rows_rejected"] == report["rows_rejected"] and on_disk["status"] == "ok"


def test_overlong_policy_error_refuses_and_still_writes_the_report(qwen_tokenizer, tmp_path):
    cfg = make_cfg(tmp_path, max_prompt_length="60", overlong_policy="error")
    with pytest.raises(DataError, match="overlong_policy") as err:
        prepare_dataset(cfg, qwen_tokenizer)
    report = json.loads((tmp_path / "run" / "data_report.json").read_text(encoding="utf-8"))
    assert report["status"] == "error" and report["rows_rejected"]["prompt_too_long"]["count"] > 0
    assert report["rows_rejected"]["prompt_too_long"]["ids"][0] in str(err.value)
    assert_counts_add_up(report)
    assert not list((tmp_path / "cache").glob("[0-9a-f]*"))  # a failed run is not cached


def test_fixed_limit_below_the_system_prompt_names_both_numbers(qwen_tokenizer, tmp_path):
    floor = system_prompt_tokens(qwen_tokenizer, DEFAULT_SYSTEM_PROMPT)
    with pytest.raises(ConfigError) as err:
        prepare_dataset(make_cfg(tmp_path, max_prompt_length=str(floor - 1)), qwen_tokenizer)
    assert err.value.field == "max_prompt_length"
    assert f"({floor - 1})" in str(err.value) and f"{floor} tokens" in str(err.value)


def test_completion_limit_leaving_no_room_for_the_system_prompt_is_refused(qwen_tokenizer, tmp_path):
    floor = system_prompt_tokens(qwen_tokenizer, DEFAULT_SYSTEM_PROMPT)
    cfg = make_cfg(tmp_path, max_seq_length=300, max_completion_length=str(300 - floor + 1))
    with pytest.raises(ConfigError, match=f"{floor} tokens") as err:
        prepare_dataset(cfg, qwen_tokenizer)
    assert err.value.field == "max_completion_length"


@pytest.mark.parametrize("settings, field, words", [
    ({"overlong_policy": "cut"}, "overlong_policy", "drop, error"),  # not taken for drop
    ({"max_seq_length": 512, "max_prompt_length": "400", "max_completion_length": "200"}, "max_completion_length",
     "exceeds max_seq_length (512)"),
])
def test_settings_that_cannot_work_are_refused_by_prepare_itself(qwen_tokenizer, tmp_path, settings, field, words):
    """A Python caller may prepare data without validate(): what validate() would refuse is refused there too,
    naming the option, rather than prepared with a silently different meaning."""
    with pytest.raises(ConfigError) as caught:
        prepare_dataset(make_cfg(tmp_path, **settings), qwen_tokenizer)
    assert caught.value.field == field and words in str(caught.value)
