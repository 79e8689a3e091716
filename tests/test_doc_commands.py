"""Every command of every ```bash block of README.md, README.zh-CN.md and docs/*.md does what the doc says when pasted.

- The shell's own reading first: a double-quoted argument with a `$` in it is expanded by bash (`"costs $3"` pastes
  as "costs "), so a doc never writes one for `grpo`, and never a positional `$1`..`$9` anywhere.
- `grpo plan` runs as written (in-process, ~1 s each, in a folder holding the docs' example files): it answers 0 (fits)
  or 1 (does not fit), never 2 (the doc's own example refused).
- Every other `grpo` command (and `python -m grpo_pipeline.pipeline` / `accelerate launch ... -m grpo_pipeline.pipeline`) is parsed by its own
  command: `grpo train`'s options by the recipe parser (a recipe it names must exist), the other commands' by their
  argparse parsers, stopped right after parsing.
- `python bench/X.py` / `python scripts/X.py`: the script exists and takes every option the doc gives it (its --help).
- Anything else must be a program the docs use on purpose (pip, git, trl, ...), so a new kind of command is seen.
- The `[grpo] ...` lines a doc shows as a command's output are lines the code can still print: each matches one of
  the format strings in pipeline/ and env/ (their constant parts, each `{...}` standing for any text).
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from types import MappingProxyType

import pytest

from cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "README.zh-CN.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
# Programs the docs run that are not ours: each one's command is shown as the tool's own documentation says
OTHER_PROGRAMS = {"pip", "export", "source", "cd", "git", "trl", "srun", "set", "tee", "tail", "exit", "head",
                  "scontrol", "/usr/bin/time", "mutmut", "VAR=value",
                  "lint-imports", "ruff"}
OTHER_MODULES = {"pytest", "verl.trainer.main_ppo"}  # `python -m X` of another project


def logical_lines(block: str) -> list[str]:
    """The block's command lines: continuation lines joined, comment-only lines left out."""
    lines, current = [], ""
    for line in block.splitlines():
        current += line[:-1] + " " if line.rstrip().endswith("\\") else line
        if line.rstrip().endswith("\\"):
            continue
        if current.strip() and not current.strip().startswith("#"):
            lines.append(current.strip())
        current = ""
    return lines


def simple_commands(line: str) -> list[list[str]]:
    """A line split as bash splits it into simple commands (on ;, &&, ||, |), each as its words; a comment ends it."""
    line = re.sub(r"\s\d*>&\d+", " ", line)  # 2>&1: a redirection, not a `&`
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, "#"
    commands, words = [], []
    for token in lexer:
        if token and set(token) <= set(";&|"):
            commands.append(words)
            words = []
        elif token not in ("{", "}"):  # a group's braces: its commands are read on
            words.append(token)
    return [c for c in [*commands, words] if c]


def doc_commands() -> list[tuple[str, str, list[str]]]:
    """(doc, the line as written, one simple command's words) for every command of every bash block."""
    found = []
    for doc in DOCS:
        for block in BLOCK.findall(doc.read_text(encoding="utf-8")):
            for line in logical_lines(block):
                if line.startswith("#SBATCH") or line.startswith("#!"):
                    continue
                for words in simple_commands(line):
                    found.append((doc.relative_to(ROOT).as_posix(), line, words))
    return found


COMMANDS = doc_commands()


def program(words: list[str]) -> tuple[str, list[str]]:
    """What a simple command runs: ("grpo", argv after it), ("script", [path, *args]), ("module", [name]) or
    ("other", [name]). Leading VAR=value assignments, `nice`, `/usr/bin/time -f FMT` and `bash -c '...'` are read
    through, as bash reads them."""
    words = list(words)
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
        words.pop(0)
    if not words:
        return ("other", ["VAR=value"])  # an assignment alone
    if words[:1] == ["nice"]:
        words.pop(0)
    if words[:1] == ["/usr/bin/time"]:
        words = words[3:] if words[1:2] == ["-f"] else words[1:]
    if words[:2] == ["bash", "-c"]:
        return ("bash -c", [words[2]])
    if words[:1] == ["grpo"]:
        return ("grpo", words[1:])
    if words[:2] == ["accelerate", "launch"]:
        at = words.index("-m")
        assert words[at + 1] == "grpo_pipeline.pipeline", words
        return ("grpo", words[at + 2:])
    if words and re.fullmatch(r"python3?", words[0]):
        if words[1] == "-m":
            return ("grpo", words[3:]) if words[2] == "grpo_pipeline.pipeline" else ("module", [words[2]])
        if words[1] == "-c":
            return ("python -c", [words[2]])
        return ("script", words[1:])
    return ("other", words[:1])


