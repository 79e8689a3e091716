"""TRL's dataset formats and reward contract, as a TRL / Unsloth-notebook user brings them.

A `prompt` column trains with no field mapping, standard (a string) or conversational (messages); a prompt's own
system message is kept and system_prompt is added only to a chat without one; every column reaches every reward
with its values and types, and the pipeline's own columns (grpo_*) never hide one of the user's.
"""

import json

import pytest

from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.data.columns import OWN_COLUMNS
from grpo_pipeline.pipeline.data.prepare import prepare_dataset
from grpo_pipeline.pipeline.data.prompts import is_conversational
from tests.data_helpers import make_cfg, write_jsonl
from tests.train_helpers import tiny_qwen_config

SYSTEM = "Answer in <answer> tags."
NOTEBOOK_SYSTEM = "\nRespond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n"

# Every JSON value type a column can hold, one column each; each row differs, so a misaligned row shows.
TYPED_COLUMNS = {
    "answer": lambda i: str(i + 2),         # a user's `answer`: theirs, as written
    "solution": lambda i: f"${i + 2}$",      # TRL's accuracy_reward column: never our warm-up text
    "id": lambda i: f"user-{i}",             # a user's `id`: not ours
    "ground_truth": lambda i: i + 2,         # int
    "ratio": lambda i: i / 4,                # float
    "flag": lambda i: i % 2 == 0,            # bool
    "tags": lambda i: [f"t{i}", "x"],        # list
    "meta": lambda i: {"level": i, "src": "mine"},  # dict
}


def _prompt(kind, i):
    question = f"What is {i} + 2?"
    if kind == "standard":
        return f"Question: {question}\nAnswer:"
    chat = [{"role": "user", "content": question}]
    if kind == "own_system" or (kind == "mixed_system" and i % 2 == 0):
        chat.insert(0, {"role": "system", "content": NOTEBOOK_SYSTEM})
    return chat


def _rows(kind, n=8):
    return [{"prompt": _prompt(kind, i), **{name: make(i) for name, make in TYPED_COLUMNS.items()}} for i in range(n)]


@pytest.mark.parametrize("kind", ["standard", "no_system", "own_system", "mixed_system"])
def test_a_prompt_column_is_used_as_trl_uses_it_and_every_user_column_is_kept_as_written(qwen_tokenizer, tmp_path,
                                                                                         kind):
    rows = _rows(kind)
    path = write_jsonl(tmp_path / "trl.jsonl", rows)
    data = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path), system_prompt=SYSTEM), qwen_tokenizer)

    assert data.report["rows_kept"] == len(rows)
    for row, prompt in zip(rows, data.dataset["prompt"], strict=True):
        if kind == "standard":
            assert prompt == row["prompt"]  # as written: no chat, no system message
        elif row["prompt"][0]["role"] == "system":
            assert prompt == row["prompt"]  # the user's own system message is kept
        else:
            assert prompt == [{"role": "system", "content": SYSTEM}, *row["prompt"]]
    for name, make in TYPED_COLUMNS.items():
        assert data.dataset[name] == [make(i) for i in range(len(rows))], name
    assert set(OWN_COLUMNS) <= set(data.dataset.column_names)
    # answer_field's value, reduced, is ours under grpo_answer; the user's `answer` is untouched
    assert data.dataset["grpo_answer"] == [row["answer"] for row in rows]
    formats = data.report["prompt_format"]
    chats = 0 if kind == "standard" else len(rows)
    own = sum(1 for row in rows if is_conversational(row["prompt"]) and row["prompt"][0]["role"] == "system")
    assert (formats["standard"], formats["conversational"]) == (len(rows) - chats, chats)
    assert formats["system_prompt"] == {"added": chats - own, "own_kept": own, "standard_as_written": len(rows) - chats}
    assert data.report["columns"] == sorted(TYPED_COLUMNS)
    # the system message the rows carried, which the adapter records: theirs when all share it, ours when we added
    # it, none (with a note naming --system_prompt) when they differ or text prompts carry none
    expected = {"standard": "", "no_system": SYSTEM, "own_system": NOTEBOOK_SYSTEM, "mixed_system": ""}[kind]
    assert formats["system_message"] == expected
    assert ("--system_prompt" in formats["system_message_note"]) == (kind == "mixed_system")


