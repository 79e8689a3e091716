"""What a run reads, prepared before any model loads: the training split, the held-out rows, the format warm-up's
examples (`prepare_run_data`; `grpo train --check` runs its steps one by one).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig, given
from grpo_pipeline.pipeline.data import prepare  # prepare.prepare_dataset through the module: tests interrupt it there
from grpo_pipeline.pipeline.data.columns import ANSWER, OWN_COLUMNS, ROW_ID, SOLUTION, removes_unused_columns
from grpo_pipeline.pipeline.data.prompts import completion_like, question_text
from grpo_pipeline.pipeline.data.report import dropped_reasons
from grpo_pipeline.pipeline.data.data_files import local_layout, local_path
from grpo_pipeline.pipeline.data.sources import field_values, nested_paths
from grpo_pipeline.pipeline.data.source_spec import SAMPLE_NAME, SAMPLE_PATH, SINGLE_FILE_SPLIT, source_spec
from grpo_pipeline.pipeline.demo.registry import builtin_source
from grpo_pipeline.rewards import reads_reference, reference_is_scorable
from grpo_pipeline.rewards.normalize import parse_answer
from grpo_pipeline.rewards.format import format_completion

MAX_WARMUP_EXAMPLES = 256
# The other way out of an eval set without answers, for a training run (`grpo eval` says its own, of its --data).
TRAINING_EVAL_OFF = "or turn evaluation off (eval_before: false, eval_after: false, eval_steps: 0)"


@dataclass
class RunData:
    """What the run reads: the prepared training data and the held-out rows ([] when evaluation is off)."""

    train: Any  # grpo_pipeline.pipeline.data.prepare.PreparedData
    eval_rows: list[dict[str, Any]]

    def eval_overlap(self) -> list[str]:
        """Ids of eval rows whose question is also a training question: their numbers measure memory."""
        trained = {question_text(prompt) for prompt in self.train.dataset["prompt"]} if self.eval_rows else set()
        return [row["id"] for row in self.eval_rows if question_text(row["prompt"]) in trained]

    def overlap_warning(self) -> str:
        ids = self.eval_overlap()
        return "" if not ids else (
            f"warning: {len(ids)} of {len(self.eval_rows)} eval problems are also training questions "
            f"({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}); their before/after numbers measure "
            "memory, not reasoning. Remove them from one of the two sources.")


# The three data steps, in the order the run needs them: prepare_train, prepare_eval, check_warmup.
def prepare_train(cfg: PipelineConfig, tokenizer: Any, report_dir: Any = None, write_report: bool = True) -> Any:
    train = prepare.prepare_dataset(cfg, tokenizer, report_dir=report_dir, write_report=write_report)
    train.report["remove_unused_columns"] = removes_unused_columns(cfg.trl)  # which columns the rewards get
    reads = reads_reference(list(cfg.grpo.reward_funcs))  # from the modules' text: `grpo data` imports no reward
    if reads is None:
        print("[grpo] note: whether a reward of your own reads the reference answers cannot be told without running "
              "its module, which `grpo data` does not do; the answers were not required.", file=sys.stderr)
    if reads:
        require_reference_answers(source_spec(cfg, "train"), train.dataset, "the correctness reward (reward_funcs)",
                                  "or leave correctness out of reward_funcs (a reward of your own gets every column, "
                                  "as TRL passes them)")
    return train


def require_reference_answers(spec: Any, dataset: Any, scorer: str, other_fix: str) -> None:
    """Refuse, naming `spec`'s answer option and the columns there are, a dataset where no row has a reference
    answer that `scorer` (the correctness reward, the eval's accuracy) can read."""
    if len(dataset) == 0 or any(reference_is_scorable(answer) for answer in dataset[ANSWER]):
        return
    columns = [name for name in dataset.column_names if name not in OWN_COLUMNS and name != "prompt"]
    if spec.answer_field in dataset.column_names or spec.answer_field.partition(".")[0] in dataset.column_names:
        why = (f"none of its {spec.answer_field!r} values is one final answer the correctness reward can read "
               "(keep_unscorable kept them)")
    else:
        why = (f"it has no column {spec.answer_field!r} (its columns besides prompt: "
               f"{', '.join(columns) if columns else 'none'})")
    # a column (or a nested field, as a dotted path) whose first values are answers, never a mere first column
    rows = dataset.select(range(min(len(dataset), 20)))
    candidates = [*columns, *nested_paths(rows, columns)]
    def readable(field: str) -> tuple[float, float]:  # the share of plain numbers first ("openai/gsm8k" is not)
        values = field_values(rows, columns, field, spec.answer_option, "answer", spec.name)
        parsed = [parse_answer(v) if reference_is_scorable(v) else None for v in values]
        return (sum(p is not None and p.kind == "number" for p in parsed) / len(values),
                sum(p is not None for p in parsed) / len(values))

    ranked = sorted(((readable(c), c) for c in candidates if c != spec.answer_field), key=lambda x: x[0], reverse=True)
    example = f" (here: {spec.answer_option}: {ranked[0][1]})" if ranked and ranked[0][0][1] > 0 else ""
    raise ConfigError(spec.answer_option, f"{scorer} scores each completion against its row's reference answer, "
                      f"read from {spec.answer_option} ({spec.answer_field!r}), and no row of {spec.name} has one: "
                      f"{why}. Every score would be None (cannot judge) and teach or measure nothing. Set "
                      f"{spec.answer_option} to the column (or dotted path) that holds the final answers{example}, "
                      f"{other_fix}.")


# The options that turn evaluation off, when there is nothing held out to evaluate on.
EVAL_OFF = {"eval_before": False, "eval_after": False, "eval_steps": 0}


def without_a_held_out_set(cfg: PipelineConfig) -> tuple[dict[str, Any], str]:
    """(EVAL_OFF, the note saying how to evaluate) for a one-split local source and no eval_dataset_name: no
    held-out problems, so the run trains without evaluation, as TRL, Unsloth and open-r1 do; ({}, "") otherwise.

    >>> off, note = without_a_held_out_set(PipelineConfig().replace(dataset_name="sample", eval_before=True))
    >>> off == EVAL_OFF, note.startswith("eval: off")
    (True, True)
    """
    if not cfg.eval.uses_eval_set() or cfg.eval.eval_dataset_name:
        return {}, ""
    name = str(cfg.data.dataset_name).strip()
    path = SAMPLE_PATH if name == SAMPLE_NAME else local_path(name)
    if path is None:
        return {}, ""  # a hub dataset (its splits are known once loaded) or a built-in one with its own test split
    try:
        splits = [SINGLE_FILE_SPLIT] if name == SAMPLE_NAME else sorted(local_layout(path, "dataset_name")[1])
    except (ConfigError, OSError, RuntimeError):  # RuntimeError: pathlib's symlink loop
        return {}, ""  # the data check names what is wrong with the path
    if len(splits) != 1 or cfg.eval.eval_split in splits:
        return {}, ""
    note = (f"eval: off. {name} has one split ({splits[0]}: the training data) and no eval_dataset_name is set, so "
            "there are no held-out problems to score. To evaluate, set --eval_dataset_name test.jsonl (or make "
            "dataset_name a folder holding train.jsonl and test.jsonl).")
    return dict(EVAL_OFF), note


def eval_config(cfg: PipelineConfig, limit: Optional[int] = None) -> PipelineConfig:
    """The config the eval set is prepared with: its first `limit` (else eval_limit) usable rows, never strict (a
    dropped eval row is reported, not refused).

    >>> cfg = PipelineConfig().replace(eval_limit=5, max_samples=40, strict=True)
    >>> (eval_config(cfg).data.max_samples, eval_config(cfg).data.strict, eval_config(cfg, 2).data.max_samples,
    ...  cfg.data.max_samples)
    (5, False, 2, 40)
    """
    changes = {"max_samples": given(limit, cfg.eval.eval_limit), "strict": False}
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **changes))


