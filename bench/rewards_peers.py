"""Score our rewards and math-verify side by side on peer projects' public reward test cases.

    python bench/rewards_peers.py CASES.jsonl [--all] [--show-misses]

CASES.jsonl is a file of reward test cases collected from the public test suites of peer
projects (Math-Verify, open-r1, TRL, verl, the Unsloth notebook). The project does not ship
it; pass its path. One JSON object per line with these fields:

- `kind`: "correctness", "format_strict" or "xmlcount" (which of our rewards it tests);
- `ours`: {"completion": "<reasoning>...</reasoning><answer>...</answer>", "answer": "<reference>"};
- `ours_expected`: the reward a correct GSM8K grader gives (2.0 / 0.0, None = cannot be judged);
- `applies_gsm8k`: false for cases outside GSM8K-style numeric answers (sets, matrices, ...);
- `category`, `id`: for the miss list.

Both graders see the same case. Ours: the reward function itself. math-verify: its default
`parse` + `verify` on the text of the <answer> block against the reference (how peers use it
as a reward); a reference it cannot parse counts as "cannot be judged" (None), as TRL's
accuracy reward does. Format cases are ours only (math-verify grades no format).

Prints both counts, the share right with a 95% Wilson interval (the spread of an accuracy
measured on this many samples), the time per case, and the misses by category.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_pipeline.rewards import correctness_reward_func, strict_format_reward_func, xmlcount_reward_func  # noqa: E402
from grpo_pipeline.rewards.extract import extract_xml_answer  # noqa: E402

FORMAT_FUNCS = {"format_strict": strict_format_reward_func, "xmlcount": xmlcount_reward_func}


def fail(message: str) -> None:
    """Bad input: one message on stderr, exit code 2, no traceback."""
    print(message, file=sys.stderr)
    sys.exit(2)


def wilson_interval(right: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion: honest near 0% and 100%, where the normal
    approximation collapses to a zero-width interval.

    >>> [round(x, 3) for x in wilson_interval(144, 149)]
    [0.924, 0.986]
    """
    if total == 0:
        return 0.0, 1.0
    p = right / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def share(right: int, total: int) -> str:
    low, high = wilson_interval(right, total)
    return f"{right}/{total} = {right / max(total, 1):.1%} (95% CI {low:.2%}-{high:.2%})"


def math_verify_reward(completion: str, reference: str) -> float | None:
    from math_verify import parse, verify

    try:
        gold = parse(reference)
        if not gold:
            return None
        return 2.0 if verify(gold, parse(extract_xml_answer(completion))) else 0.0
    except Exception:  # math-verify raises on odd input in some versions; a peer's reward scores it 0
        return 0.0


def same(got: float | None, expected: float | None) -> bool:
    if got is None or expected is None:
        return got is expected
    return abs(got - expected) < 1e-9


def load_cases(path: Path) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        fail(f"bench/rewards_peers.py: cannot read the cases file {path} ({err.strerror}); pass the path "
                 "of the peer cases .jsonl file.")
    cases = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            case = json.loads(line)
            case["ours"]["completion"], case["ours"]["answer"], case["kind"]  # noqa: B018 (shape check)
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            fail(f"bench/rewards_peers.py: {path} line {number} is not a peer case ({err}); each line must be "
                     "a JSON object with `kind`, `ours.completion`, `ours.answer` and `ours_expected`.")
        cases.append(case)
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("cases", type=Path, help="path of the peer cases .jsonl file")
    parser.add_argument("--all", action="store_true", help="also score cases outside GSM8K-style answers")
    parser.add_argument("--show-misses", action="store_true", help="print every case either grader gets wrong")
    args = parser.parse_args()

    cases = [c for c in load_cases(args.cases) if args.all or c.get("applies_gsm8k", True)]
    start = time.perf_counter()
    from math_verify import parse  # one-off import + first parse, not part of the per-case time

    parse("$1$")
    warmup = time.perf_counter() - start

    right = Counter()  # (grader, kind) -> cases right
    total = Counter()  # kind -> cases
    seconds = Counter()  # grader -> seconds spent scoring
    misses = {"ours": Counter(), "math-verify": Counter()}
    miss_lines = []
    for case in cases:
        completion, reference = case["ours"]["completion"], case["ours"]["answer"]
        expected, kind = case.get("ours_expected"), case["kind"]
        group = "correctness" if kind == "correctness" else "format"
        total[group] += 1
        graders = {"ours": lambda: (correctness_reward_func(completions=[completion], answer=[reference])[0]
                                    if kind == "correctness" else FORMAT_FUNCS[kind](completions=[completion])[0])}
        if kind == "correctness":
            graders["math-verify"] = lambda: math_verify_reward(completion, reference)
        verdicts = {}
        for name, grade in graders.items():
            t0 = time.perf_counter()
            got = grade()
            seconds[name] += time.perf_counter() - t0
            verdicts[name] = same(got, expected)
            right[name, group] += verdicts[name]
            if not verdicts[name]:
                misses[name][case.get("category", "?")] += 1
        if args.show_misses and not all(verdicts.values()):
            marks = ", ".join(f"{name} {'ok' if ok else 'MISS'}" for name, ok in verdicts.items())
            miss_lines.append(f"  {case.get('id', '?')} [{case.get('category', '?')}] expected {expected}: {marks}; "
                              f"answer {extract_xml_answer(completion)[-70:]!r} vs {reference[-40:]!r}")

    n = total["correctness"] + total["format"]
    print(f"{args.cases.name}: {n} cases ({'all' if args.all else 'GSM8K-applicable'}): "
          f"{total['correctness']} correctness, {total['format']} format; "
          f"math_verify import + first parse (once, not timed below): {warmup:.2f} s")
    print(f"{'grader':<13}{'correctness right':>42}  {'format right':>12}  {'all right':>42}  {'ms/case':>8}")
    for name in ("ours", "math-verify"):
        graded = total["correctness"] + (total["format"] if name == "ours" else 0)
        both = right[name, "correctness"] + right[name, "format"]
        fmt = f"{right[name, 'format']}/{total['format']}" if name == "ours" else "n/a"
        print(f"{name:<13}{share(right[name, 'correctness'], total['correctness']):>42}  {fmt:>12}  "
              f"{share(both, graded) if name == 'ours' else 'n/a':>42}  "
              f"{1000 * seconds[name] / max(graded, 1):>8.2f}")
    diff = right["ours", "correctness"] - right["math-verify", "correctness"]
    print(f"on the same {total['correctness']} correctness cases: ours - math-verify = {diff:+d}")
    for name, counter in misses.items():
        print(f"{name} misses by category: {dict(counter.most_common()) or 'none'}")
    if miss_lines:
        print("\n".join(miss_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
