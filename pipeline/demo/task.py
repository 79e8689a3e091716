"""The built-in CPU demo: a character-level ChatML tokenizer, a tiny deterministic Qwen2 and an arithmetic task.

`grpo train` on a machine without a GPU runs the whole pipeline on this demo in a few minutes:
SFT format warm-up -> eval before -> GRPO -> eval after. Nothing is downloaded. The pieces:

- `build_demo_tokenizer()`: one token per byte (259 in all), Qwen2.5's ChatML specials and a
  ChatML chat template, so every code path that renders prompts runs exactly as it does for Qwen2.5.
- `demo_model_dir()`: a random 107k-parameter `Qwen2ForCausalLM`, built from a fixed seed and saved
  once into the cache. Same weights every time, so an adapter trained on it applies again later, and
  it is a real folder (TRL reloads the reference model from `config._name_or_path` when beta > 0).
- `arithmetic_problems()`: 2-digit additions without carries ("What is 27+52?" -> "79"), split into
  disjoint train/test sets by a hash of the question.
- `sft_examples()`: the warm-up data. Its teacher is deliberately sloppy (see `SLOPPY_ANSWER_RATE`),
  which leaves the warmed-up model with a habit GRPO's correctness reward can visibly fix.
- `DEMO_CONFIG`: the config overrides for the CPU run.

`build_tiny_qwen2()` / `tiny_qwen_model_dir()` give the same tiny architecture with the real
Qwen2.5 vocabulary, for tests that need the real tokenizer but no real model.

torch/transformers are imported inside functions: the CLI imports this module for `DEMO_CONFIG`.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from env.paths import cache_root, publish_once
from pipeline.data.prompts import build_prompt
from rewards.format import format_completion

# Bump when the tokenizer, the architecture or the seed changes: the cached folder is keyed by it,
# so a stale model is never reused (and an adapter trained on version N never meets version N+1).
DEMO_VERSION = "2"
DEMO_SEED = 1234

# Qwen2.5's ChatML specials, after the regular tokens as in Qwen2.5 (there they are 151643-151645).
PAD_TOKEN, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

# Qwen2.5's ChatML template without tool calls and without the "You are Qwen..." default system
# message (the demo always sends its own; a tiny model has no use for the tool-call branches).
DEMO_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Short on purpose: every prompt carries it, and a 2-layer model learns faster from short prompts.
DEMO_SYSTEM_PROMPT = "Answer in <reasoning> and <answer> tags."

# The tiny architecture (107k parameters with the demo vocabulary; 9.8M with Qwen2.5's 151,936, tied).
TINY_QWEN2_ARCH: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=512,
    # Untied, unlike Qwen2.5 up to 3B: the demo's LoRA trains the (random, useless) input embeddings in
    # full (`lora_modules_to_save`), and with a tied head that copy would silently part from the frozen
    # lm_head, so a merged export (which re-ties on load) would not be the model that was trained.
    tie_word_embeddings=False,
)
# Initial weight of the final RMSNorm (Qwen2 starts it at 1). The logits are (final hidden state,
# RMS-normalised to length ~sqrt(64) = 8, times this weight) . (lm_head row, std 0.02): at weight 1 no
# logit can exceed ~1.3, so temperature-1 samples are near-uniform noise over 259 tokens, and a LoRA,
# which freezes lm_head, cannot change that. GRPO learns only from what it samples. The final norm
# touches nothing but the logits, so raising it scales them without disturbing anything else (a larger
# lm_head std would do the same; a larger embedding std would drown the layers' residual updates).
FINAL_NORM_WEIGHT = 10.0
QWEN_VOCAB_SIZE = 151936  # Qwen2.5 checkpoints pad the 151,665-token vocabulary to this

# The task: additions of two 2-digit numbers without carries ("What is 27+52?" -> "79"): each digit
# of the sum is the sum of the two digits above it. 36 tens pairs x 55 ones pairs = 1,980 problems,
# 100 of them held out. A held-out problem is a new combination of digit sums the train split shows
# many times, which a 2-layer model learns within ~1,000 small SFT steps (after GRPO it gets 96-100% of
# the held-out sums right; 300-400 steps were too few). Carries would need far longer, and single-digit
# sums (100 problems) leave too few to hold out.
TEST_SIZE = 100
EXAMPLE_QUESTION = "What is 27+52?"  # a held-out problem, for the "next: grpo generate ..." hint

# Share of warm-up examples whose <answer> repeats the first operand instead of the result
# (the reasoning line is always right). Above 1/2 on purpose: greedy decoding then mostly copies the
# wrong number, while sampling still gives the right one often enough for GRPO to find and reward it.
# GRPO then has one clear, general habit to unlearn, which it mostly does within 50 steps.
SLOPPY_ANSWER_RATE = 0.6


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------


def build_demo_tokenizer():
    """A character-level ChatML tokenizer: one token per byte (so per ASCII character), no merges.

    It is Qwen2.5's own tokenizer design (byte-level BPE, transformers' `Qwen2Tokenizer` on the
    `tokenizers` library) with the merges left out: 256 byte tokens, then `<|endoftext|>` (pad),
    `<|im_start|>` and `<|im_end|>` (eos), and a ChatML chat template.

    Why bytes and not a ~50-character WordLevel vocabulary: transformers 5 loads every folder whose
    config says `model_type: qwen2` as `Qwen2Tokenizer`, which rebuilds the byte-level pipeline from
    the saved vocabulary. A WordLevel tokenizer saved next to the model came back silently dropping
    every space and newline. Built this way, the reloaded tokenizer is the same tokenizer. And with
    all 256 bytes in the vocabulary no character is unknown: any text round-trips.

    >>> tok = build_demo_tokenizer()
    >>> tok.convert_ids_to_tokens(tok.encode("3+4 =\\n7"))  # Ġ is a space and Ċ a newline, as in Qwen2.5
    ['3', '+', '4', 'Ġ', '=', 'Ċ', '7']
    >>> tok.decode(tok.encode("Ünïcode 你好")) == "Ünïcode 你好"
    True
    >>> tok.eos_token, tok.pad_token, tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    ('<|im_end|>', '<|endoftext|>', [256, 257, 258])
    """
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    byte_symbols = bytes_to_unicode()  # byte value -> the printable character that stands for it
    vocab = {byte_symbols[b]: b for b in range(256)}
    for token in SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    return Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        eos_token=IM_END,  # generation stops at the end of the assistant turn, as with Qwen2.5-Instruct
        pad_token=PAD_TOKEN,
        unk_token=None,  # every byte has a token: nothing is unknown
        extra_special_tokens=[IM_START],
        chat_template=DEMO_CHAT_TEMPLATE,
        padding_side="left",  # GRPO generates from left-padded prompt batches
        model_max_length=TINY_QWEN2_ARCH["max_position_embeddings"],
    )


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def build_tiny_qwen2(vocab_size: int, seed: int = 0, final_norm_weight: float = 1.0, **overrides: Any):
    """A randomly initialised tiny `Qwen2ForCausalLM`; the same `seed` gives the same weights.

    `final_norm_weight` is the initial weight of the last RMSNorm (see `FINAL_NORM_WEIGHT`);
    `overrides` replace fields of `TINY_QWEN2_ARCH` or set other `Qwen2Config` fields
    (e.g. `eos_token_id`). The global torch RNG is left as it was.

    >>> a, b = build_tiny_qwen2(60, seed=1), build_tiny_qwen2(60, seed=1)
    >>> all((a.state_dict()[k] == v).all() for k, v in b.state_dict().items())
    True
    >>> build_tiny_qwen2(60, num_hidden_layers=1).config.num_hidden_layers
    1
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=vocab_size, **{**TINY_QWEN2_ARCH, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():
            model.model.norm.weight.fill_(final_norm_weight)
    return model.to(torch.float32)


def _is_saved_model(folder: Path) -> bool:
    return (folder / "config.json").is_file()  # save_pretrained writes it; publish_once moves whole folders


def demo_model_dir(cache_dir: Optional[os.PathLike | str] = None) -> Path:
    """The tiny demo model + its tokenizer, saved once (atomically) and loadable with `from_pretrained`.

    The folder is `<cache>/tiny-demo-<DEMO_VERSION>`; `cache_dir` defaults to `cache_root()`.

    >>> from transformers import AutoModelForCausalLM, AutoTokenizer
    >>> path = demo_model_dir()
    >>> AutoModelForCausalLM.from_pretrained(path).config.vocab_size == len(AutoTokenizer.from_pretrained(path))
    True
    """
    final = Path(cache_dir or cache_root()) / f"tiny-demo-{DEMO_VERSION}"

    def write(tmp: Path) -> None:
        tokenizer = build_demo_tokenizer()
        model = build_tiny_qwen2(
            len(tokenizer),
            seed=DEMO_SEED,
            final_norm_weight=FINAL_NORM_WEIGHT,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=None,
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return publish_once(final, write, is_complete=_is_saved_model)


def tiny_qwen_model_dir(cache_dir: Optional[os.PathLike | str] = None) -> Path:
    """A tiny random Qwen2 with the real Qwen2.5 vocabulary and the bundled Qwen2.5 tokenizer, saved once.

    For tests of code that must see the real tokenizer and chat template (9.8M parameters,
    about 2 s per GRPO step on CPU; it learns nothing useful).
    """
    final = Path(cache_dir or cache_root()) / f"tiny-qwen2.5-{DEMO_VERSION}"

    def write(tmp: Path) -> None:
        from pipeline.assets import load_qwen_tokenizer

        tokenizer = load_qwen_tokenizer()
        model = build_tiny_qwen2(
            QWEN_VOCAB_SIZE,
            seed=DEMO_SEED,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=None,
            max_position_embeddings=32768,
            tie_word_embeddings=True,  # as Qwen2.5-0.5B/1.5B/3B (and half the parameters of an untied head)
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return publish_once(final, write, is_complete=_is_saved_model)


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------


def _question_hash(question: str) -> str:
    return hashlib.sha256(question.encode("utf-8")).hexdigest()


def _all_problems() -> list[dict[str, str]]:
    problems = []
    for tens_a in range(1, 10):
        for tens_b in range(1, 10 - tens_a):
            for ones_a in range(10):
                for ones_b in range(10 - ones_a):
                    a, b = 10 * tens_a + ones_a, 10 * tens_b + ones_b
                    problems.append({"question": f"What is {a}+{b}?", "answer": str(a + b),
                                     "solution": f"{a}+{b}={a + b}", "first_operand": str(a)})
    return problems


def _split_problems(split: str) -> list[dict[str, str]]:
    """The problems of one split, in a fixed order.

    The test split takes problems in order of the sha256 of their question, skipping any whose
    answer would then be missing from the train split (only 80+19 makes 99): a held-out problem
    asks for a new combination, never for a number the model has never written. So the split never
    depends on seed, n or order, and its size is exactly TEST_SIZE.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    by_hash = sorted(_all_problems(), key=lambda p: _question_hash(p["question"]))
    left_in_train = Counter(p["answer"] for p in by_hash)
    test_questions = set()
    for problem in by_hash:
        if len(test_questions) == TEST_SIZE:
            break
        if left_in_train[problem["answer"]] > 1:
            left_in_train[problem["answer"]] -= 1
            test_questions.add(problem["question"])
    return [p for p in by_hash if (p["question"] in test_questions) == (split == "test")]


def arithmetic_split_size(split: str) -> int:
    """How many distinct problems a split holds.

    >>> arithmetic_split_size("train"), arithmetic_split_size("test")
    (1880, 100)
    """
    return len(_split_problems(split))


def arithmetic_problems(n: int, seed: int = 0, split: str = "train") -> list[dict[str, str]]:
    """`n` distinct problems of a split, in an order fixed by `seed`.

    Each is `{"question": "What is 27+52?", "answer": "79", "solution": "27+52=79"}`; `solution` is the
    worked line that goes between the <reasoning> tags. Train and test never share a question.
    Raises ValueError when `n` exceeds the split (see `arithmetic_split_size`).

    >>> arithmetic_problems(1, seed=0, split="test")
    [{'question': 'What is 27+52?', 'answer': '79', 'solution': '27+52=79'}]
    >>> {p["question"] for p in arithmetic_problems(10, split="test")} & {
    ...     p["question"] for p in arithmetic_problems(10, split="train")}
    set()
    """
    pool = _split_problems(split)
    if not 0 <= n <= len(pool):
        raise ValueError(f"demo-arithmetic has {len(pool)} distinct {split!r} problems, {n} were asked for; "
                         f"set max_samples (train) or eval_limit (test) to at most {len(pool)}.")
    random.Random(seed).shuffle(pool)
    return [{k: p[k] for k in ("question", "answer", "solution")} for p in pool[:n]]


def sft_examples(n: int, seed: int = 0, system_prompt: str = DEMO_SYSTEM_PROMPT) -> list[dict[str, Any]]:
    """`n` warm-up examples in TRL's conversational prompt-completion format, from the train split.

    The reasoning line is always right; the <answer> repeats the first operand instead of the
    result in about `SLOPPY_ANSWER_RATE` of them (a sloppy teacher). The warm-up thus teaches the
    format, the addition table, and a bad habit that GRPO's correctness reward then removes.
    Problems repeat when `n` exceeds the train split; each copy draws its own slip.

    >>> ex = sft_examples(1, seed=0)[0]
    >>> [m["role"] for m in ex["prompt"]], ex["completion"][0]["role"]
    (['system', 'user'], 'assistant')
    >>> ex["completion"][0]["content"].startswith("<reasoning>\\n")
    True
    """
    rng = random.Random(seed)
    pool = _split_problems("train")
    examples = []
    for _ in range(n):
        problem = rng.choice(pool)
        answer = problem["first_operand"] if rng.random() < SLOPPY_ANSWER_RATE else problem["answer"]
        completion = format_completion(problem["solution"], answer)
        examples.append({
            "prompt": build_prompt(system_prompt, problem["question"]),
            "completion": [{"role": "assistant", "content": completion}],
        })
    return examples


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------

# Flat overrides for the CPU demo run (keys are PipelineConfig fields), tuned on a 2-core CPU: the
# SFT warm-up (~75 s), eval before, GRPO (~160 s) and eval after take about 4 minutes; held-out accuracy
# went from 24% to 100% (README, "What grpo train prints on a CPU").
DEMO_CONFIG: dict[str, Any] = {
    "model_name_or_path": "tiny-demo",
    "backend": "plain",
    "dataset_name": "demo-arithmetic",
    "system_prompt": DEMO_SYSTEM_PROMPT,
    "output_dir": "outputs/cpu-demo",
    # ~85 prompt tokens; the completion is 56 characters + <|im_end|>.
    "max_seq_length": 192,
    "max_completion_length": "64",
    # LoRA as on a GPU, rank 64 (full rank for 64-wide matrices). A random model's embeddings and
    # norms are useless, so they are trained in full beside it; a pretrained model needs neither.
    "lora_r": 64,
    "lora_alpha": 64,
    "lora_modules_to_save": ["norm", "embed_tokens"],
    # Format warm-up: teaches the tags, the digit sums and the sloppy teacher's habit (sft_examples).
    "sft_warmup_steps": 1000,
    "sft_learning_rate": 3e-3,
    # GRPO: 4 prompts x 8 completions per step, the rest as the GPU recipes (beta 0, cosine schedule,
    # max_grad_norm 0.1). After the warm-up the format rewards barely vary, so within a group it is the
    # correctness reward that separates completions. Held-out accuracy saturates after ~150 steps.
    "num_generations": 8,
    "per_device_train_batch_size": 32,
    "max_steps": 200,
    "learning_rate": 2e-4,  # tuned on this model (the GPU recipes use 5e-6 for a 1.5B LoRA)
    # min_p 0.1, as in Unsloth's GRPO notebooks: each rollout token must have at least 1/10 of the top
    # token's probability. Both answers the sloppy teacher taught stay in play; the byte-level tail does
    # not (plain temperature-1 sampling put a stray high byte, shown as U+FFFD, in ~1 of 5 completions,
    # and the garbled-output monitor rightly stopped the run on it).
    "min_p": 0.1,
    "optim": "adamw_torch",
    "save_steps": 50,
    "eval_before": True,
    "eval_after": True,
    "eval_split": "test",
    "eval_limit": TEST_SIZE,
}
