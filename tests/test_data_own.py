"""Your own data: a separate eval set, scorable answers, the console's accounting, the warm-up's needs, and
`grpo train --check` as the run's contract (it fails exactly when the run would, naming the same option).

Real Qwen2.5 tokenizer, offline; the run is stopped at the model boundary (nothing past the data loads)."""

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.data.clean import clean_rows
from grpo_pipeline.pipeline.data.prepare import DataError, prepare_dataset
from grpo_pipeline.pipeline.data.run_data import load_eval_rows
from grpo_pipeline.pipeline.preflight import run_checks
from grpo_pipeline.rewards import correctness_reward_func, extract_hash_answer, reference_is_scorable
from tests.data_helpers import make_cfg, write_jsonl
from train_helpers import REWARDS_IN_PROCESS


@pytest.fixture(autouse=True)
def session_tokenizer(qwen_tokenizer, monkeypatch):
    """The check and the run load the tokenizer by name; give them the session's (loading takes seconds).
    The backend module is imported first, so its own `from ... import load_tokenizer` keeps the real one."""
    import grpo_pipeline.pipeline.backends.plain  # noqa: F401
    monkeypatch.setattr("grpo_pipeline.pipeline.data.tokenizer.load_tokenizer", lambda name, trust_remote_code=False, source="hf": qwen_tokenizer)


def rows(n, answer=lambda i: str(i + 2), **extra):
    return [{"question": f"Tom has {i} apples and gets 2 more. How many now?", "answer": answer(i), **extra}
            for i in range(n)]


# ---------------------------------------------------------------------------------------------
# Scorable answers: the reward's own reader decides, at data preparation
# ---------------------------------------------------------------------------------------------

def number_forms(n: int, d: int):
    return [str(n), f"{n:,}", f"${n:,}", f"{n}/{d}", f"答案：{n}", f"答案是{n}元", f"{n} apples",
            f"The answer is {n}.", f"He ends up with {n} apples.", f"\\boxed{{{n}}}", f"{n}.50", f"-{n}",
            f"{n}%", f"Step one.\nSo {n} + {d} = {n + d}.\n#### {n + d:,}"]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 10**7), d=st.integers(1, 97), pick=st.integers(0, 13))
def test_every_number_form_the_reward_reads_is_kept(n, d, pick):
    answer = number_forms(n, d)[pick]
    kept, rejected = clean_rows(["Q?"], [answer], ["r"], extract_hash_answer, is_scorable=reference_is_scorable)
    assert [r.id for r in kept] == ["r"], (answer, rejected.ids_by_reason)
    # Kept means scorable: the reward judges it, and its own value scores full marks.
    reference = kept[0].answer
    assert correctness_reward_func(completions=[f"<answer>{reference}</answer>"], answer=[reference]) == [2.0]


NO_NUMBER = st.text(alphabet=st.sampled_from(list("abcdefghij klmnopqrstuvwxyz.,!?'一二三四五六七八九十个苹果")),
                    min_size=1, max_size=40).filter(lambda t: t.strip())
HEDGES = ["five and a half", "He ends up with 3 apples in total, I think", "18 or 20", "maybe 18", "between 3 and 5",
          "It could be 7.", "I believe it is 12", "n/a", "十八"]


@settings(max_examples=80, deadline=None)
@given(answer=st.one_of(NO_NUMBER, st.sampled_from(HEDGES)))
def test_text_with_no_one_final_number_is_rejected_and_the_reward_leaves_it_unjudged(answer):
    kept, rejected = clean_rows(["Q?"], [answer], ["r"], extract_hash_answer, is_scorable=reference_is_scorable)
    assert not kept and rejected.ids_by_reason == {"unscorable_answer": ["r"]}, answer
    assert correctness_reward_func(completions=["<answer>3</answer>"], answer=[answer]) == [None]
    kept, rejected = clean_rows(["Q?"], [answer], ["r"], extract_hash_answer, is_scorable=reference_is_scorable,
                                keep_unscorable=True)
    assert [r.scorable for r in kept] == [False] and rejected.unscorable_kept == ["r"]