def test_a_prompt_column_needs_no_answer_column_and_a_named_one_must_exist(qwen_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"{i} + 1 =", "solution": str(i + 1)} for i in range(4)])
    data = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)
    assert data.dataset["grpo_answer"] == [None] * 4 and data.dataset["solution"] == ["1", "2", "3", "4"]
    with pytest.raises(ConfigError, match="answer_field") as err:
        prepare_dataset(make_cfg(tmp_path, dataset_name=str(path), answer_field="target"), qwen_tokenizer)
    assert "'target'" in str(err.value)


@pytest.mark.parametrize("bad, reason", [
    (None, "missing_question"), ("   ", "empty_question"), (42, "invalid_prompt"),
    ([{"role": "user"}], "invalid_prompt"), ([{"role": "system", "content": "S"}], "empty_question"),
    ([{"role": "user", "content": ["a", "b"]}], "invalid_prompt"),
])
def test_a_prompt_that_is_neither_text_nor_messages_is_rejected_with_its_reason(qwen_tokenizer, tmp_path, bad,
                                                                                reason):
    rows = [{"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}, {"prompt": bad, "answer": "3"}]
    if not isinstance(bad, list):  # a JSON file holds one type per column: the standard form's neighbour
        rows[0]["prompt"] = "1+1="
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    try:
        data = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)
    except Exception as err:  # a column `datasets` cannot read as one type is a file error, named
        assert "bad.jsonl" in str(err)
        return
    assert data.report["rows_rejected"][reason]["ids"] == ["train-1"]
    assert data.report["rows_kept"] == 1


def test_question_field_with_a_prompt_column_too_is_refused_naming_question_field(qwen_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "both.jsonl", [{"prompt": "1+1=", "q": "What is 1+1?", "answer": "2"}])
    with pytest.raises(ConfigError, match="question_field") as err:
        prepare_dataset(make_cfg(tmp_path, dataset_name=str(path), question_field="q"), qwen_tokenizer)
    assert "prompt" in str(err.value)


def test_a_user_column_with_the_pipelines_prefix_is_refused(qwen_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "own.jsonl", [{"question": "1+1?", "answer": "2", "grpo_answer": "x"}])
    with pytest.raises(ConfigError, match="grpo_answer"):
        prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["standard", "own_system"])
def test_every_column_reaches_every_reward_through_trl_in_the_prompts_format(tmp_path, monkeypatch, kind):
    """A real tiny GRPO run on a TRL-format file: TRL calls the rewards; each gets the user's columns with
    their types, and completions as strings (standard prompts) or assistant messages (conversational)."""
    from grpo_pipeline.pipeline.train import run_training

    record = tmp_path / "calls.jsonl"
    monkeypatch.setenv("GRPO_TEST_RECORD", str(record))
    rows = _rows(kind)
    path = write_jsonl(tmp_path / "trl.jsonl", rows)
    rewards = ["train_helpers:record_reward_call", "xmlcount"] + (["correctness"] if kind != "standard" else [])
    cfg = tiny_qwen_config(tmp_path / "run", dataset_name=str(path), max_steps=1, eval_before=False,
                           eval_after=False, reward_funcs=rewards, reward_weights=[1.0] * len(rewards),
                           data_cache_dir=str(tmp_path / "cache"))
    result = run_training(cfg)
    assert result.status == "completed", result

    calls = [c for c in _records(record) if "trainer_state" in c["kwargs"]]  # the trainer's, not the probe's
    assert calls, "the trainer never called the reward"
    by_id = {f"user-{i}": row for i, row in enumerate(rows)}
    for call in calls:
        kwargs = call["kwargs"]
        for completion in call["completions"]:
            if kind == "standard":
                assert completion["type"] in ("str", "Completion")
            else:
                assert completion["type"] == "list" and completion["value"][0]["role"] == "assistant"
        for i, row_id in enumerate(kwargs["id"]):
            row = by_id[row_id["value"]]
            for name in TYPED_COLUMNS:
                got = kwargs[name][i]
                assert got["value"] == row[name], (name, got, row[name])
                assert got["type"] == type(row[name]).__name__, (name, got)
        for name in ("completion_ids", "trainer_state", "log_extra", "log_metric", "grpo_answer"):
            assert name in kwargs, name

    # `grpo generate` prompts the adapter as it was trained: a standard prompt as written, a question as a chat
    from grpo_pipeline.pipeline.backends.plain import PlainGenerator
    from grpo_pipeline.pipeline.infer.generate import generate_answers

    sent = []
    real_generate = PlainGenerator.generate

    def recording(self, prompts, *args, **kw):  # the model boundary: records, then generates for real
        sent.extend(prompts)
        return real_generate(self, prompts, *args, **kw)

    monkeypatch.setattr(PlainGenerator, "generate", recording)
    asked = rows[0]["prompt"] if kind == "standard" else "What is 1 + 2?"
    (answer,) = generate_answers([asked], lora=str(tmp_path / "run" / "lora"), backend="plain")
    assert answer["prompt"] == asked
    if kind == "standard":
        assert sent == [asked]
    else:  # the system message the training rows carried (the notebook's own), not our default
        assert sent[0].startswith(f"<|im_start|>system\n{NOTEBOOK_SYSTEM}") and asked in sent[0]
    recorded = json.loads((tmp_path / "run" / "lora" / "grpo_adapter.json").read_text())
    assert recorded["system_prompt"] == ("" if kind == "standard" else NOTEBOOK_SYSTEM)
    if kind != "standard":  # --system overrides the record (a standard prompt, as written, has no system message)
        sent.clear()
        generate_answers([asked], lora=str(tmp_path / "run" / "lora"), backend="plain", system_prompt="Be terse.")
        assert sent[0].startswith("<|im_start|>system\nBe terse.")


