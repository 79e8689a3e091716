"""grpo_pipeline.pipeline.data.prepare with the real Qwen2.5 tokenizer, offline: cleaning, rejections, the sample end to end,
the report."""

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_pipeline.pipeline.config import DEFAULT_SYSTEM_PROMPT, ConfigError, PipelineConfig
from grpo_pipeline.pipeline.data.prepare import DataError, prepare_dataset
from grpo_pipeline.pipeline.data.clean import REJECT_REASONS, clean_text
from grpo_pipeline.pipeline.data.prompts import round_up
from grpo_pipeline.rewards import extract_hash_answer
from grpo_pipeline.rewards.completions import build_prompt
from tests.data_helpers import assert_counts_add_up, make_cfg, sample_rows, write_jsonl


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
    assert data.dataset["grpo_answer"] == ["2", "3"]
    assert data.dataset["prompt"][0][0] == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}


def test_csv_with_bom_header_crlf_and_numeric_answers(qwen_tokenizer, tmp_path):
    path = tmp_path / "data.csv"
    path.write_bytes("\ufeffquestion,answer\r\n\"Two\r\nlines?\",42\r\nNA,#### 答案：7\r\n".encode("utf-8"))
    data = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)
    assert [p[-1]["content"] for p in data.dataset["prompt"]] == ["Two\nlines?", "NA"]
    assert data.dataset["grpo_answer"] == ["42", "7"]  # text as written: no 42.0, "NA" is not a missing value


def test_parquet_with_bom_in_column_name(qwen_tokenizer, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"\ufeffproblem": ["What is 6 x 7?"], "solution": ["6 x 7 = 42\n#### 42"]}), path)
    cfg = make_cfg(tmp_path, dataset_name=str(path), question_field="problem", answer_field="solution")
    data = prepare_dataset(cfg, qwen_tokenizer)
    assert data.dataset["grpo_answer"] == ["42"] and data.dataset["grpo_id"] == ["train-0"]


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
        {"question": "How many apples?", "answer": "five and a half"},            # 13 unscorable_answer
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
        "unscorable_answer": ["train-13"],
        "duplicate": ["train-9"],
        "prompt_too_long": ["train-10"],
    }
    # every reason but TRL prompts' own (tests/test_data_trl.py rejects each kind of bad `prompt`)
    assert set(got) == set(REJECT_REASONS) - {"invalid_prompt"}
    assert data.dataset["grpo_id"] == ["train-0", "train-11", "train-12"]
    assert data.dataset["grpo_answer"] == ["7", "100", "2400"]
    assert (report["rows_in"], report["rows_kept"], report["rows_rejected_total"]) == (14, 3, 11)
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
    # The sample's own columns reach the rewards as written; the pipeline's are grpo_*.
    assert data.dataset.column_names == ["question", "answer", "prompt", "grpo_answer", "grpo_id",
                                         "grpo_prompt_tokens", "grpo_solution"]
    assert data.dataset["answer"] == [row["answer"] for row in raw]
    assert data.dataset["grpo_solution"][0] == "She makes 24 + 18 = 42 muffins.\nAfter selling 35, she has 42 - 35 = 7 muffins left."
    assert data.dataset["grpo_answer"] == [extract_hash_answer(row["answer"]) for row in raw]
    assert data.dataset[0]["prompt"] == build_prompt("Answer with a number.", raw[0]["question"])
    assert "2400" in data.dataset["grpo_answer"]  # "#### 答案：2400"
    assert (data.report["rows_in"], data.report["rows_kept"], data.report["rows_rejected_total"]) == (50, 50, 0)
    assert data.report["source"]["kind"] == "sample" and len(data.fingerprint) == 64


def test_max_samples_keeps_the_first_rows_and_counts_the_rest(qwen_tokenizer, tmp_path):
    data = prepare_dataset(make_cfg(tmp_path, max_samples=10), qwen_tokenizer)
    assert data.dataset["grpo_id"] == [f"train-{i}" for i in range(10)]
    assert data.report["rows_unused_max_samples"] == 40
    assert data.max_prompt_length == round_up(max(data.dataset["grpo_prompt_tokens"]))
    assert_counts_add_up(data.report)