def test_the_docs_have_commands_and_the_splitting_reads_them_as_bash_does():
    assert len(COMMANDS) >= 60
    assert simple_commands("a 'x; y' && b \"z # w\" | c # note") == [["a", "x; y"], ["b", "z # w"], ["c"]]
    assert program(["CUDA_VISIBLE_DEVICES=0", "accelerate", "launch", "--num_processes", "3", "-m", "grpo_pipeline.pipeline",
                    "train", "--backend", "plain"]) == ("grpo", ["train", "--backend", "plain"])
    assert bad_quoting('grpo generate --prompt "A pen costs $3."')  # what the README once had
    assert not bad_quoting("grpo generate --prompt 'A pen costs $3.'")


def bad_quoting(line: str) -> list[str]:
    """The double-quoted texts of `line` that bash would expand against the doc's meaning: any `$` in a grpo
    command's argument, a positional or special parameter ($1, $#, ...) anywhere."""
    shown = []
    for quoted in re.findall(r'"((?:[^"\\]|\\.)*)"', re.sub(r"'[^']*'", "''", line)):
        if re.search(r"\$[0-9#?!@*-]", quoted) or ("$" in quoted and re.match(r"\s*grpo\b", line)):
            shown.append(quoted)
    return shown


@pytest.mark.parametrize("doc,line", sorted({(d, line) for d, line, _ in COMMANDS}))
def test_no_doc_line_has_text_that_bash_expands(doc, line):
    assert not bad_quoting(line), f"{doc}: {line}: single-quote it ('...'), as bash pastes \"$3\" as empty"


