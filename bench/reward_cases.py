"""Time the five reward functions on 10k realistic completions, beside the notebook's originals,
and score correctness on real GSM8K text.

    python bench/reward_cases.py [--n 10000] [--batch 64] [--seed 0] [--gsm8k FILE_OR_FOLDER ...]

Completions are generated (seeded): well-formed XML with multi-line reasoning, missing or
reordered newlines, currency/units/thousands in the answer, Chinese answers, LaTeX
(\\boxed, \\frac, $..$), malformed tags (missing, unclosed, repeated, trailing text), long
rambling or truncated outputs, garbage characters from a collapsing policy, a few symbolic
expressions that need math-verify (--symbolic-share, default 0.3%: GSM8K answers from Qwen2.5
are almost always plain numbers; raise it to see the slow path's cost, roughly 5-25 ms per
call), and odd entries (None, numbers). The generator's own right/wrong labels are not used
to judge accuracy: they were written alongside the rewards.

Accuracy is scored on text nobody here wrote (--gsm8k, see GSM8K_HELP) and on peer projects'
public test cases (bench/rewards_peers.py).

The notebook's functions (unslothai/notebooks nb/Qwen2.5_(3B)-GRPO.ipynb, see env/known_good.toml [notebook])
are re-implemented verbatim in logic in tests/unsloth_notebook_rewards.py (the tests train on them; imported from
there), its correctness reward below without the print it makes on every call. They crash on None/non-string content, so they
get "" in place of those; ours get the raw batch. math_verify is imported and warmed up
before timing (its one-off import cost is printed separately): a training run pays it once.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_pipeline import rewards  # noqa: E402
from bench.rewards_peers import fail, share  # noqa: E402
from grpo_pipeline.rewards import matching, symbolic  # noqa: E402
from grpo_pipeline.rewards.normalize import _parse_text  # noqa: E402
from tests.unsloth_notebook_rewards import (  # noqa: E402 - the notebook's rewards: the tests own the copy
    nb_extract_xml_answer,
    nb_int_reward_func,
    nb_soft_format_reward_func,
    nb_strict_format_reward_func,
    nb_xmlcount_reward_func,
)


# --- the notebook's originals ---------------------------------------------------------------

def nb_correctness_reward_func(prompts, completions, answer, **kwargs) -> list[float]:
    responses = [completion[0]["content"] for completion in completions]
    extracted_responses = [nb_extract_xml_answer(r) for r in responses]
    # (the notebook also prints one sample per call; left out so printing is not timed)
    return [2.0 if r == a else 0.0 for r, a in zip(extracted_responses, answer)]


# --- realistic completions ------------------------------------------------------------------

TARGET_S = 1.0  # all five rewards over 10k completions, CPU seconds on a 2-core machine

STEPS_EN = ["She buys {a} apples at ${b} each.", "That costs {a} * {b} = {c} dollars.", "Then he walks {a} km.",
            "Half of {a} is {b}.", "Adding {a} and {b} gives {c}.", "So far we have {a} items."]
STEPS_ZH = ["小明买了{a}个苹果。", "每个{b}元，一共{c}元。", "再加上{a}个，得到{c}个。"]
GARBAGE = ["\ufffd", "\u200b", "\x00", "\x1b[0m", "\ufeff", "\u202e"]


def _reasoning(rng: random.Random, chinese: bool, lines: int) -> str:
    steps = STEPS_ZH if chinese else STEPS_EN
    return "\n".join(rng.choice(steps).format(a=rng.randint(1, 99), b=rng.randint(1, 20), c=rng.randint(10, 999))
                     for _ in range(lines))


def _render_answer(rng: random.Random, value: int) -> str:
    """The same integer written the ways models write it."""
    styles = [str(value), f"{value:,}", f"${value:,}", f"{value} dollars", f"{value}元", f"答案：{value}",
              f"The answer is {value}.", f"\\boxed{{{value}}}", f"${value}$", f"{value}.00",
              f"{value:,}".replace(",", " ")]
    weights = [50, 6, 6, 4, 3, 4, 6, 6, 3, 3, 1]
    return rng.choices(styles, weights)[0]


def make_completion(rng: random.Random, reference: int, symbolic_share: float) -> tuple[object, bool]:
    """One completion (TRL conversational shape) and whether its answer is right."""
    correct = rng.random() < 0.6
    value = reference if correct else reference + rng.choice([-10, -1, 1, 2, 100])
    kind = rng.choices(
        ["strict", "no_newlines", "crlf", "chinese", "latex_frac", "malformed", "long", "garbage", "symbolic", "odd"],
        [45, 12, 5, 10, 4, 12, 5, 4, 100 * symbolic_share, 2],
    )[0]
    answer = _render_answer(rng, value)
    if kind == "strict":
        body = _reasoning(rng, False, rng.randint(2, 8))
        text = f"<reasoning>\n{body}\n</reasoning>\n<answer>\n{answer}\n</answer>\n"
    elif kind == "no_newlines":
        text = f"<reasoning>{_reasoning(rng, False, 3)}</reasoning> <answer>{answer}</answer>"
    elif kind == "crlf":
        text = f"<reasoning>\r\n{_reasoning(rng, False, 3)}\r\n</reasoning>\r\n<answer>\r\n{answer}\r\n</answer>\r\n"
    elif kind == "chinese":
        text = f"<reasoning>\n{_reasoning(rng, True, 4)}\n</reasoning>\n<answer>\n答案：{value}\n</answer>"
    elif kind == "latex_frac":
        # a fraction that equals the value: \frac{2v}{2}, "2v/2"
        text = rng.choice([f"<reasoning>x</reasoning><answer>$\\frac{{{2 * value}}}{{2}}$</answer>",
                           f"<reasoning>x</reasoning><answer>{2 * value}/2</answer>"])
    elif kind == "malformed":
        body = _reasoning(rng, False, 3)
        variant = rng.randrange(6)
        text = [
            f"{body}\nThe answer is {value}.",  # no tags at all: no answer to judge
            f"<reasoning>\n{body}\n</reasoning>\n<answer>\n{answer}",  # unclosed final answer block
            f"<answer>{value - 1}</answer>\n<reasoning>{body}</reasoning>\n<answer>{answer}</answer>",  # repeated
            f"<reasoning>\n{body}\n</reasoning>\n<answer>\n{answer}\n</answer>\nHope this helps!",  # trailing
            f"<reasoning>{body}<answer>{answer}</answer>",  # unclosed reasoning
            f"<reasoning>\n{body}\n</reasoning>\n<answer>\n{value} or {value + 3}\n</answer>\n",  # two numbers
        ][variant]
        correct = correct and variant not in (0, 5)
    elif kind == "long":
        body = _reasoning(rng, rng.random() < 0.3, rng.randint(100, 600))
        truncated = rng.random() < 0.5
        text = f"<reasoning>\n{body}\n</reasoning>\n<answer>\n{answer}\n</answer>\n"
        if truncated:
            text = f"<reasoning>\n{body}"
        correct = correct and not truncated
    elif kind == "garbage":
        noise = "".join(rng.choice(GARBAGE) for _ in range(3))
        text = f"<reasoning>\n{_reasoning(rng, False, 2)}{noise}\n</reasoning>\n<answer>\n{value}{noise}\n</answer>\n"
    elif kind == "symbolic":
        expr = rng.choice([f"\\sqrt{{{value * value}}}", f"{value} \\cdot 1", f"({value})", f"2x + {value}"])
        text = f"<reasoning>x</reasoning><answer>{expr}</answer>"
        correct = correct and "x" not in expr
    else:  # odd shapes from a broken pipeline
        return rng.choice([None, 42, [{"role": "assistant", "content": None}], {"content": None}]), False
    return [{"role": "assistant", "content": text}], correct


def build_batch(n: int, seed: int, symbolic_share: float = 0.003) -> tuple[list, list[str], list[bool]]:
    rng = random.Random(seed)
    completions, answers, truth = [], [], []
    for _ in range(n):
        reference = rng.choice([rng.randint(1, 200), rng.randint(1000, 99999)])
        completion, correct = make_completion(rng, reference, symbolic_share)
        completions.append(completion)
        answers.append(str(reference))
        truth.append(correct)
    return completions, answers, truth


def notebook_safe(completions: list) -> list:
    """The notebook functions crash on non-string content; give them "" there."""
    safe = []
    for c in completions:
        text = c[0].get("content") if isinstance(c, list) and c and isinstance(c[0], dict) else None
        safe.append([{"role": "assistant", "content": text if isinstance(text, str) else ""}])
    return safe


# --- accuracy on real GSM8K text -------------------------------------------------------------

GSM8K_HELP = """GSM8K file(s) to score correctness on: .jsonl/.json/.parquet with `question` and `answer`
columns, or a folder written by `datasets.save_to_disk` (the folder the pipeline keeps under its
data cache, hub/openai__gsm8k__main__default, after `python -m grpo_pipeline.pipeline data` has run once with
dataset_name openai/gsm8k). To write a file on a machine with hub access:
python -c "from datasets import load_dataset as L; L('openai/gsm8k', 'main', split='test').to_json('gsm8k_test.jsonl')"
(the original release, github.com/openai/grade-school-math, has the same rows in grade_school_math/data/).
Each row gives three completions, with labels that come from the dataset itself:
the row's own `#### answer` text (must score 2.0); the last line of its human-written solution
(calculator notes <<..>> removed), a conclusion sentence such as "So he runs 9*60=540 meters" (must
score 2.0); and that same sentence against the next row's different answer (must score 0.0)."""