def test_demo_arithmetic_rows(qwen_tokenizer, tmp_path):
    from grpo_pipeline.pipeline.demo.task import ARITHMETIC

    seed = PipelineConfig().grpo.seed
    data = prepare_dataset(make_cfg(tmp_path, dataset_name="demo-arithmetic", max_samples=12), qwen_tokenizer)
    expected = ARITHMETIC.rows(12, seed=seed, split="train")
    assert [p[-1]["content"] for p in data.dataset["prompt"]] == [e["question"] for e in expected]
    assert data.dataset["grpo_answer"] == [e["answer"] for e in expected]
    assert data.report["source"]["kind"] == "demo" and data.report["rows_in"] == 12

    # max_samples is an upper bound: asking for more than the split holds gives the whole split.
    size = ARITHMETIC.split_size("test")
    test = prepare_dataset(make_cfg(tmp_path, dataset_name="demo-arithmetic", max_samples=10_000), qwen_tokenizer,
                           split="test")
    assert test.report["rows_in"] == size and test.dataset["grpo_id"][0] == "test-0"
    with pytest.raises(ConfigError) as err:
        prepare_dataset(make_cfg(tmp_path, dataset_name="demo-arithmetic"), qwen_tokenizer, split="validation")
    assert err.value.field == "dataset_split"


@pytest.mark.parametrize("answer", [True, False, [7], {"value": 7}, float("nan"), float("inf"), -float("inf")],
                         ids=["true", "false", "list", "mapping", "nan", "inf", "-inf"])
def test_a_boolean_list_mapping_or_non_finite_answer_is_rejected_as_not_a_string_never_kept(answer):
    from grpo_pipeline.pipeline.data.clean import clean_rows

    rows, rejected = clean_rows(["What is 3 + 4?", "What is 1 + 1?"], [answer, 2], ["bad", "good"],
                                extract_hash_answer)
    assert [(row.id, row.answer) for row in rows] == [("good", "2")]  # plain numbers are answers
    assert rejected.ids_by_reason == {"non_string_field": ["bad"]}


def test_json_true_as_an_answer_is_reported_not_trained_on(qwen_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "bools.jsonl", [{"question": "Is 7 odd?", "answer": True},
                                                  {"question": "What is 3 + 4?", "answer": 7}])
    data = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)
    assert data.dataset["grpo_answer"] == ["7"]
    assert data.report["rows_rejected"]["non_string_field"]["ids"] == ["train-0"]


@pytest.mark.parametrize(("answer", "text"), [(42.0, "42"), (-3.0, "-3"), (2.5, "2.5"), (0.125, "0.125"), (7, "7"),
                                              ("7", "7")])
def test_a_number_answer_is_kept_as_its_plain_text_and_an_integral_float_without_point_zero(answer, text):
    """CSV readers turn 42 into 42.0 when a column has a gap; the reward compares text, so "42", never "42.0"."""
    from grpo_pipeline.pipeline.data.clean import clean_rows

    rows, rejected = clean_rows(["What is it?"], [answer], ["row"], extract_hash_answer)
    assert [row.answer for row in rows] == [text] and rejected.total == 0


def test_columns_of_different_lengths_are_an_error_never_silently_cut():
    from grpo_pipeline.pipeline.data.clean import clean_rows

    with pytest.raises(ValueError):
        clean_rows(["Q1", "Q2"], ["1"], ["a", "b"], extract_hash_answer)


def test_the_rejection_summary_counts_every_row_and_lists_the_first_20_ids():
    from grpo_pipeline.pipeline.data.clean import clean_rows

    ids = [f"row-{i}" for i in range(25)]
    _, rejected = clean_rows([" "] * 25, ["1"] * 25, ids, extract_hash_answer)
    summary = rejected.summary()
    assert summary == {"empty_question": {"count": 25, "ids": ids[:20]}}