def test_grpo_generate_input_takes_a_question_a_text_prompt_or_a_chat_and_names_a_bad_line(tmp_path):
    import argparse

    from grpo_pipeline.pipeline.data.prompts import as_chat
    from grpo_pipeline.pipeline.data.source_spec import DataFileError
    from grpo_pipeline.pipeline.infer.generate import read_rows

    chat = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "3+3?"}]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"question": "1+1?"}, {"prompt": "2+2?"}, {"prompt": chat}]))
    prompts = [row["prompt"] for row in read_rows(argparse.Namespace(prompt=None, input=str(path)))]
    assert prompts == ["1+1?", "2+2?", chat]
    assert [as_chat(SYSTEM, p)[0]["content"] for p in prompts] == [SYSTEM, SYSTEM, "Mine."]
    path.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"prompt": [{"role": "user"}]}) + "\n")
    with pytest.raises(DataFileError, match="line 2"):
        read_rows(argparse.Namespace(prompt=None, input=str(path)))


@pytest.mark.parametrize("has_answer_column", [False, True])
def test_answer_field_naming_another_column_never_hides_a_users_answer(qwen_tokenizer, tmp_path, has_answer_column):
    rows = [{"question": f"{i}+1?", "final": f"#### {i + 1}", **({"answer": f"mine-{i}"} if has_answer_column else {})}
            for i in range(3)]
    path = write_jsonl(tmp_path / "qa.jsonl", rows)
    data = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path), answer_field="final"), qwen_tokenizer)
    assert data.dataset["grpo_answer"] == ["1", "2", "3"] and data.dataset["final"] == [r["final"] for r in rows]
    # without an `answer` column of the user's, the reference also arrives as `answer` (the old keyword)
    assert data.dataset["answer"] == ([f"mine-{i}" for i in range(3)] if has_answer_column else ["1", "2", "3"])


NOTEBOOK_REWARDS = ["nb_xmlcount_reward_func", "nb_soft_format_reward_func", "nb_strict_format_reward_func",
                    "nb_int_reward_func", "correctness_reward_func"]


@pytest.mark.slow
def test_the_unsloth_notebooks_dataset_and_five_rewards_train_unchanged(tmp_path, capsys):
    """get_gsm8k_questions()'s rows (its own system message, `answer` already extracted) and the notebook's five
    reward functions, as it writes them, on the tiny CPU model: the system message is the notebook's, every
    reward is called by TRL and logged, its `answer` is the notebook's column."""
    from grpo_pipeline.pipeline.train import run_training
    from tests import unsloth_notebook_rewards as notebook
    from tests.data_helpers import sample_rows

    rows = notebook.get_gsm8k_questions(sample_rows()[:12])
    path = write_jsonl(tmp_path / "gsm8k_notebook.jsonl", rows)
    cfg = tiny_qwen_config(tmp_path / "run", dataset_name=str(path), max_steps=1, eval_before=False,
                           eval_after=False, data_cache_dir=str(tmp_path / "cache"),
                           reward_funcs=[f"unsloth_notebook_rewards:{name}" for name in NOTEBOOK_REWARDS],
                           reward_weights=[1.0] * 5)
    result = run_training(cfg)
    assert result.status == "completed", result
    printed = capsys.readouterr().out
    assert "Question:" in printed and "\nAnswer:\n" in printed  # the notebook's correctness reward ran, printing
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    for name in NOTEBOOK_REWARDS:
        assert f"rewards/{name}/mean" in first, name
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert report["prompt_format"]["system_prompt"] == {"added": 0, "own_kept": 12, "standard_as_written": 0}