_CALCULATOR_NOTE = re.compile(r"<<[^<>]*>>")


def load_gsm8k(paths: list[Path]) -> list[tuple[str, str]]:
    """(solution text, final answer text) for every row with a "####" line."""
    import datasets

    rows = []
    for path in paths:
        if path.is_dir():
            data = datasets.load_from_disk(str(path))
            splits = list(data.values()) if isinstance(data, datasets.DatasetDict) else [data]
        elif path.is_file():
            builder = "parquet" if path.suffix == ".parquet" else "json"
            splits = [datasets.load_dataset(builder, data_files=str(path), split="train")]
        else:
            fail(f"bench/reward_cases.py: --gsm8k {path}: no such file or folder.\n\n{GSM8K_HELP}")
        for split in splits:
            if "answer" not in split.column_names:
                fail(f"bench/reward_cases.py: --gsm8k {path} has no `answer` column (columns: {split.column_names}).")
            for solution in split["answer"]:
                if isinstance(solution, str) and "####" in solution:
                    body, final = solution.rsplit("####", 1)
                    rows.append((body.strip(), final.strip()))
    return rows


def gsm8k_accuracy(rows: list[tuple[str, str]]) -> None:
    """Print, per grader, how many of the dataset's own right and wrong pairs it scores right."""
    from math_verify import parse, verify

    def wrap(text: str) -> list[dict]:
        return [{"role": "assistant", "content": f"<reasoning>\nWork.\n</reasoning>\n<answer>\n{text}\n</answer>\n"}]

    def math_verify_score(text: str, reference: str) -> float:
        try:
            return 2.0 if verify(parse(reference), parse(text)) else 0.0
        except Exception:  # a peer's reward built on it scores errors 0
            return 0.0

    readable = sum(rewards.normalize_answer(final) is not None and rewards.parse_answer(final).kind == "number"
                   for _, final in rows)
    references = [rewards.extract_hash_answer(f"#### {final}") for _, final in rows]
    conclusions = [" ".join(_CALCULATOR_NOTE.sub("", body).splitlines()[-1].split()) if body else ""
                   for body, _ in rows]
    # (completion text, reference, should it score 2.0?)
    sets = {
        "own #### answer": [(final, ref, True) for (_, final), ref in zip(rows, references)],
        "conclusion sentence": [(c, ref, True) for c, ref in zip(conclusions, references)],
        "sentence vs other answer": [(c, other, False) for c, ref, other in zip(conclusions, references,
                                                                                references[1:] + references[:1])
                                     if other != ref],
    }
    print(f"\nreal GSM8K: {len(rows)} rows; references that read as one number: {readable}/{len(rows)}")
    print(f"{'completions':<26}{'n':>6}  {'ours right':>42}  {'notebook right':>42}  {'math-verify right':>42}")
    for label, items in sets.items():
        texts = [wrap(t) for t, _, _ in items]
        refs = [r for _, r, _ in items]
        ours = rewards.correctness_reward_func(completions=texts, answer=refs)
        notebook = nb_correctness_reward_func(None, texts, refs)
        mv = [math_verify_score(t, r) for t, r, _ in items]
        cells = []
        for scores in (ours, notebook, mv):
            right = sum((score == 2.0) == should for score, (_, _, should) in zip(scores, items))
            cells.append(share(right, len(items)))
        print(f"{label:<26}{len(items):>6}" + "".join(f"  {c:>42}" for c in cells))
    print("(a wrong answer accepted counts against a grader in the last row; a right one missed in the others. "
          "A conclusion sentence that does not state the final answer is possible in the data and counts as a miss)")