def test_unscorable_rows_are_listed_and_a_mostly_unscorable_file_is_refused_naming_the_answer_option(
        qwen_tokenizer, tmp_path):
    data = rows(6) + [{"question": "Half of eleven?", "answer": "five and a half"}]
    path = write_jsonl(tmp_path / "some.jsonl", data)
    prepared = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)
    assert prepared.report["rows_rejected"]["unscorable_answer"] == {"count": 1, "ids": ["train-6"]}
    assert prepared.report["rows_kept"] == 6

    mostly = write_jsonl(tmp_path / "words.jsonl", rows(3) + rows(4, answer=lambda i: f"about {i} or so, maybe"))
    with pytest.raises(ConfigError, match="4 of 7 answers") as err:
        prepare_dataset(make_cfg(tmp_path, dataset_name=str(mostly)), qwen_tokenizer)
    assert err.value.field == "answer_field" and "keep_unscorable" in str(err.value)
    on_disk = json.loads((tmp_path / "run" / "data_report.json").read_text(encoding="utf-8"))
    assert on_disk["status"] == "error" and on_disk["rows_rejected"]["unscorable_answer"]["count"] == 4
    kept = prepare_dataset(make_cfg(tmp_path, dataset_name=str(mostly), keep_unscorable=True), qwen_tokenizer)
    assert kept.report["rows_kept"] == 7 and kept.report["unscorable_kept"]["count"] == 4


# ---------------------------------------------------------------------------------------------
# A separate eval set
# ---------------------------------------------------------------------------------------------

