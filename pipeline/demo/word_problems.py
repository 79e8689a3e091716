"""`demo-word-problems`: GSM8K-style 2- and 3-step word problems in English and Chinese, generated from a table of
templates (the bundled GSM8K sample's 50 are too few to hold some out), with a worked solution in GSM8K's layout
(`... = <<a*b=c>>c ...` then `#### answer`) through whole-number steps. The warm-up's teacher is always right.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

from grpo_pipeline.pipeline.demo.task import TASK_FILE, DemoTask, drawn_split
from grpo_pipeline.rewards.format import format_completion

TRAIN_SIZE, TEST_SIZE = 3000, 300

NAMES = {"en": ("Tom", "Maria", "Ali", "Lena", "Sam", "Priya", "Ken", "Rosa"),
         "zh": ("小明", "小红", "小刚", "小丽", "小华", "小芳", "小军", "小兰")}
# (English plural, Chinese noun, Chinese measure word)
THINGS = (("pencils", "铅笔", "支"), ("apples", "苹果", "个"), ("stickers", "贴纸", "张"), ("marbles", "弹珠", "颗"),
          ("cookies", "饼干", "块"), ("books", "书", "本"))
PACKS = (("boxes", "盒"), ("bags", "袋"), ("packs", "包"))


def _step(a: int, op: str, b: int, before: str = "", after: str = "") -> str:
    """One worked step in GSM8K's layout: `a op b = <<a op b=r>>r`."""
    r = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
    return f"{before}{a} {op} {b} = <<{a}{op}{b}={r}>>{r}{after}"


def _groups_minus(rng: random.Random, lang: str) -> dict[str, Any]:
    """a packs of b things, gives away c: a*b - c."""
    name, (thing, zh_thing, measure), (pack, zh_pack) = rng.choice(NAMES[lang]), rng.choice(THINGS), rng.choice(PACKS)
    a, b = rng.randint(2, 9), rng.randint(6, 24)
    c = rng.randint(1, a * b - 1)
    return {"question": f"{name} has {a} {pack} of {b} {thing} each. {name} gives away {c} {thing}. "
                        f"How many {thing} does {name} have left?" if lang == "en" else
                        f"{name}有{a}{zh_pack}{zh_thing}，每{zh_pack}{b}{measure}。"
                        f"{name}送给别人{c}{measure}。{name}还剩多少{measure}{zh_thing}？",
            "steps": [_step(a, "*", b), _step(a * b, "-", c)], "answer": a * b - c}