TRL_REWARDS = ["trl.rewards.accuracy_reward", "trl.rewards.think_format_reward",
               "trl.rewards.reasoning_accuracy_reward"]


def test_trls_own_rewards_by_their_dotted_paths_get_the_solution_column(tmp_path, capsys):
    """What trl.rewards exports as reward functions (the get_* factories need arguments, in Python), called by
    --check as the trainer calls them, on a TRL-format dataset with a `solution` column."""
    from grpo_pipeline.pipeline.train import main

    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 2? Answer in \\boxed{{}}."}],
             "solution": f"${i + 2}$"} for i in range(4)]
    path = write_jsonl(tmp_path / "trl.jsonl", rows)
    code = main(["--config", "configs/cpu-demo.yaml", "--model_name_or_path", "tiny-qwen2.5", "--dataset_name",
                 str(path), "--sft_warmup_steps", "0", "--output_dir", str(tmp_path / "run"), "--check",
                 "--reward_funcs", *TRL_REWARDS])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"], report
    message = next(c for c in report["checks"] if c["name"] == "rewards")["message"]
    for spec in TRL_REWARDS:
        assert spec.rsplit(".", 1)[1] + ":" in message, (spec, message)


def test_trl_prompts_are_deduplicated_on_the_whole_prompt_and_answer_and_keep_what_they_ask():
    """Two chats asking the same under different system messages are two problems; the same prompt and answer
    twice is a duplicate; a row's answer never rejects it (an unreadable GSM8K one just gives no reference)."""
    from grpo_pipeline.pipeline.data.clean import clean_rows
    from grpo_pipeline.rewards import extract_hash_answer

    def chat(system, question):
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]

    prompts = [chat("A", "2+2?"), chat("B", "2+2?"), chat("A", "2+2?"), "3+3=", "3+3=", chat(None, "5+5?")]
    answers = ["4", "4", "4", "6", "7", "worked #### "]
    rows, rejected = clean_rows(prompts, answers, [f"r{i}" for i in range(6)], extract_hash_answer,
                                trl_prompts=True)
    assert [r.id for r in rows] == ["r0", "r1", "r3", "r4", "r5"] and [r.index for r in rows] == [0, 1, 3, 4, 5]
    assert rejected.ids_by_reason == {"duplicate": ["r2"]}
    assert [r.question for r in rows] == ["2+2?", "2+2?", "3+3=", "3+3=", "5+5?"]
    assert [r.answer for r in rows] == ["4", "4", "6", "7", ""]
    assert rows[0].prompt == prompts[0] and rows[3].prompt == "3+3="
    # the question/answer path rejects the same unreadable answer
    rows, rejected = clean_rows(["5+5?"], ["worked #### "], ["q0"], extract_hash_answer)
    assert not rows and rejected.ids_by_reason == {"unparseable_answer": ["q0"]}


@pytest.mark.parametrize("value, expected", [
    ("2+2=", ("2+2=", None)),
    ("   ", (None, "empty_question")),
    (None, (None, "missing_question")),
    ([], (None, "invalid_prompt")),
    (["2+2?"], (None, "invalid_prompt")),
    ([{"role": "user", "content": 4}], (None, "invalid_prompt")),
    ([{"role": 1, "content": "2+2?"}], (None, "invalid_prompt")),
    ({"role": "user", "content": "2+2?"}, (None, "invalid_prompt")),
    ([{"role": "system", "content": "S"}, {"role": "user", "content": " "}], (None, "empty_question")),
    # a JSON file whose rows differ in keys: `datasets` fills the missing ones with None, which are dropped
    ([{"role": "user", "content": "2+2?", "name": None}], ([{"role": "user", "content": "2+2?"}], None)),
    (({"role": "user", "content": "2+2?", "name": "me"},), ([{"role": "user", "content": "2+2?", "name": "me"}], None)),
])
def test_check_prompt_takes_text_or_messages_and_names_everything_else(value, expected):
    from grpo_pipeline.pipeline.data.clean import check_prompt

    assert check_prompt(value) == expected