def test_eval_dataset_name_with_its_own_fields_is_used_whole(qwen_tokenizer, tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", rows(5))
    held = tmp_path / "held.csv"
    held.write_text("problem,final\nWhat is 2 + 2?,4\nWhat is 3 + 3?,答案：6\n", encoding="utf-8")
    cfg = make_cfg(tmp_path, dataset_name=str(train), eval_dataset_name=str(held), eval_question_field="problem",
                   eval_answer_field="final", eval_before=True)  # eval_split stays `test`: a single file is used whole
    eval_rows = load_eval_rows(cfg, qwen_tokenizer)
    assert [r["answer"] for r in eval_rows] == ["4", "答案：6"]
    assert eval_rows[0]["prompt"][-1]["content"] == "What is 2 + 2?"
    assert json.loads((tmp_path / "run" / "data_report_eval.json").read_text(encoding="utf-8"))["rows_in"] == 2
    assert prepare_dataset(cfg, qwen_tokenizer).report["rows_kept"] == 5  # training reads its own fields


# ---------------------------------------------------------------------------------------------
# The format warm-up's examples come from the data's worked solutions
# ---------------------------------------------------------------------------------------------

def test_warmup_examples_from_gsm8k_text_or_a_solution_column_else_refused(qwen_tokenizer, tmp_path):
    from grpo_pipeline.pipeline.data.run_data import warmup_examples

    gsm = write_jsonl(tmp_path / "gsm.jsonl", rows(3, answer=lambda i: f"{i} + 2 = <<{i}+2={i + 2}>>{i + 2}\n#### {i + 2}"))
    cfg = make_cfg(tmp_path, dataset_name=str(gsm), sft_warmup_steps=5)
    examples = warmup_examples(cfg, prepare_dataset(cfg, qwen_tokenizer))
    assert examples[1]["completion"][0]["content"] == "<reasoning>\n1 + 2 = 3\n</reasoning>\n<answer>\n3\n</answer>\n"

    own = write_jsonl(tmp_path / "own.jsonl", rows(3, work="Add two."))
    cfg = make_cfg(tmp_path, dataset_name=str(own), sft_warmup_steps=5, solution_field="work")
    assert "Add two." in warmup_examples(cfg,
                                         prepare_dataset(cfg, qwen_tokenizer))[0]["completion"][0]["content"]

    plain = write_jsonl(tmp_path / "plain.jsonl", rows(3))
    cfg = make_cfg(tmp_path, dataset_name=str(plain), sft_warmup_steps=5)
    with pytest.raises(ConfigError, match="solution_field") as err:
        warmup_examples(cfg, prepare_dataset(cfg, qwen_tokenizer))
    assert err.value.field == "sft_warmup_steps"


# ---------------------------------------------------------------------------------------------
# `grpo train --check` is the run's contract
# ---------------------------------------------------------------------------------------------

class ModelWouldLoad(Exception):
    """The run got past every data, eval and warm-up step: the model boundary is where it stops here."""


def bad_configs(tmp):
    """name -> (config overrides, the option the failure must name, or the error class when none applies)."""
    plain = write_jsonl(tmp / "plain.jsonl", rows(6))
    gsm = write_jsonl(tmp / "gsm.jsonl", rows(6, answer=lambda i: f"{i} + 2 = {i + 2}\n#### {i + 2}"))
    words = write_jsonl(tmp / "words.jsonl", rows(6, answer=lambda i: "a few"))
    broken = tmp / "broken.jsonl"
    broken.write_text('{"question": "Q?", "answer": "1"}\n{"question": \n', encoding="utf-8")
    folder = tmp / "folder"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", rows(6))
    write_jsonl(folder / "validation.jsonl", rows(2))
    dup = write_jsonl(tmp / "dup.jsonl", rows(3) + rows(1))
    return {
        "ok: a single file, no eval": ({"dataset_name": str(plain)}, None),
        "ok: folder + eval_split": ({"dataset_name": str(folder), "eval_after": True, "eval_split": "validation"}, None),
        "ok: own eval file + GSM8K warm-up": ({"dataset_name": str(gsm), "eval_before": True,
                                              "eval_dataset_name": str(plain), "sft_warmup_steps": 2}, None),
        "missing file": ({"dataset_name": str(tmp / "nope.jsonl")}, "dataset_name"),
        "missing folder": ({"dataset_name": "./no-such-folder"}, "dataset_name"),
        "wrong question column": ({"dataset_name": str(plain), "question_field": "problem"}, "question_field"),
        "wrong solution column": ({"dataset_name": str(plain), "solution_field": "work"}, "solution_field"),
        # one training file and no eval set trains, without eval (the run says how to add one)
        "single file has no test split": ({"dataset_name": str(plain), "eval_before": True}, None),
        "folder lacks eval_split": ({"dataset_name": str(folder), "eval_after": True}, "eval_split"),
        "train split missing": ({"dataset_name": str(plain), "dataset_split": "test"}, "dataset_split"),
        "eval file missing": ({"dataset_name": str(plain), "eval_before": True,
                               "eval_dataset_name": str(tmp / "held.jsonl")}, "eval_dataset_name"),
        "eval answer column": ({"dataset_name": str(plain), "eval_after": True, "eval_dataset_name": str(gsm),
                                "eval_answer_field": "final"}, "eval_answer_field"),
        "eval answers unscorable": ({"dataset_name": str(plain), "eval_after": True,
                                     "eval_dataset_name": str(words)}, "eval_answer_field"),
        "answers unscorable": ({"dataset_name": str(words)}, "answer_field"),
        "warm-up without solutions": ({"dataset_name": str(plain), "sft_warmup_steps": 3}, "sft_warmup_steps"),
        "prompt limit below the system prompt": ({"dataset_name": str(plain), "max_prompt_length": "8"},
                                                 "max_prompt_length"),
        "strict with a duplicate": ({"dataset_name": str(dup), "strict": True}, DataError),
        "broken JSONL": ({"dataset_name": str(broken)}, ValueError),
    }




def _field(message: str):
    match = re.match(r"config error in `([^`]+)`", message)
    return match.group(1) if match else None


def test_check_fails_exactly_when_the_run_would_naming_the_same_option(tmp_path, monkeypatch, capsys):
    from grpo_pipeline.pipeline.backends import choose_backend
    from grpo_pipeline.pipeline.train import run_training

    def stop_at_the_model(cfg, tokenizer=None):
        raise ModelWouldLoad

    monkeypatch.setattr("grpo_pipeline.pipeline.backends.plain.load_for_training", stop_at_the_model)
    data = tmp_path / "data"
    data.mkdir()
    table = bad_configs(data)
    for i, (name, (overrides, expected)) in enumerate(table.items()):
        # The rewards in this process, as train_helpers' configs run them (REWARDS_IN_PROCESS says why): a reward's
        # own process has no part in what the data options decide.
        cfg = make_cfg(tmp_path, model_name_or_path="tiny-qwen2.5", backend="plain", reward_timeout=REWARDS_IN_PROCESS,
                       output_dir=str(tmp_path / f"run{i}"), **overrides)
        checks = run_checks(cfg, stop_at_first=False)
        failed = [c for c in checks if not c.ok]
        with pytest.raises(Exception) as run_error:
            run_training(cfg, choose_backend("plain", False))
        if expected is None:
            assert not failed, (name, failed)
            assert run_error.type is ModelWouldLoad, (name, run_error.value)
            assert re.search(r"\[grpo\] data: \d+ rows in, \d+ kept, \d+ dropped", capsys.readouterr().out), name
            continue
        assert failed, name
        assert run_error.type is not ModelWouldLoad, name
        assert str(run_error.value).split("\n")[0] == failed[0].message.split("\n")[0], name
        if isinstance(expected, str):
            assert _field(failed[0].message) == expected, (name, failed[0].message)
            assert isinstance(run_error.value, ConfigError) and run_error.value.field == expected, name
        else:
            assert isinstance(run_error.value, expected), (name, run_error.value)
        assert not (tmp_path / f"run{i}" / "lora").exists()


# ---------------------------------------------------------------------------------------------
# The console says what was dropped; a hub dataset without the `main` config names dataset_config
# ---------------------------------------------------------------------------------------------

def test_grpo_data_prints_rows_in_kept_and_dropped_by_reason(tmp_path, capsys):
    from grpo_pipeline.pipeline.data_command import main

    data = rows(4) + rows(1) + [{"question": "Half of eleven?", "answer": "five and a half"},
                                {"question": "长" * 400 + "？", "answer": "3"}]
    path = write_jsonl(tmp_path / "mine.jsonl", data)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({"dataset_name": str(path), "model_name_or_path": "bundled:qwen2.5",
                                  "output_dir": str(tmp_path / "run"), "data_cache_dir": str(tmp_path / "cache")}),
                      encoding="utf-8")  # JSON is YAML
    assert main(["--config", str(recipe), "--max_prompt_length", "160"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[grpo] data:"))
    assert line.startswith("[grpo] data: 7 rows in, 4 kept, 3 dropped: ")
    for part in ("unscorable_answer 1 (train-5)", "duplicate 1 (train-4)", "prompt_too_long 1 (train-6)"):
        assert part in line, line


def test_a_hub_dataset_without_the_config_names_dataset_config(qwen_tokenizer, tmp_path, monkeypatch):
    import datasets

    def hub(name, config=None, **kwargs):  # the network boundary: what the hub answers for a missing config
        raise ValueError(f"BuilderConfig '{config}' not found. Available: ['default']")

    monkeypatch.setattr(datasets, "load_dataset", hub)
    with pytest.raises(ConfigError, match="has no config 'main'") as err:
        prepare_dataset(make_cfg(tmp_path, dataset_name="someone/math-set"), qwen_tokenizer)
    assert err.value.field == "dataset_config"
    with pytest.raises(ConfigError) as err:
        prepare_dataset(make_cfg(tmp_path, eval_dataset_name="someone/math-set", eval_dataset_config="x"),
                        qwen_tokenizer, role="eval")
    assert err.value.field == "eval_dataset_config"


def test_eval_problems_that_are_also_training_questions_are_named(qwen_tokenizer, tmp_path, capsys):
    from grpo_pipeline.pipeline.data.run_data import prepare_run_data

    train = write_jsonl(tmp_path / "train.jsonl", rows(6))
    held = write_jsonl(tmp_path / "held.jsonl", rows(8)[4:])  # rows 4, 5 are in train; 6, 7 are new
    cfg = make_cfg(tmp_path, dataset_name=str(train), eval_dataset_name=str(held), eval_after=True)
    data = prepare_run_data(cfg, qwen_tokenizer)
    assert data.eval_overlap() == ["train-0", "train-1"]  # the held-out file's own row ids
    assert "2 of 4 eval problems are also training questions" in capsys.readouterr().err
    eval_check = next(c for c in run_checks(cfg, stop_at_first=False) if c.name == "eval")
    assert eval_check.ok and "2 of 4 eval problems" in eval_check.message


def test_the_eval_set_line_says_how_many_rows_were_dropped_and_why(qwen_tokenizer, tmp_path):
    from grpo_pipeline.pipeline.data.run_data import prepare_run_data

    train = write_jsonl(tmp_path / "train.jsonl", rows(6))
    held = write_jsonl(tmp_path / "held.jsonl", [{"question": "2 + 2?", "answer": "4"},
                                                 {"question": "Name a colour.", "answer": "blue"},
                                                 {"question": "3 + 3?", "answer": "6"}])
    cfg = make_cfg(tmp_path, dataset_name=str(train), eval_dataset_name=str(held), eval_after=True)
    line = prepare_run_data(cfg, qwen_tokenizer).eval_rows.line()
    assert line.startswith("eval set: 2 problems (1 of 3 rows dropped: unscorable_answer 1 (")
    assert next(c for c in run_checks(cfg, stop_at_first=False) if c.name == "eval").message == line


@pytest.mark.parametrize("eval_options", [[], ["--eval_after", "true", "--eval_steps", "5"]])
def test_one_training_file_and_no_eval_set_checks_and_trains_without_eval_saying_how_to_add_one(
        tmp_path, capsys, eval_options):
    """The first thing an own-data user meets: the recipes evaluate (cpu-demo.yaml: eval_before, eval_after,
    eval_steps), one file has no held-out split."""
    from grpo_pipeline.pipeline.train import main

    data = tmp_path / "mine.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(8)))
    code = main(["--config", "configs/cpu-demo.yaml", "--dataset_name", str(data), "--output_dir",
                 str(tmp_path / "run"), "--sft_warmup_steps", "0", "--check", *eval_options])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 0 and report["ok"], report
    assert "eval: off" in captured.err and "--eval_dataset_name" in captured.err, captured.err
    evaluation = next(c for c in report["checks"] if c["name"] == "eval")["message"]
    assert evaluation.startswith("no evaluation")