def _buy_change(rng: random.Random, lang: str) -> dict[str, Any]:
    """a items at p dollars and b items at q dollars, pays with m: m - (a*p + b*q)."""
    name = rng.choice(NAMES[lang])
    a, p, b, q = rng.randint(2, 6), rng.randint(2, 9), rng.randint(2, 6), rng.randint(3, 15)
    cost = a * p + b * q
    m = 10 * ((cost // 10) + rng.randint(1, 5))
    return {"question": f"{name} buys {a} notebooks at {p} dollars each and {b} pens at {q} dollars each. "
                        f"{name} pays with {m} dollars. How much change does {name} get, in dollars?" if lang == "en"
                        else f"{name}买了{a}本笔记本，每本{p}元，又买了{b}支钢笔，每支{q}元。"
                             f"{name}付了{m}元，应找回多少元？",
            "steps": [_step(a, "*", p), _step(b, "*", q), _step(a * p, "+", b * q), _step(m, "-", cost)],
            "answer": m - cost}


def _weeks_reading(rng: random.Random, lang: str) -> dict[str, Any]:
    """p pages a day for w weeks, plus e extra pages: p*7*w + e."""
    name = rng.choice(NAMES[lang])
    p, w, e = rng.randint(5, 30), rng.randint(2, 5), rng.randint(3, 40)
    days = 7 * w
    return {"question": f"{name} reads {p} pages every day for {w} weeks, then {e} more pages on the last evening. "
                        f"How many pages does {name} read in all?" if lang == "en" else
                        f"{name}每天读{p}页书，连续读了{w}周，最后一晚又多读了{e}页。"
                        f"{name}一共读了多少页？",
            "steps": [_step(w, "*", 7, f"{w} weeks are ", " days"), _step(p, "*", days), _step(p * days, "+", e)],
            "answer": p * days + e}


def _share_equally(rng: random.Random, lang: str) -> dict[str, Any]:
    """a things and b more, shared equally among k friends: (a+b)/k."""
    name, (thing, zh_thing, measure) = rng.choice(NAMES[lang]), rng.choice(THINGS)
    k, each = rng.randint(3, 8), rng.randint(4, 15)
    a = rng.randint(1, k * each - 1)
    b = k * each - a
    return {"question": f"{name} has {a} {thing} and buys {b} more. {name} shares them equally among {k} friends. "
                        f"How many {thing} does each friend get?" if lang == "en" else
                        f"{name}有{a}{measure}{zh_thing}，又买了{b}{measure}。"
                        f"{name}把它们平均分给{k}个朋友。每个朋友分到多少{measure}？",
            "steps": [_step(a, "+", b), _step(k * each, "/", k)], "answer": each}


def _earn_save(rng: random.Random, lang: str) -> dict[str, Any]:
    """h hours at r dollars an hour, spends s: h*r - s."""
    name = rng.choice(NAMES[lang])
    h, r = rng.randint(3, 12), rng.randint(8, 25)
    earned = h * r
    s = rng.randint(1, earned - 1)
    return {"question": f"{name} works {h} hours and earns {r} dollars an hour. {name} then spends {s} dollars on a "
                        f"game. How many dollars does {name} have left?" if lang == "en" else
                        f"{name}工作了{h}小时，每小时挣{r}元。然后{name}花{s}元买了一个游戏。"
                        f"{name}还剩多少元？",
            "steps": [_step(h, "*", r), _step(earned, "-", s)], "answer": earned - s}


def _rows_of_seats(rng: random.Random, lang: str) -> dict[str, Any]:
    """r rows of s seats, t taken, then g guests arrive and sit: r*s - t - g."""
    r, s = rng.randint(4, 15), rng.randint(6, 20)
    seats = r * s
    t = rng.randint(1, seats - 2)
    g = rng.randint(1, seats - t - 1)
    return {"question": f"A hall has {r} rows of {s} seats. {t} seats are taken, then {g} more guests arrive and "
                        f"sit down. How many seats are still empty?" if lang == "en" else
                        f"礼堂里有{r}排座位，每排{s}个。已经坐了{t}人，"
                        f"后来又来了{g}位客人坐下。还有多少个空座位？",
            "steps": [_step(r, "*", s), _step(seats, "-", t), _step(seats - t, "-", g)], "answer": seats - t - g}


def _twice_as_many(rng: random.Random, lang: str) -> dict[str, Any]:
    """A has a, B has k times as many, together: a + k*a."""
    first, second = rng.sample(NAMES[lang], 2)
    thing, zh_thing, measure = rng.choice(THINGS)
    a, k = rng.randint(3, 40), rng.randint(2, 5)
    return {"question": f"{first} has {a} {thing}. {second} has {k} times as many {thing} as {first}. "
                        f"How many {thing} do they have together?" if lang == "en" else
                        f"{first}有{a}{measure}{zh_thing}。{second}的{zh_thing}是{first}的{k}倍。"
                        f"他们一共有多少{measure}{zh_thing}？",
            "steps": [_step(k, "*", a), _step(a, "+", k * a)], "answer": a + k * a}


def _trips(rng: random.Random, lang: str) -> dict[str, Any]:
    """n people, a van carries c per trip (n a multiple of c), each trip d km there: n/c trips * 2d km."""
    c, trips, d = rng.randint(4, 9), rng.randint(2, 8), rng.randint(3, 25)
    n = c * trips
    return {"question": f"A van carries {c} people a trip. {n} people must go to a camp {d} km away, and the van "
                        f"drives back empty after each trip. How many km does the van drive in all?" if lang == "en"
                        else f"一辆面包车每趟能载{c}人。有{n}人要去{d}千米外的营地，"
                             "每趟送完后车要空车开回来。这辆车一共要行驶多少千米？",
            "steps": [_step(n, "/", c, after=" trips"), _step(d, "*", 2, "each trip is ", " km"),
                      _step(trips, "*", 2 * d)], "answer": trips * 2 * d}


# The templates, by name (tests/test_word_problems.py solves each name's questions its own way).
TEMPLATES: dict[str, Callable[[random.Random, str], dict[str, Any]]] = {t.__name__[1:]: t for t in (
    _groups_minus, _buy_change, _weeks_reading, _share_equally, _earn_save, _rows_of_seats, _twice_as_many, _trips)}
ZH_SHARE = 0.25  # a quarter of the problems in Chinese


def _draw(rng: random.Random) -> dict[str, Any]:
    template = rng.choice(list(TEMPLATES))
    lang = "zh" if rng.random() < ZH_SHARE else "en"
    problem = TEMPLATES[template](rng, lang)
    return {"question": problem["question"], "answer": str(problem["answer"]),
            "solution": ".\n".join(problem["steps"]) + ".", "template": template, "language": lang}


def _split_problems(split: str) -> list[dict[str, Any]]:
    return drawn_split(split, TRAIN_SIZE if split == "train" else TEST_SIZE, _draw, one_in=10)


WORD_PROBLEMS = DemoTask(
    "demo-word-problems", _split_problems,
    # the answer in GSM8K's layout, worked solution then `#### N` (pipeline/data/clean.py reads it as GSM8K's)
    lambda p: {"question": p["question"], "answer": f"{p['solution']}\n#### {p['answer']}"},
    lambda rng, p: [{"role": "assistant", "content": format_completion(p["solution"], p["answer"])}],
    example_question=("Lena works 6 hours and earns 21 dollars an hour. Lena then spends 75 dollars on a game. "
                      "How many dollars does Lena have left?"),
    code_files=(Path(__file__).resolve(), TASK_FILE))