# --- timing ---------------------------------------------------------------------------------

def time_function(func, completions: list, answers: list[str], batch: int) -> tuple[float, float, list]:
    """Wall and CPU seconds for scoring all completions in TRL-sized batches, and the scores.
    CPU time is shown too because wall time on a shared box includes other processes' load."""
    prompts = [[{"role": "user", "content": "q"}]] * batch
    out: list = []
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(0, len(completions), batch):
        chunk = completions[i:i + batch]
        out.extend(func(prompts=prompts[:len(chunk)], completions=chunk, answer=answers[i:i + batch],
                        completion_ids=None, trainer_state=None))
    return time.perf_counter() - start, time.process_time() - cpu_start, out


def measure(n: int = 10_000, batch: int = 64, seed: int = 0, symbolic_share: float = 0.003,
            repeats: int = 3) -> dict:
    """Time ours and the notebook's five rewards on the same batch, interleaved, `repeats` times each."""
    completions, answers, _ = build_batch(n, seed, symbolic_share)
    total_chars = sum(len(c[0]["content"]) for c in notebook_safe(completions))

    start = time.perf_counter()
    symbolic.symbolic_equal("\\sqrt{4}", "2")  # one-off: import math_verify + sympy, first parse
    symbolic.symbolic_equal("\\sqrt{5}", "2")  # sympy loads more on the first unequal comparison
    warmup = time.perf_counter() - start

    calls = {"n": 0}
    original = symbolic.symbolic_equal

    def counting(pred: str, ref: str) -> bool:
        calls["n"] += 1
        return original(pred, ref)

    rows = []
    pairs = [("xmlcount", rewards.xmlcount_reward_func, nb_xmlcount_reward_func),
             ("soft_format", rewards.soft_format_reward_func, nb_soft_format_reward_func),
             ("strict_format", rewards.strict_format_reward_func, nb_strict_format_reward_func),
             ("int", rewards.int_reward_func, nb_int_reward_func),
             ("correctness", rewards.correctness_reward_func, nb_correctness_reward_func)]
    safe = notebook_safe(completions)
    matching.symbolic_equal = counting  # count slow-path calls; restored below
    try:
        for name, ours, theirs in pairs:
            walls, cpus, nb_walls = [], [], []
            for _ in range(repeats):
                _parse_text.cache_clear()  # each repeat starts cold, as a new batch of new answers would
                symbolic._parse.cache_clear()
                symbolic._verdict.cache_clear()
                calls["n"] = 0
                elapsed, cpu, out_ours = time_function(ours, completions, answers, batch)
                walls.append(elapsed)
                cpus.append(cpu)
                elapsed, _, out_nb = time_function(theirs, safe, answers, batch)
                nb_walls.append(elapsed)  # interleaved with ours: both see the same machine load
            assert len(out_ours) == len(completions)
            rows.append((name, min(walls), min(cpus), min(nb_walls), sum(v or 0.0 for v in out_ours) / len(out_ours),
                         sum(out_nb) / len(out_nb), max(walls), max(nb_walls)))
    finally:
        matching.symbolic_equal = original
    totals = [sum(r[i] for r in rows) for i in (1, 2, 3, 6, 7)]
    return {"rows": rows, "totals": totals, "chars": total_chars, "warmup": warmup, "symbolic_calls": calls["n"]}


