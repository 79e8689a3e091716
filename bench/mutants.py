"""Mutation score of the modules whose rules the tests must pin down, each against its own test files (mutmut).

    pip install mutmut                               # 3.x; not a dependency of the project
    nice -n 10 python bench/mutants.py               # every mutant of every module below: ~20 min on 2 cores
    nice -n 10 python bench/mutants.py checkpoints rules --budget-s 60     # some modules, each stopped after 60 s

A benchmark, not CI. For each module it copies the tree into a scratch folder, writes a [tool.mutmut] table
into the copy's pyproject.toml (source_paths, only_mutate = the module, pytest_add_cli_args_test_selection =
its tests), runs `mutmut run --max-children N` there (mutmut applies every mutation as a trampoline and
forks one pytest per mutant, running only the selected tests that reach the mutated function), and prints
killed / survived / other per module, the score (killed / (killed + survived)) and each survivor with its
diff line. The working tree is never touched.

What makes every mutant fit in ~20 minutes on 2 cores (before: 20 minutes and more for a part of each module):
- each module runs against the fast tests of its rules (`-m "not slow"` where the real CPU runs would reach every
  mutant: those runs stay in the default suite, the rules they reach are pinned by faster tests too);
- `timeout_multiplier = 3` (mutmut's default is 15): a mutant whose tests use more than 6x the CPU time they
  used unmutated (+1 s) is stopped as a timeout. Most timeouts are mutants that loop forever (rewards/language.py
  _without_maths); at the default each cost 84 s, 707 of rewards' 1195 busy seconds, and rewards took 12.5 min;
  with 3 it takes 457-533 s (docs/benchmarks.md has the whole run).
Running two modules side by side, one child each, was tried and saved nothing (19.4 min: the set-up phases are
not the idle time they look like). --budget-s stops a module's run after that many seconds (`--budget-s 170`
fits the five in ~15 minutes); a module that reaches it is marked "partial" and its score is over the mutants
checked (mutmut checks the fastest first, so a partial score leans to the cheap ones).

Survivors judged equivalent (no behaviour changes, so no test can kill them), with why:
- pipeline/run/checkpoints.py (94%: 447 killed, 29 survived, every mutant checked in ~2 min against
  tests/test_checkpoints_rules.py and the fast half of test_checkpoints.py; before, 77% over 167 of 477 mutants in
  600 s against the real GRPO runs of test_checkpoints.py alone). Every survivor is one of these:
  - the encoding of trainer_state.json and grpo_shape.json (checkpoint_problem 10, 12, checkpoint_state 2, 8,
    recorded_shape 7, 10: `encoding=None` or "UTF-8" for "utf-8"): the same codec, and the locale's codec is UTF-8
    on Linux (and in Python's UTF-8 mode under a C locale); transformers writes trainer_state.json in pure ASCII;
  - _move_aside's collision counter's start and step (13-16): the names stay unique and under previous/, which is
    all that is relied on (a test sets aside twice within one second; the name's format itself is pinned);
  - resume_command's `skip = None` (2, 4): falsy like False;
  - the model and trial passed on to transformers' Trainer._save_checkpoint (save_checkpoint_now 9,
    stage_checkpoint_saves 7, 21, 22): transformers 5.17 saves self.model, not its `model` argument, and trial is
    None outside a hyperparameter search;
  - load_every_adapter 23 (`... or len(configs) < 2 and not hasattr(...)`: with one adapter it loads the same
    top-level weights a second time, into the same adapter) and 47, 50, 52 (`is_trainable` False or left out: the
    set_adapter right after marks the active adapter trainable either way, in peft 0.21);
  - torch_zip_problem 4 (`>=` for `>`: a member's data can never end exactly at the end of the file, since the
    zip's central directory, which zipfile needs to list it, comes after);
  - remove_staging_leftovers 11, 13-16 (`ignore_errors` / `missing_ok` False): they differ only when an entry
    vanishes between the listing and its removal, which the run lock it is called under rules out, or when root
    cannot remove it;
  - GracefulStop._handle's `flush` (4, 6, 10): the note is printed either way (a test pins its text);
  and one "suspicious" (GracefulStop.__enter__ 1, no handler installed): the signal the test sends ends the test
  process, so the mutant is caught, as a crash.
- log and message text (logger.info/warning/error strings, the prose of RuntimeError/ConfigError messages past
  the field name and numbers the tests pin): for a human, not a contract. Most of pipeline/health/rules.py's
  survivors are these (e.g. "XXraise beta, ...XX", logger.error("health: %s", None)).
- pipeline/config/validate.py (93% after tests/test_config_rules.py; 43 survivors, all of these kinds):
  message prose past the field name, numbers and option names (XX-wrapped fragments and case changes of ordinary
  words: "Lower it" -> "lower it", "TRL" -> "trl"; resolve_optim 9-11, sampling_params_mapping 12, validate 16,
  26, 43, 73, 119-121, 134, 135, 143, 163, 165, 166, 200, validate_unsloth 35, 37, 47, 48, 73, 75, 76, 89, 90,
  102, 105); warnings.warn's stacklevel dropped or 3 (validate 226, 227: only the reported location moves);
  `rsplit(".")` / `rsplit(".", 2)` for `rsplit(".", 1)` then `[-1]` (validate_unsloth 7, 11, 21, 25, 58, 62: the
  text after the last dot either way); coerce's article for a kind that is neither int nor float (coerce 8, 12,
  13: the bool branch writes its own text, and coerce is only called with int, float or bool); `kind is not bool
  or rules` (check_field_values 85: the extra check_bounds calls have no bounds, so never raise); `... or True`
  passing the default (check_field_values 96: every bounded field has a plain default, never MISSING);
  world_size's fallback "XX1XX" (13: int() fails and the except returns the same 1).
- rewards/ (98%: 1,898 killed, 38 survived, 498 s, after tests/test_rewards_number_rules.py, _cleaning_rules.py,
  _reading_rules.py and, for the reward names, test_rewards_registry.py; every survivor judged equivalent, by kind):
  - the same value for every input: `range(0x20)` for `range(0x00, 0x20)` (cleaning._build_garbage_table 6);
    `len(text) < MAX_ANSWER_CHARS` for `<=` (normalize._prediction_window 14: the same check after the rstrip
    returns the same text); `rfind(cmd, None, start)` / `find(tag, None)` for a 0 start
    (cleaning._last_boxed_content 18, format._has_blocks_in_order 1); `text[None:start]` for `text[0:start]`
    (numbers.read_numbers 4);
    `in_phrase = None` for False under `or`/`not` (sentences.conclusion_value 77); round(..., 7) for 6 on
    multiples of 0.125 and 0.001 (format._xml_count 36); `type(None) is not str` only sends strings through
    the slower checks that pass them unchanged (normalize.parse_answer 2);
  - a value never produced: start -2 for -1 (cleaning._boxed_at 3), last_marker -2 (normalize._prediction_window
    17), `step >= 0` (numbers.glued_single_letter 10: callers pass +1 or -1), `value <= 0` (numbers.format_number
    51: zero returns earlier), `rstrip(None)` / `rstrip("XX0XX")` (format_number 55, 58: the fewest decimal
    places never end in 0), a lone "=" after the chosen cue (sentences.conclusion_value 40: it is itself a cue);
  - a condition that cannot change the result: tail[space + 1:] with no space (normalize._prediction_window 37,
    42); a `)]}` before a sign is already a maths character (numbers.read_numbers 24, 29); the dead
    `int_part is None or "," in int_part` guard (numbers.number_value 22, 24: a decimal comma only matches after a
    whole part that cannot end in a comma; 300,000 random strings found no case); rules that act only without a
    <reasoning> opener, when nothing is appended either way (language._parts 7, 14, 17, 18, 19, 23);
  - guaranteed elsewhere: a "number" answer always has a value (normalize.normalize_answer 4,
    matching.answers_match 19); each tag already checked to appear once (format._is_strict_format 14, 17, 19);
    xml_count's cap above its maximum 4 x 0.125 (format._xml_count 34, 35); the unclosed part of an <answer>
    cannot end with "</answer>" (extract.extract_xml_answer 29);
  - contract.probe_rewards 7 (`warn=lambda message: 0` for `lambda message: None`: the warner's return value is
    never read);
  - speed only: language._without_maths 10 and 23 make its scan quadratic (speed belongs in benchmarks, not in
    timed tests); its mutants that loop forever count as timeouts.
  Why so many survived before: rewards/normalize.py and rewards/symbolic.py cache their readings (lru_cache), and
  mutmut forks each mutant from a process that already ran the tests, so a test going through parse_answer got
  the unmutated answer back. tests/conftest.py now empties those caches before every test.
- pipeline/health/rules.py (94% after the tests of its edges in tests/test_guardrails.py and
  tests/test_health_rules.py: 627 killed, 38 survived, 164 s; build_health's three survivors were real gaps, now
  tested): log and message prose (above); `should_save = None` and
  `getattr(args, "logging_nan_inf_filter", None)` (falsy exactly like False where transformers tests them);
  `self._args = ""` before the first log (falsy: _checkpoint_before returns None as for None); the headline's
  `split(" (")` without a maxsplit or with 2 (the first part either way) and `rsplit` (each collapse rule's detail
  holds one " ("); `key.startswith("rewards/") or key.endswith("/mean")` (the wrong names it adds have no
  `rewards/<name>/mean` key, so they are dropped); `getattr(..., "logging_steps", None) or 1` (None or 1 is 1).
- pipeline/data/clean.py: none (100%: 202 killed, 105 s). Its last four survivors were real gaps, now tested over
  their classes in tests/test_data_cleaning.py: a non-text solution_field value gives no worked solution whatever
  the answer, the worked solution is the text before the last `####` (where the reference starts), and without a
  scorability checker every row is scorable and none is listed as kept unscorable.
Survivors that were real gaps got tests (tests/test_checkpoints_rules.py: a save failing before it wrote anything
keeps its own error, a staged save publishes only what it wrote, save_checkpoint_now at step 1, an older
checkpoint's adapter_model.bin, a model passed to the load that is not trainer.model, a model without adapters, the
names of the folders set aside; tests/test_checkpoints.py: a signal turns the next step end into save +
stop, corrupt checkpoints of later runs join the same corrupt/ folder with their reasons, an empty weights file
is no weights; tests/test_data_cleaning.py: float answers, columns of different lengths, the first 20 rejected ids, an
empty extracted final answer;
tests/test_health_rules.py: the adaptive-beta band edges, "above the limit" meaning strictly above for kl and
repetition, warn_every_steps, the summary keys, which logs count as training logs, booleans and text as
metrics, beta logged only when positive, attach() without `beta`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("pipeline", "rewards", "env", "tests", "configs", "bench", "pyproject.toml")


@dataclass(frozen=True)
class Target:
    name: str
    package: str  # the source_paths entry (a top-level folder)
    module: str  # what is mutated (an only_mutate glob)
    tests: tuple[str, ...]
    pytest_args: tuple[str, ...] = ()  # e.g. leave out the real training runs a module's unit tests already cover


TARGETS = (
    Target("rewards", "rewards", "rewards/*", ("tests/test_rewards.py", "tests/test_rewards_format.py",
                                               "tests/test_rewards_forms.py", "tests/test_rewards_properties.py",
                                               "tests/test_rewards_registry.py", "tests/test_rewards_language.py",
                                               "tests/test_rewards_number_rules.py",
                                               "tests/test_rewards_cleaning_rules.py",
                                               "tests/test_rewards_reading_rules.py", "tests/test_reward_contract.py",
                                               "tests/test_reward_contract_rules.py", "tests/test_reward_boundary.py",
                                               "tests/test_user_code.py"),
           pytest_args=("-m", "not slow")),  # the contract's real run (a reward raising at step 2) is end to end
    # validate()'s rules are tested in these four files; with test_config.py alone 61% (329 killed, 211
    # survived, 106 without tests) in 429 s, most survivors being rules the other three files test.
    Target("validate", "pipeline", "pipeline/config/validate.py",
           ("tests/test_config.py", "tests/test_config_exact.py", "tests/test_config_lists.py",
            "tests/test_config_types.py", "tests/test_config_rules.py")),
    # The flat-reward, hacking and rollback rules are tested in test_guardrails.py; its real CPU runs (-m slow)
    # reach every rule on every mutant and would not fit the budget, and its callback-level tests pin the rules.
    Target("rules", "pipeline", "pipeline/health/rules.py", ("tests/test_health_rules.py", "tests/test_guardrails.py"),
           pytest_args=("-m", "not slow")),
    # The rules split out of rules.py (their edges are pinned by the same tests and tests/test_rollout_freshness.py)
    *(Target(name, "pipeline", f"pipeline/health/{name}.py", ("tests/test_health_rules.py", "tests/test_guardrails.py",
                                                              "tests/test_rollout_freshness.py"),
             pytest_args=("-m", "not slow")) for name in ("rollout", "signal")),
    # clean_rows' scorable-answer and worked-solution rules are tested with the user-data cases of test_data_own.py,
    # TRL prompts' (check_prompt) in test_data_trl.py
    Target("clean", "pipeline", "pipeline/data/clean.py", ("tests/test_data_cleaning.py", "tests/test_data_own.py",
                                                           "tests/test_data_trl.py"),
           pytest_args=("-m", "not slow")),
    # Its rules are tested fast in test_checkpoints_rules.py (crafted folders, a real transformers Trainer over a
    # tiny LoRA model); the real GRPO runs of test_checkpoints.py (-m slow) reach most functions on every mutant.
    Target("checkpoints", "pipeline", "pipeline/run/checkpoints.py",
           ("tests/test_checkpoints.py", "tests/test_checkpoints_rules.py"), pytest_args=("-m", "not slow")),
    # What was split out of checkpoints.py: the resume checks and the signal handling, under the same tests
    *(Target(name, "pipeline", f"pipeline/run/{name}.py",
             ("tests/test_checkpoints.py", "tests/test_checkpoints_rules.py"), pytest_args=("-m", "not slow"))
      for name in ("resume", "stop")),
)


def _toml_list(values) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


def prepare(target: Target, scratch: Path) -> None:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, scratch / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, scratch / name)
    others = [name for name in COPIED if name != target.package and (ROOT / name).is_dir()]
    table = (
        "\n[tool.mutmut]\n"
        f"source_paths = {_toml_list([target.package + '/'])}\n"
        f"only_mutate = {_toml_list([target.module])}\n"
        f"also_copy = {_toml_list(o + '/' for o in others)}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(target.tests)}\n"
        f"pytest_add_cli_args = {_toml_list(['-q', '-x', '-p', 'no:cacheprovider', *target.pytest_args])}\n"
        "use_git_change_detection = false\n"
        "timeout_multiplier = 3.0\n"  # see the docstring: the default 15 spent most of the run on endless loops
    )
    with open(scratch / "pyproject.toml", "a", encoding="utf-8") as handle:
        handle.write(table)


_STATUS = re.compile(r"^\s*(\S+): (\w[\w ]*)$")


def results(scratch: Path) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=scratch,
                          capture_output=True, text=True, check=False)
    return {m.group(1): m.group(2) for line in done.stdout.splitlines() if (m := _STATUS.match(line))}


def diff_line(scratch: Path, mutant: str) -> str:
    done = subprocess.run([sys.executable, "-m", "mutmut", "show", mutant], cwd=scratch, capture_output=True,
                          text=True, check=False)
    changed = [line for line in done.stdout.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return changed[0][1:].strip() if changed else "?"


def run_target(target: Target, budget_s: float | None, children: int) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix=f"mutants-{target.name}-"))
    try:
        prepare(target, scratch)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "OMP_NUM_THREADS": "1"}
        env.pop("PYTHONPATH", None)
        start = time.time()
        timed_out = False
        log = scratch / "mutmut-run.log"
        try:
            with open(log, "wb") as out:
                subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(children)],
                               cwd=scratch, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=budget_s,
                               check=False)
        except subprocess.TimeoutExpired:
            timed_out = True
        statuses = results(scratch)
        if not any(status in ("killed", "survived") for status in statuses.values()):
            # mutmut stops before any mutant when the selected tests fail unmutated (or it cannot start): say why
            tail = log.read_bytes()[-3000:].decode("utf-8", "replace").replace("\r", "\n").splitlines()
            print(f"{target.name}: no mutant was checked; mutmut's last lines:", *tail[-25:], sep="\n    ",
                  file=sys.stderr)
        counts: dict[str, int] = {}
        for status in statuses.values():
            counts[status] = counts.get(status, 0) + 1
        killed, survived = counts.get("killed", 0), counts.get("survived", 0)
        survivors = {name: diff_line(scratch, name) for name, status in statuses.items() if status == "survived"}
        untested: dict[str, int] = {}  # function -> mutants no selected test reaches (not in the score: say so)
        for name, status in statuses.items():
            if status == "no tests":
                function = name.split("__mutmut_")[0].replace(".x__", ".").replace(".x_", ".")
                untested[function] = untested.get(function, 0) + 1
        return {"name": target.name, "module": target.module, "seconds": round(time.time() - start),
                "timed_out": timed_out, "counts": counts, "killed": killed, "survived": survived,
                "score": killed / (killed + survived) if killed + survived else None, "survivors": survivors,
                "untested": untested}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def print_row(row: dict) -> None:
    score = f"{row['score']:.0%}" if row["score"] is not None else "-"
    other = {k: v for k, v in row["counts"].items() if k not in ("killed", "survived")}
    print(f"{row['name']:<12} {row['module']:<30} score {score:>5}  killed {row['killed']:>4}  survived "
          f"{row['survived']:>3}  other {other or '-'}  {row['seconds']} s"
          + ("  (budget reached: partial)" if row["timed_out"] else ""))
    for name, line in sorted(row["survivors"].items()):
        print(f"    survived {name}: {line}")
    for function, count in sorted(row["untested"].items()):
        print(f"    no tests {function}: {count} mutants")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="modules to run (default: all): " +
                        ", ".join(t.name for t in TARGETS))
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop each module's run after this many seconds (default: none, every mutant is "
                             "checked; all five modules take ~20 min on 2 cores)")
    parser.add_argument("--max-children", type=int, default=2, help="mutants tested in parallel (default 2)")
    args = parser.parse_args(argv)
    if shutil.which("mutmut") is None:
        print("mutmut is not installed: pip install mutmut", file=sys.stderr)
        return 2
    unknown = sorted(set(args.targets) - {t.name for t in TARGETS})
    if unknown:
        parser.error(f"unknown module(s) {unknown}; choose from {', '.join(t.name for t in TARGETS)}")
    for target in TARGETS:
        if not args.targets or target.name in args.targets:
            print_row(run_target(target, args.budget_s, args.max_children))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
