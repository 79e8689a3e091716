"""pipeline.data.prepare with the real Qwen2.5 tokenizer, offline: counts, limits, cleaning, rejections, report, cache."""

import json
import unicodedata

import pytest

from pipeline.config import DEFAULT_SYSTEM_PROMPT, ConfigError, PipelineConfig
from pipeline.data.prepare import DataError, prepare_dataset
from pipeline.data.clean import REJECT_REASONS, clean_text
from pipeline.data.prompts import (
    build_prompt,
    check_system_prompt_survives,
    count_prompt_tokens,
    round_up,
    system_prompt_tokens,
)
from pipeline.data.sources import SAMPLE_PATH, hub_saved_copy_dir
from rewards import extract_hash_answer


class CountingTokenizer:
    """Spy on our own collaborator: the real tokenizer, counting how often it is asked to tokenize."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def template_count(tokenizer, messages):
    """Independent count: the tokenizer's own apply_chat_template(tokenize=True)."""
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return len(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def make_cfg(tmp_path, **overrides):
    values = {"dataset_name": "sample", "data_cache_dir": str(tmp_path / "cache"), "output_dir": str(tmp_path / "run")}
    values.update(overrides)
    return PipelineConfig().replace(**values)


def write_jsonl(path, rows, newline="\n", bom=False):
    text = newline.join(json.dumps(row, ensure_ascii=False) for row in rows) + newline
    path.write_bytes((("\ufeff" if bom else "") + text).encode("utf-8"))
    return path


def sample_rows():
    with open(SAMPLE_PATH, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def assert_counts_add_up(report):
    rejected = sum(info["count"] for info in report["rows_rejected"].values())
    assert rejected == report["rows_rejected_total"]
    assert report["rows_in"] == report["rows_kept"] + rejected + report["rows_unused_max_samples"]


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
    assert data.dataset["prompt_tokens"] == expected
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
    assert set(data.dataset["id"]) == {i for i, n in counts.items() if n <= limit}
    assert max(data.dataset["prompt_tokens"]) <= limit
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


# ---------------------------------------------------------------------------------------------
# Cleaning and rejections
# ---------------------------------------------------------------------------------------------


def test_clean_text_strips_bom_normalises_newlines_and_nfc():
    decomposed = "Jose\u0301 pays 5\u20ac"
    assert unicodedata.normalize("NFC", decomposed) != decomposed
    cleaned = clean_text("\ufeff  " + decomposed + "\r\nline two\rline three\r\n ")
    assert cleaned == "Jos\u00e9 pays 5\u20ac\nline two\nline three"
    assert unicodedata.is_normalized("NFC", cleaned)


def test_jsonl_with_bom_crlf_and_decomposed_accents_is_cleaned(qwen_tokenizer, tmp_path):
    rows = [
        {"question": "\ufeffRen\u0065\u0301e has 3 apples.\r\nShe eats 1. How many are left?\r",
         "answer": "#### 2\r\n"},
        {"question": "Bob has 4 pens.\rHe loses 1. How many now?", "answer": "3"},
    ]
    path = write_jsonl(tmp_path / "bom.jsonl", rows, newline="\r\n", bom=True)
    data = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)
    questions = [prompt[-1]["content"] for prompt in data.dataset["prompt"]]
    assert questions == ["Ren\u00e9e has 3 apples.\nShe eats 1. How many are left?",
                         "Bob has 4 pens.\nHe loses 1. How many now?"]
    assert data.dataset["answer"] == ["2", "3"]
    assert data.dataset["prompt"][0][0] == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}


def test_csv_with_bom_header_crlf_and_numeric_answers(qwen_tokenizer, tmp_path):
    path = tmp_path / "data.csv"
    path.write_bytes("\ufeffquestion,answer\r\n\"Two\r\nlines?\",42\r\nNA,#### 答案：7\r\n".encode("utf-8"))
    data = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)
    assert [p[-1]["content"] for p in data.dataset["prompt"]] == ["Two\nlines?", "NA"]
    assert data.dataset["answer"] == ["42", "7"]  # text as written: no 42.0, "NA" is not a missing value


def test_parquet_with_bom_in_column_name(qwen_tokenizer, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"\ufeffproblem": ["What is 6 x 7?"], "solution": ["6 x 7 = 42\n#### 42"]}), path)
    cfg = make_cfg(tmp_path, dataset_name=str(path), question_field="problem", answer_field="solution")
    data = prepare_dataset(cfg, qwen_tokenizer)
    assert data.dataset["answer"] == ["42"] and data.dataset["id"] == ["train-0"]