@pytest.mark.parametrize("extracted", [None, "", "   "])
def test_a_gsm8k_answer_whose_final_answer_reads_empty_is_unparseable_not_kept(extracted):
    from grpo_pipeline.pipeline.data.clean import clean_rows

    rows, rejected = clean_rows(["What is 3 + 4?"], ["3 + 4 = 7\n#### 7"], ["row"], lambda text: extracted)
    assert rows == [] and rejected.ids_by_reason == {"unparseable_answer": ["row"]}


# --- the worked solution and the scorable flag, over their classes -----------------------------------------

# Answer texts, with none, one or several GSM8K markers and calculator notes; never a marker split across parts.
_PART = st.text(st.characters(blacklist_characters="#<>", blacklist_categories=("Cs",)), max_size=12)
_NOTE = st.builds(lambda a, b: f"<<{a}={b}>>{b}", st.integers(0, 99), st.integers(0, 99))
_SEGMENT = st.lists(st.one_of(_PART, _NOTE), max_size=3).map("".join)


@given(value=st.one_of(st.integers(), st.floats(), st.booleans(), st.lists(st.text(max_size=3), max_size=2),
                       st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)),
       segments=st.lists(_SEGMENT, min_size=1, max_size=4))
def test_a_solution_field_value_that_is_not_text_gives_no_worked_solution_whatever_the_answer(value, segments):
    """A number, list or mapping in solution_field is not a worked solution: "" for an answer with or without
    `####`, never a slice of the answer."""
    from grpo_pipeline.pipeline.data.clean import worked_solution

    assert worked_solution(value, "####".join(segments)) == ""


@given(segments=st.lists(_SEGMENT, min_size=2, max_size=5))
def test_the_worked_solution_is_the_text_before_the_last_marker_where_the_final_answer_starts(segments):
    """The reference is read after the LAST `####` (extract_hash_answer), so the worked solution is everything
    before that one, earlier markers included, calculator notes removed."""
    from grpo_pipeline.pipeline.data.clean import CALCULATOR_NOTE, worked_solution

    answer = "####".join(segments)
    expected = clean_text(CALCULATOR_NOTE.sub("", "####".join(segments[:-1])))
    assert worked_solution(None, answer) == expected
    assert answer.rfind("####") == len("####".join(segments[:-1]))  # the same marker extract_hash_answer reads


def test_an_answer_with_two_markers_trains_on_its_last_final_answer_and_the_solution_before_it():
    from grpo_pipeline.pipeline.data.clean import clean_rows

    answer = "First try: 3 + 4 = 8\n#### 8\nCorrected: 3 + 4 = <<3+4=7>>7\n#### 7"
    rows, _ = clean_rows(["What is 3 + 4?"], [answer], ["row"], extract_hash_answer)
    assert [(row.answer, row.solution) for row in rows] == [
        ("7", "First try: 3 + 4 = 8\n#### 8\nCorrected: 3 + 4 = 7")]


@given(answers=st.lists(st.one_of(st.integers(-999, 999), st.text(min_size=1, max_size=8).filter(str.strip)),
                        min_size=1, max_size=6))
def test_without_a_scorability_checker_every_kept_row_is_scorable_and_none_is_listed_as_kept_unscorable(answers):
    """keep_unscorable only lists rows a checker judged unscorable; with no checker, nothing was judged."""
    from grpo_pipeline.pipeline.data.clean import clean_rows

    ids = [f"r{i}" for i in range(len(answers))]
    rows, rejected = clean_rows([f"Q{i}?" for i in ids], answers, ids, lambda text: text.split("####")[-1].strip()
                                or None, keep_unscorable=True)
    assert rows and all(row.scorable is True for row in rows)
    assert rejected.unscorable_kept == [] and rejected.answers_checked == 0