# --- what scores against a row's reference answer needs rows that have one ----------------------------------
#
# TRL's prompt column needs no answer column (the user's rewards read their own columns). Two things of ours
# score a completion against its row's reference answer (grpo_answer): the correctness reward, and the held-out
# eval's accuracy. With no reference in any row each would score None (cannot judge) or "wrong" for every
# completion, silently; so the data step refuses, naming the answer option, the columns there are and the fix.

# Every name resolve_reward takes for the built-in correctness reward.
CORRECTNESS_SPELLINGS = ["correctness", "correctness_reward_func", " correctness ",
                         "grpo_pipeline.rewards.correctness:correctness_reward_func",
                         "grpo_pipeline.rewards.correctness.correctness_reward_func",
                         "grpo_pipeline.rewards:correctness_reward_func"]


@pytest.mark.parametrize("names, reads", [
    *[([name], True) for name in CORRECTNESS_SPELLINGS],
    (["strict_format", "xmlcount", "int", "soft_format", "language_consistency"], False),
    (["trl.rewards.accuracy_reward", "no_such_module:score"], False),  # theirs, and a name validate() refuses
    (["int", "correctness"], True),
])
def test_reads_reference_knows_the_correctness_reward_by_every_name_it_has(names, reads):
    from grpo_pipeline.rewards import correctness_reward_func, reads_reference

    assert reads_reference(names) is reads
    assert reads_reference([correctness_reward_func]) and not reads_reference([lambda completions, **kw: []])


def _solution_only(tmp_path, name="p.jsonl"):
    return write_jsonl(tmp_path / name, [{"prompt": f"{i} + 1 =", "solution": str(i + 1)} for i in range(4)])


@pytest.mark.parametrize("reward", CORRECTNESS_SPELLINGS)
def test_the_correctness_reward_on_rows_without_a_reference_is_refused_naming_answer_field(qwen_tokenizer,
                                                                                             tmp_path, reward):
    from grpo_pipeline.pipeline.data.run_data import prepare_train

    path = _solution_only(tmp_path)
    with pytest.raises(ConfigError) as err:
        prepare_train(make_cfg(tmp_path, dataset_name=str(path), reward_funcs=["strict_format", reward],
                               reward_weights=None), qwen_tokenizer, write_report=False)
    assert err.value.field == "answer_field"
    message = str(err.value)
    assert "no column 'answer'" in message and "columns besides prompt: solution" in message
    assert "(here: answer_field: solution)" in message and "leave correctness out of reward_funcs" in message

    # the fix it names works: the reference is the solution column, and the same file trains without it too
    named = prepare_train(make_cfg(tmp_path, dataset_name=str(path), answer_field="solution",
                                   reward_funcs=["strict_format", reward], reward_weights=None), qwen_tokenizer)
    assert named.dataset["grpo_answer"] == ["1", "2", "3", "4"]
    theirs = prepare_train(make_cfg(tmp_path, dataset_name=str(path),
                                    reward_funcs=["trl.rewards.accuracy_reward"], reward_weights=None),
                           qwen_tokenizer)
    assert theirs.dataset["grpo_answer"] == [None] * 4


def test_kept_unscorable_answers_only_are_refused_for_the_correctness_reward(qwen_tokenizer, tmp_path):
    """keep_unscorable keeps rows whose answer no reader can judge; when that is every row, correctness can judge
    none of them: the same refusal, saying why."""
    from grpo_pipeline.pipeline.data.run_data import prepare_train

    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": f"Name {i}?", "answer": "forty two"} for i in range(4)])
    cfg = make_cfg(tmp_path, dataset_name=str(path), keep_unscorable=True)
    with pytest.raises(ConfigError, match="none of its 'answer' values is one final answer") as err:
        prepare_train(cfg, qwen_tokenizer, write_report=False)
    assert err.value.field == "answer_field"