def test_every_rejection_reason_is_reported_with_ids(qwen_tokenizer, tmp_path):
    long_question = "How many? " + "very " * 300
    rows = [
        {"question": "What is 3 + 4?", "answer": "3 + 4 = 7\n#### 7"},           # 0 kept
        {"question": None, "answer": "1"},                                        # 1 missing_question
        {"answer": "1"},                                                          # 2 missing_question (no key)
        {"question": " \r\n\ufeff ", "answer": "1"},                              # 3 empty_question
        {"question": ["a", "list"], "answer": "1"},                               # 4 non_string_field
        {"question": "What is 5 + 5?", "answer": {"value": 10}},                  # 5 non_string_field
        {"question": "What is 2 + 2?", "answer": None},                           # 6 missing_answer
        {"question": "What is 2 + 3?", "answer": "  "},                           # 7 missing_answer
        {"question": "What is 9 - 1?", "answer": "The answer follows.\n#### "},   # 8 unparseable_answer
        {"question": "What is 3 + 4?", "answer": "#### 7"},                       # 9 duplicate of 0
        {"question": long_question, "answer": "#### 1"},                          # 10 prompt_too_long
        {"question": "What is 10 x 10?", "answer": 100},                          # 11 kept (number answer)
        {"question": "一共多少个？", "answer": "#### 答案：2,400"},                  # 12 kept
    ]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    data = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path), max_prompt_length="128"), qwen_tokenizer)
    report = data.report
    got = {reason: info["ids"] for reason, info in report["rows_rejected"].items()}
    assert got == {
        "missing_question": ["train-1", "train-2"],
        "empty_question": ["train-3"],
        "non_string_field": ["train-4", "train-5"],
        "missing_answer": ["train-6", "train-7"],
        "unparseable_answer": ["train-8"],
        "duplicate": ["train-9"],
        "prompt_too_long": ["train-10"],
    }
    assert set(got) == set(REJECT_REASONS)
    assert data.dataset["id"] == ["train-0", "train-11", "train-12"]
    assert data.dataset["answer"] == ["7", "100", "2400"]
    assert (report["rows_in"], report["rows_kept"], report["rows_rejected_total"]) == (13, 3, 10)
    assert_counts_add_up(report)


def test_strict_turns_rejections_into_an_error_with_counts(qwen_tokenizer, tmp_path):
    rows = [{"question": "Q?", "answer": "#### 1"}, {"question": "", "answer": "2"}, {"question": "Q?", "answer": "1"}]
    path = write_jsonl(tmp_path / "few.jsonl", rows)
    with pytest.raises(DataError, match="strict") as err:
        prepare_dataset(make_cfg(tmp_path, dataset_name=str(path), strict=True), qwen_tokenizer)
    assert "empty_question: 1" in str(err.value) and "duplicate: 1" in str(err.value)
    assert err.value.report["status"] == "error"
    # The same data without strict: kept, with the drops reported; and strict on clean data passes.
    assert prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer).report["rows_kept"] == 1
    assert prepare_dataset(make_cfg(tmp_path, strict=True), qwen_tokenizer).report["rows_kept"] == 50


def test_nothing_usable_is_an_error_not_an_empty_dataset(qwen_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "", "answer": "1"}, {"question": "Q", "answer": None}])
    with pytest.raises(DataError, match="no rows left"):
        prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)


def test_missing_column_names_the_field_and_lists_columns(qwen_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "cols.jsonl", [{"problem": "Q", "answer": "1"}])
    with pytest.raises(ConfigError, match="'problem'") as err:
        prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)
    assert err.value.field == "question_field"


def test_single_file_has_only_a_train_split(qwen_tokenizer, tmp_path):
    with pytest.raises(ConfigError, match="single file") as err:
        prepare_dataset(make_cfg(tmp_path), qwen_tokenizer, split="test")
    assert err.value.field == "dataset_split"


def test_missing_local_file_is_a_config_error(qwen_tokenizer, tmp_path):
    with pytest.raises(ConfigError, match="does not exist") as err:
        prepare_dataset(make_cfg(tmp_path, dataset_name=str(tmp_path / "nope.jsonl")), qwen_tokenizer)
    assert err.value.field == "dataset_name"


# ---------------------------------------------------------------------------------------------
# The sample end to end, max_samples, report file
# ---------------------------------------------------------------------------------------------


def test_sample_as_chat_prompts_with_extracted_answers(qwen_tokenizer, tmp_path):
    data = prepare_dataset(make_cfg(tmp_path, system_prompt="Answer with a number."), qwen_tokenizer)
    raw = sample_rows()
    assert data.dataset.column_names == ["prompt", "answer", "id", "prompt_tokens"]
    assert data.dataset["answer"] == [extract_hash_answer(row["answer"]) for row in raw]
    assert data.dataset[0]["prompt"] == build_prompt("Answer with a number.", raw[0]["question"])
    assert "2400" in data.dataset["answer"]  # "#### 答案：2400"
    assert (data.report["rows_in"], data.report["rows_kept"], data.report["rows_rejected_total"]) == (50, 50, 0)
    assert data.report["source"]["kind"] == "sample" and len(data.fingerprint) == 64


def test_max_samples_keeps_the_first_rows_and_counts_the_rest(qwen_tokenizer, tmp_path):
    data = prepare_dataset(make_cfg(tmp_path, max_samples=10), qwen_tokenizer)
    assert data.dataset["id"] == [f"train-{i}" for i in range(10)]
    assert data.report["rows_unused_max_samples"] == 40
    assert data.max_prompt_length == round_up(max(data.dataset["prompt_tokens"]))
    assert_counts_add_up(data.report)