@functools.lru_cache(maxsize=1)
def example_files() -> MappingProxyType:
    """The files the docs write out for their examples (`my.yaml`, `agent.yaml`, `calc_tools.py`, ...): a block
    whose intro line names the file, or whose first line is `# name.yaml`. Read once (a quarter second a read, and
    every grpo command's folder needs them); read-only, as it is shared."""
    files = {}
    fence = re.compile(r"(?P<intro>[^\n]*)\n\n```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)
    for doc in DOCS:
        for block in fence.finditer(doc.read_text(encoding="utf-8")):
            intro = block["intro"].strip()
            named = re.search(r"`(?P<name>[\w.-]+\.(?:yaml|jsonl|py|json))`", intro) if intro.endswith((":", "：")) \
                else None
            first = re.match(r"^# (?P<name>[\w.-]+\.yaml)\n", block["body"])
            for match in (named, first):
                if match and match["name"] not in files:
                    files[match["name"]] = block["body"]
    return MappingProxyType(files)


@pytest.fixture
def doc_folder(tmp_path, monkeypatch):
    """A folder as a reader has after following the docs: their example files, and this checkout's configs/."""
    for name, body in example_files().items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def grpo_commands() -> list[tuple[str, list[str]]]:
    """("doc: line" of every place that writes it, joined; argv) for each distinct grpo argv of the
    docs: a command a twin (README.zh-CN.md, docs/*.zh-CN.md) or another page repeats word for word runs once, in
    the same folder, so it answers the same; a failure names every place it is written."""
    places: dict[tuple[str, ...], list[tuple[str, str]]] = {}
    for doc, line, words in COMMANDS:
        kind, argv = program(words)
        if kind == "grpo":
            places.setdefault(tuple(argv), []).append((doc, line))
    return [("; ".join(dict.fromkeys(f"{d}: {line}" for d, line in where)), list(argv))
            for argv, where in places.items()]


GRPO = grpo_commands()


def test_the_example_files_are_found():
    assert {"my.yaml", "my.jsonl", "my_rewards.py", "agent.yaml", "calc_tools.py", "trl.yaml"} <= set(example_files())


class Parsed(BaseException):
    """Raised by a command's parser once it has parsed: the command stops there (no model, no files)."""

    def __init__(self, result):
        self.result = result


def parse_only(main, argv: list[str]):
    """`main(argv)` stopped right after its own argparse parser parsed `argv`: the namespace (and the rest, for a
    parse_known_args)."""
    real_known = argparse.ArgumentParser.parse_known_args

    def known(self, args=None, namespace=None):
        result = real_known(self, args, namespace)
        if self.prog.startswith("grpo"):
            raise Parsed(result)
        return result

    with pytest.MonkeyPatch.context() as patch, pytest.raises(Parsed) as parsed:
        patch.setattr(argparse.ArgumentParser, "parse_known_args", known)
        main(argv)
    return parsed.value.result


def test_a_grpo_command_the_docs_repeat_is_run_once_naming_every_place():
    assert len({(d, line) for d, line, words in COMMANDS if program(words)[0] == "grpo"}) > len(GRPO)
    twins = [where for where, _ in GRPO if "README.zh-CN.md" in where and "README.md: " in where]
    assert twins and all(where.count(": grpo") >= 2 for where in twins)


@pytest.mark.parametrize("where,argv", GRPO, ids=[f"{w.split(':')[0]}:{' '.join(a)[:70]}" for w, a in GRPO])
def test_every_grpo_command_runs_or_is_parsed_by_its_own_command(where, argv, doc_folder, monkeypatch, capsys):
    from grpo_pipeline.pipeline.config import parse_config

    command, options = (argv[0], argv[1:]) if argv else ("train", [])
    if "--config" in options:
        recipe = options[options.index("--config") + 1]
        assert (doc_folder / recipe).is_file(), f"{where}: {recipe} is neither in the docs nor in the checkout"
    if command == "plan":
        if "--gpu" not in options and "--gpu_memory_gb" not in options:
            options = [*options, "--gpu", "T4"]  # "on a GPU machine: the visible card": a CPU machine names one
        code, out = run_cli(["plan", *options], capsys)
        assert code in (0, 1), f"{where}\n{out}"
        assert "Traceback" not in out
    elif command == "train":
        parse_config([o for o in options if o != "--check"])  # the recipe parser: every option known and typed
    elif command == "rewards":
        from grpo_pipeline.pipeline.infer import dry_run

        own, rest = parse_only(dry_run.main, options)
        parse_config([*rest, *(["--config", own.config] if own.config else [])])
    elif command in ("generate", "eval", "export", "plot"):
        import importlib

        from grpo_pipeline.pipeline.cli import COMMANDS as CLI

        parse_only(importlib.import_module(CLI[command][0]).main, options)
    else:
        assert command == "env" and not options, f"{where}: a command this test does not know yet"


SCRIPTS = sorted({(doc, line, tuple(program(words)[1])) for doc, line, words in COMMANDS
                  if program(words)[0] == "script"})


# The script tests share one xdist worker, so each `--help` runs once per test run (a bench script's is read by both).
SCRIPT_HELP = pytest.mark.xdist_group("doc-script-help")


@functools.lru_cache(maxsize=None)
def help_from_elsewhere(path: str) -> tuple[int, str, str, tuple[str, ...]]:
    """`python ROOT/PATH --help` run from an empty folder of its own with PYTHONPATH unset, as a reader elsewhere
    runs it: (exit code, stdout, stderr, the names it left in that folder)."""
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([sys.executable, str(ROOT / path), "--help"], cwd=folder, capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
        return done.returncode, done.stdout, done.stderr, tuple(sorted(os.listdir(folder)))


@functools.lru_cache(maxsize=None)
def script_help(path: str, sub: str = "") -> str:
    """`python PATH [SUB] --help`: the script's usage (its sub-command's, for a script with sub-commands). A bench
    script's own usage is the one it prints from any folder (`help_from_elsewhere`, which its test runs anyway)."""
    if path.startswith("bench/") and not sub:
        code, out, err, _ = help_from_elsewhere(path)
        assert code == 0, (path, err[-2000:])
        return out
    argv = [sys.executable, path, *([sub] if sub else []), "--help"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (path, done.stderr[-2000:])
    return done.stdout


@SCRIPT_HELP
@pytest.mark.parametrize("doc,line,words", SCRIPTS, ids=[f"{d}:{w[0]}" for d, _, w in SCRIPTS])
def test_every_script_a_doc_runs_exists_and_takes_its_options(doc, line, words):
    path, *args = words
    assert (ROOT / path).is_file(), f"{doc}: {line}: no {path}"
    usage = script_help(path)
    if args and not args[0].startswith("-") and re.search(r"\{[\w,-]*\b" + re.escape(args[0]) + r"\b", usage):
        usage = script_help(path, args[0])  # a sub-command: its own options
    for option in [a for a in args if a.startswith("--")]:
        assert option in usage, f"{doc}: {line}: {path} takes no {option}"


def test_every_other_command_is_a_program_the_docs_use_on_purpose():
    unknown = set()
    for doc, line, words in COMMANDS:
        kind, rest = program(words)
        if kind == "other" and rest[0] not in OTHER_PROGRAMS:
            unknown.add((doc, rest[0]))
        if kind == "module" and rest[0] not in OTHER_MODULES:
            unknown.add((doc, f"python -m {rest[0]}"))
        if kind == "bash -c":  # read inside, as srun runs it
            for inner in simple_commands(rest[0]):
                assert program(inner)[0] == "grpo", (doc, inner)
    assert not unknown, f"commands of unknown programs (run or parse them here): {sorted(unknown)}"


# --- the [grpo] lines the docs show ---------------------------------------------------------------------------------

SHOWN = re.compile(r"^\s*\[grpo\] (?P<text>.+)$", re.M)


@functools.lru_cache(maxsize=1)
def code_pieces() -> frozenset[str]:
    """The constant text the code prints from: every string constant and every constant part of an f-string in
    pipeline/, env/ and rewards/ that holds a word."""
    pieces = set()
    for tree in ("pipeline", "env", "rewards"):
        for path in (ROOT / tree).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for line in node.value.splitlines():
                        if re.search(r"[A-Za-z]{2}", line):
                            pieces.add(line)
    return frozenset(pieces)


def shown_lines() -> list[tuple[str, str]]:
    """(doc, text) of each `[grpo] ` line in a code block of the docs, a path abbreviated `.../` made whole."""
    lines = []
    for doc in DOCS:
        for block in re.findall(r"^```\w*\n(.*?)^```", doc.read_text(encoding="utf-8"), re.S | re.M):
            rows = block.splitlines()
            for i, row in enumerate(rows):
                match = SHOWN.match(row)
                if not match:
                    continue
                text = match["text"]
                last = row
                for more in rows[i + 1:]:  # a long line the doc wraps at ~119: its next lines
                    if len(last) < 100 or more.startswith(("[", " ", "#", "{")) or not more.strip():
                        break
                    text, last = text + " " + more, more
                lines.append((doc.relative_to(ROOT).as_posix(), text.replace(".../", "/abs/").strip()))
    return lines


SHOWN_LINES = shown_lines()


def test_the_docs_show_grpo_lines():
    assert len(SHOWN_LINES) >= 30


@pytest.mark.parametrize("doc,text", SHOWN_LINES, ids=[f"{d}:{t[:60]}" for d, t in SHOWN_LINES])
def test_every_grpo_line_a_doc_shows_is_one_the_code_can_print(doc, text):
    assert printed_by_code(text), f"{doc} shows `[grpo] {text}`, which no string in the code prints"


def printed_by_code(text: str) -> bool:
    """Whether every word of `text` is printed by the code's own constant text (a line is often built of several
    format strings: "eval before GRPO: " + the headline): each word lies inside an occurrence of one of the code's
    pieces, matched at word boundaries. Values (numbers, paths, quoted text) are left out."""
    values = r"'[^']*'|[^\s(]*/[^\s)]*|\b\w+\.\w+\b|\b\w*_\w*\b|\bSIG[A-Z]+\b|\b\d[\d.,%]*"
    raw = f"[grpo] {text}"
    masked = re.sub(values, lambda m: "\0" * len(m[0]), raw)
    covered = [False] * len(raw)
    for piece in code_pieces():
        start = raw.find(piece)
        while start >= 0:
            end = start + len(piece)
            if not (piece[0].isalpha() and start and raw[start - 1].isalpha()) and \
                    not (piece[-1].isalpha() and end < len(raw) and raw[end].isalpha()):
                covered[start:end] = [True] * len(piece)
            start = raw.find(piece, start + 1)
    return all(all(covered[m.start():m.end()]) for m in re.finditer(r"[A-Za-z]{2,}", masked))


def test_a_line_the_code_no_longer_prints_is_seen():
    assert printed_by_code("run completed") and printed_by_code("data: 4 rows in, 4 kept, 0 dropped")
    assert not printed_by_code("data: 4 rows read, 4 kept, 0 dropped")
    assert not printed_by_code("the run finished without trouble")


# --- every bench script starts as documented -------------------------------------------------------------------------

BENCH_SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py") if "__main__" in p.read_text(encoding="utf-8"))


@SCRIPT_HELP
@pytest.mark.parametrize("name", BENCH_SCRIPTS)
def test_every_bench_script_prints_its_usage_for_help_and_runs_nothing(name):
    """`python bench/X.py --help` from any folder: its usage, exit 0, nothing run (bench/faults.py once ran its whole table;
    agent_demo.py once failed on `bench/rewards.py` shadowing the rewards package)."""
    code, out, err, left = help_from_elsewhere(f"bench/{name}")
    assert code == 0, err[-2000:]
    assert "usage" in out.lower() and "Traceback" not in err
    assert not left  # nothing written: it printed its usage and stopped


def test_no_bench_module_shadows_a_package_of_ours():
    ours = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert not {p.stem for p in (ROOT / "bench").glob("*.py")} & ours
