"""grpo_pipeline.pipeline.data.prepare with the real Qwen2.5 tokenizer, offline: the prepared-data cache and GSM8K from a saved
hub copy."""

import json

import pytest

from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.data.prepare import prepare_dataset
from grpo_pipeline.pipeline.data.sources import hub_saved_copy_dir
from grpo_pipeline.rewards import extract_hash_answer
from tests.data_helpers import make_cfg, sample_rows, write_jsonl


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
    assert changed_file.report["cache_hit"] is False and changed_file.dataset["grpo_answer"] == ["4"]


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
    assert train.dataset["grpo_answer"] == [extract_hash_answer(r["answer"]) for r in rows[:30]]
    test = prepare_dataset(cfg, qwen_tokenizer, split="test")
    assert test.dataset["grpo_id"][0] == "test-0" and test.report["rows_in"] == 20
    # Each split writes its own report: evaluation data does not overwrite the training report.
    assert json.loads((tmp_path / "run" / "data_report.json").read_text(encoding="utf-8"))["split"] == "train"
    assert json.loads((tmp_path / "run" / "data_report_test.json").read_text(encoding="utf-8"))["split"] == "test"
    with pytest.raises(ConfigError, match="splits") as err:
        prepare_dataset(cfg, qwen_tokenizer, split="validation")
    assert err.value.field == "dataset_split"


def test_hub_dataset_without_saved_copy_offline_says_how_to_fix(qwen_tokenizer, tmp_path):
    cfg = make_cfg(tmp_path, dataset_name="grpo-pipeline-tests/no-such-dataset", dataset_config=None)
    with pytest.raises(ConfigError, match="HF_ENDPOINT") as err:  # bad input (exit 2), as an unreachable model
        prepare_dataset(cfg, qwen_tokenizer)
    assert err.value.field == "dataset_name"
    saved = hub_saved_copy_dir(tmp_path / "cache", "grpo-pipeline-tests/no-such-dataset", None, None)
    assert str(saved) in str(err.value)