def load_eval_rows(cfg: PipelineConfig, tokenizer, limit: Optional[int] = None, report_dir: Optional[Path] = None,
                   write_report: bool = True, other_fix: str = TRAINING_EVAL_OFF) -> list[dict[str, Any]]:
    """The eval set's rows (prompt, answer, id, columns), prepared as the training data is (eval_config)."""
    eval_cfg = eval_config(cfg, limit)
    prepared = prepare.prepare_dataset(eval_cfg, tokenizer, role="eval", report_dir=report_dir,
                                       write_report=write_report)
    require_reference_answers(source_spec(eval_cfg, "eval"), prepared.dataset,
                              "the held-out evaluation (its accuracy)", other_fix)
    # each row's other columns too: the run's rewards score the eval completions as TRL calls them (infer/scoring.py)
    return EvalRows([{"prompt": row["prompt"], "answer": row[ANSWER], "id": row[ROW_ID],
                      "columns": {key: value for key, value in row.items() if key != "prompt"}}
                     for row in prepared.dataset], prepared.report)


class EvalRows(list):
    """The held-out rows, and the data report of the set they were prepared from (what was dropped, and why)."""

    def __init__(self, rows: list[dict[str, Any]], report: Optional[dict[str, Any]] = None):
        super().__init__(rows)
        self.report = report or {}

    def line(self) -> str:
        """`eval set: N problems`, with the rows dropped or left unused and why.

        >>> EvalRows([{}, {}], {"rows_in": 3, "rows_kept": 2, "rows_rejected_total": 1, "rows_unused_max_samples": 0,
        ...                     "rows_rejected": {"unscorable_answer": {"count": 1, "ids": ["test-2"]}}}).line()
        'eval set: 2 problems (1 of 3 rows dropped: unscorable_answer 1 (test-2))'
        """
        said = f"eval set: {len(self)} problems"
        dropped, unused = self.report.get("rows_rejected_total"), self.report.get("rows_unused_max_samples")
        if dropped:
            said += f" ({dropped} of {self.report['rows_in']} rows dropped: {dropped_reasons(self.report)})"
        if unused:
            said += f"; {unused} more rows unused (eval_limit / --limit)"
        return said