def test_demo_arithmetic_rows(qwen_tokenizer, tmp_path):
    from pipeline.demo.task import arithmetic_problems, arithmetic_split_size

    seed = PipelineConfig().grpo.seed
    data = prepare_dataset(make_cfg(tmp_path, dataset_name="demo-arithmetic", max_samples=12), qwen_tokenizer)
    expected = arithmetic_problems(12, seed=seed, split="train")
    assert [p[-1]["content"] for p in data.dataset["prompt"]] == [e["question"] for e in expected]
    assert data.dataset["answer"] == [e["answer"] for e in expected]
    assert data.report["source"]["kind"] == "demo" and data.report["rows_in"] == 12

    # max_samples is an upper bound: asking for more than the split holds gives the whole split.
    size = arithmetic_split_size("test")
    test = prepare_dataset(make_cfg(tmp_path, dataset_name="demo-arithmetic", max_samples=10_000), qwen_tokenizer,
                           split="test")
    assert test.report["rows_in"] == size and test.dataset["id"][0] == "test-0"
    with pytest.raises(ConfigError) as err:
        prepare_dataset(make_cfg(tmp_path, dataset_name="demo-arithmetic"), qwen_tokenizer, split="validation")
    assert err.value.field == "dataset_split"


# ---------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------


def test_second_run_is_a_cache_hit_without_tokenizing(qwen_tokenizer, tmp_path):
    first_tok = CountingTokenizer(qwen_tokenizer)
    first = prepare_dataset(make_cfg(tmp_path), first_tok)
    assert first.report["cache_hit"] is False
    assert 1 <= first_tok.calls <= 2  # batched: the system-prompt floor + one call for all 50 prompts

    second_tok = CountingTokenizer(qwen_tokenizer)
    second = prepare_dataset(make_cfg(tmp_path), second_tok)
    assert second_tok.calls == 0
    assert second.report["cache_hit"] is True and second.fingerprint == first.fingerprint
    assert second.dataset.to_list() == first.dataset.to_list()
    assert (second.max_prompt_length, second.max_completion_length) == (first.max_prompt_length,
                                                                       first.max_completion_length)
    assert json.loads((tmp_path / "run" / "data_report.json").read_text(encoding="utf-8"))["cache_hit"] is True


def test_changed_settings_or_file_miss_the_cache(qwen_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "What is 1 + 2?", "answer": "3"}])
    base = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)
    changed_prompt = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path), system_prompt="Be brief."),
                                     qwen_tokenizer)
    assert changed_prompt.report["cache_hit"] is False and changed_prompt.fingerprint != base.fingerprint
    write_jsonl(path, [{"question": "What is 1 + 2?", "answer": "4"}])
    changed_file = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)
    assert changed_file.report["cache_hit"] is False and changed_file.dataset["answer"] == ["4"]


# ---------------------------------------------------------------------------------------------
# GSM8K from the hub: offline from a saved copy
# ---------------------------------------------------------------------------------------------


def test_gsm8k_loads_offline_from_a_saved_copy(qwen_tokenizer, tmp_path):
    from datasets import Dataset, DatasetDict

    rows = sample_rows()
    saved = hub_saved_copy_dir(tmp_path / "cache", "openai/gsm8k", "main", None)
    DatasetDict({"train": Dataset.from_list(rows[:30]), "test": Dataset.from_list(rows[30:])}).save_to_disk(str(saved))

    cfg = make_cfg(tmp_path, dataset_name="openai/gsm8k", dataset_config="main")
    train = prepare_dataset(cfg, qwen_tokenizer)
    assert train.report["source"]["kind"] == "hub" and train.report["rows_kept"] == 30
    assert train.dataset["answer"] == [extract_hash_answer(r["answer"]) for r in rows[:30]]
    test = prepare_dataset(cfg, qwen_tokenizer, split="test")
    assert test.dataset["id"][0] == "test-0" and test.report["rows_in"] == 20
    # Each split writes its own report: evaluation data does not overwrite the training report.
    assert json.loads((tmp_path / "run" / "data_report.json").read_text(encoding="utf-8"))["split"] == "train"
    assert json.loads((tmp_path / "run" / "data_report_test.json").read_text(encoding="utf-8"))["split"] == "test"
    with pytest.raises(ConfigError, match="splits") as err:
        prepare_dataset(cfg, qwen_tokenizer, split="validation")
    assert err.value.field == "dataset_split"


def test_hub_dataset_without_saved_copy_offline_says_how_to_fix(qwen_tokenizer, tmp_path):
    cfg = make_cfg(tmp_path, dataset_name="grpo-pipeline-tests/no-such-dataset", dataset_config=None)
    with pytest.raises(RuntimeError, match="HF_ENDPOINT") as err:
        prepare_dataset(cfg, qwen_tokenizer)
    saved = hub_saved_copy_dir(tmp_path / "cache", "grpo-pipeline-tests/no-such-dataset", None, None)
    assert str(saved) in str(err.value)