@pytest.mark.parametrize("own_answer_field", [None, "expected"])
def test_an_eval_set_without_reference_answers_is_refused_naming_its_answer_option(qwen_tokenizer, tmp_path,
                                                                                    own_answer_field):
    """The eval's accuracy compares with each row's reference: an eval file with none would read 0% whatever the
    model does. The option named is the one that fixes the eval set (eval_answer_field: it has its own file)."""
    from grpo_pipeline.pipeline.data.run_data import load_eval_rows

    train, held_out = _solution_only(tmp_path), _solution_only(tmp_path, "test.jsonl")
    cfg = make_cfg(tmp_path, dataset_name=str(train), answer_field="solution", eval_dataset_name=str(held_out),
                   eval_before=True)
    if own_answer_field:  # a column the file lacks is refused by name before any row is read
        with pytest.raises(ConfigError, match="'expected' is not in"):
            load_eval_rows(cfg.replace(eval_answer_field=own_answer_field), qwen_tokenizer)
    rows = load_eval_rows(cfg, qwen_tokenizer)  # the training answer_field, borrowed: the eval file has it
    assert [row["answer"] for row in rows] == ["1", "2", "3", "4"]
    with pytest.raises(ConfigError) as err:
        load_eval_rows(cfg.replace(answer_field="answer"), qwen_tokenizer)
    assert err.value.field == "eval_answer_field"
    assert "(here: eval_answer_field: solution)" in str(err.value) and "turn evaluation off" in str(err.value)


def test_grpo_train_check_refuses_trl_rows_without_a_reference_for_the_default_rewards(tmp_path, capsys):
    """The default rewards include correctness: a TRL-format file with only a `solution` column is refused by
    --check (exit 2, the data check naming answer_field), before anything loads."""
    from grpo_pipeline.pipeline.train import main

    path = _solution_only(tmp_path)
    code = main(["--config", "configs/cpu-demo.yaml", "--model_name_or_path", "tiny-qwen2.5", "--dataset_name",
                 str(path), "--sft_warmup_steps", "0", "--output_dir", str(tmp_path / "run"), "--check"])
    report = json.loads(capsys.readouterr().out)
    data = next(c for c in report["checks"] if c["name"] == "data")
    assert code == 2 and not data["ok"] and "`answer_field`" in data["message"], data


def _verl_rows(n=4):
    """verl's GSM8K parquet rows as its preprocessing script writes them."""
    return [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"What is {i} + 5? Let's think "
                                                        "step by step and output the final answer after \"####\"."}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i + 5)},
             "extra_info": {"split": "train", "index": i}} for i in range(n)]


@pytest.mark.parametrize("option", ["answer_field", "eval_answer_field"])
def test_a_dotted_answer_field_reads_a_nested_column_as_verl_writes_it(qwen_tokenizer, tmp_path, option):
    from grpo_pipeline.pipeline.data.run_data import load_eval_rows

    path = write_jsonl(tmp_path / "verl.jsonl", _verl_rows())
    cfg = make_cfg(tmp_path, dataset_name=str(path), eval_dataset_name=str(path),
                   **{option: "reward_model.ground_truth"})
    if option == "answer_field":
        data = prepare_dataset(cfg, qwen_tokenizer)
        assert data.dataset["grpo_answer"] == ["5", "6", "7", "8"]
        assert data.dataset["reward_model"][0] == {"style": "rule", "ground_truth": "5"}  # the column itself kept
    else:
        assert [row["answer"] for row in load_eval_rows(cfg, qwen_tokenizer)] == ["5", "6", "7", "8"]
    with pytest.raises(ConfigError, match=option) as err:
        prepare_dataset(cfg.replace(**{option: "reward_model.answer"}), qwen_tokenizer,
                        role="train" if option == "answer_field" else "eval")
    assert "reward_model.ground_truth" in str(err.value)  # the nested fields there are, as dotted paths


def test_an_eval_set_without_answers_suggests_the_field_that_holds_them_never_a_first_column(qwen_tokenizer,
                                                                                             tmp_path):
    from grpo_pipeline.pipeline.data.run_data import load_eval_rows

    path = write_jsonl(tmp_path / "verl.jsonl", _verl_rows())
    with pytest.raises(ConfigError) as err:
        load_eval_rows(make_cfg(tmp_path, dataset_name=str(path), eval_dataset_name=str(path)),
                       qwen_tokenizer)
    assert "eval_answer_field: reward_model.ground_truth" in str(err.value)
    assert "data_source" not in str(err.value).split("(here:")[1]