def prepare_eval(cfg: PipelineConfig, tokenizer: Any, report_dir: Any = None,
                 write_report: bool = True) -> list[dict[str, Any]]:
    """The held-out rows when the run evaluates (eval_before, eval_after or eval_steps), else []."""
    if not cfg.eval.uses_eval_set():
        return EvalRows([])
    return load_eval_rows(cfg, tokenizer, report_dir=report_dir, write_report=write_report)


def warmup_examples(cfg: PipelineConfig, prepared) -> list[dict[str, Any]]:
    """TRL prompt-completion pairs: a built-in source's own, else up to MAX_WARMUP_EXAMPLES training rows with a
    worked solution; ConfigError (sft_warmup_steps) when there are none."""
    builtin = builtin_source(cfg.data.dataset_name)
    if builtin is not None:
        return builtin.warmup_examples(MAX_WARMUP_EXAMPLES, cfg.data.system_prompt, cfg.grpo.seed)
    dataset = prepared.dataset
    solved = [i for i, text in enumerate(dataset[SOLUTION]) if text][:MAX_WARMUP_EXAMPLES]
    if not solved:
        raise ConfigError(
            "sft_warmup_steps",
            f"sft_warmup_steps is {cfg.health.sft_warmup_steps}, but none of the {len(dataset)} training rows has "
            "a worked solution to teach the <reasoning>/<answer> format from. Name the column of worked solutions "
            "with solution_field (e.g. --solution_field solution), use GSM8K-style answers (`worked text #### 18`, "
            "the text before `####` is the solution), or set sft_warmup_steps: 0 (a pretrained instruct model "
            "usually follows the system prompt's format without it).")
    return [{"prompt": r["prompt"],
             "completion": completion_like(r["prompt"], format_completion(r[SOLUTION], r[ANSWER]))}
            for r in dataset.select(solved)]


def check_warmup(cfg: PipelineConfig, train: Any) -> str:
    """The format warm-up's examples exist (ConfigError naming sft_warmup_steps otherwise)."""
    if cfg.health.sft_warmup_steps <= 0:
        return "no format warm-up (sft_warmup_steps: 0)"
    return f"format warm-up: {len(warmup_examples(cfg, train))} examples"


def prepare_run_data(cfg: PipelineConfig, tokenizer: Any, report_dir: Any = None,
                     write_report: bool = True) -> RunData:
    """Prepare every split the run uses and check the warm-up's needs (ConfigError, DataError or DataFileError)."""
    train = prepare_train(cfg, tokenizer, report_dir, write_report)
    eval_rows = prepare_eval(cfg, tokenizer, report_dir, write_report)
    check_warmup(cfg, train)
    data = RunData(train, eval_rows)
    if write_report and data.overlap_warning():
        print(f"[grpo] {data.overlap_warning()}", file=sys.stderr, flush=True)
    return data