def rows(n: int = 10_000, repeats: int = 3) -> list[dict]:
    """bench/run_all.py's protocol: the five rewards' CPU time on `n` completions (judged on CPU time: on a
    shared machine wall time also counts other processes)."""
    result = measure(n=n, repeats=repeats)
    wall, cpu, notebook = result["totals"][:3]
    return [{"figure": f"5 rewards on {n} completions", "value": f"{cpu:.3f} s CPU, {wall:.3f} s wall "
             f"(notebook's {notebook:.3f} s)", "target": f"< {TARGET_S:g} s CPU", "holds": cpu < TARGET_S,
             "samples": f"best of {repeats} x {n} completions"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=64, help="completions per reward call (TRL calls per batch)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--symbolic-share", type=float, default=0.003,
                        help="share of answers written as expressions that need math-verify, e.g. \\sqrt{324}")
    parser.add_argument("--repeats", type=int, default=3,
                        help="time each function this often (caches cleared); best and spread are printed")
    parser.add_argument("--gsm8k", type=Path, nargs="+", default=[], metavar="FILE_OR_FOLDER", help=GSM8K_HELP)
    args = parser.parse_args()
    gsm8k_rows = load_gsm8k(args.gsm8k) if args.gsm8k else []
    result = measure(args.n, args.batch, args.seed, args.symbolic_share, args.repeats)
    rows, totals, total_chars, warmup = result["rows"], result["totals"], result["chars"], result["warmup"]
    calls = {"n": result["symbolic_calls"]}

    print(f"{args.n} completions ({total_chars / 1e6:.1f} M chars), batches of {args.batch}, best of {args.repeats}; "
          f"math_verify warm-up (once per process, not in the table): {warmup:.2f} s")
    print(f"{'reward':<15}{'ours (s)':>16}{'ours cpu (s)':>14}{'notebook (s)':>18}{'ratio':>7}"
          f"{'ours mean':>11}{'nb mean':>9}")
    for name, t_ours, cpu_ours, t_nb, m_ours, m_nb, worst_ours, worst_nb in rows:
        print(f"{name:<15}{t_ours:>7.3f} ({worst_ours:.3f}){cpu_ours:>14.3f}{t_nb:>9.3f} ({worst_nb:.3f})"
              f"{t_ours / max(t_nb, 1e-9):>7.2f}{m_ours:>11.3f}{m_nb:>9.3f}")
    print(f"{'total':<15}{totals[0]:>7.3f} ({totals[3]:.3f}){totals[1]:>14.3f}{totals[2]:>9.3f} ({totals[4]:.3f})"
          f"{totals[0] / max(totals[2], 1e-9):>7.2f}")
    print(f"(best of {args.repeats}, worst in brackets; ours on the raw batch; the notebook's on a copy with "
          "None/non-string content replaced by \"\", since its functions crash on those); "
          f"math-verify calls in the last correctness run: {calls['n']}")
    # Judged on CPU time: on a shared machine wall time also counts other processes (the
    # notebook's column slows down by the same factor when that happens).
    print(f"target: all five rewards under 1 s for {args.n} completions: ours {totals[1]:.3f} s CPU "
          f"({totals[0]:.3f} s wall): {'holds' if totals[1] < TARGET_S else 'MISSED'}")
    if gsm8k_rows:
        gsm8k_accuracy(gsm8k_rows)
    else:
        print("\nreal GSM8K accuracy: skipped (pass --gsm8k FILE_OR_FOLDER; see --help). "
              "Peer cases: python bench/rewards_peers.py CASES.jsonl")


if __name__ == "__main__":
    main()
