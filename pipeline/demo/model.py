"""The built-in tiny models (`tiny-demo`, `tiny-qwen2.5`, ...): random Qwen2s from a fixed seed with a byte-level
ChatML tokenizer, saved once into the cache (`demo_model_dir`): the same weights every time, so an adapter trained on
one applies again later, in a real folder (TRL reloads the reference model from `config._name_or_path`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional

from grpo_pipeline.env.paths import atomic_write_json, publish_once
from grpo_pipeline.env.locations import cache_root
from grpo_pipeline.env.kept import file_sha256, read_record, record, state_key
from grpo_pipeline.pipeline.assets import QWEN_TOKENIZER_SRC, load_qwen_tokenizer  # QWEN_TOKENIZER_SRC: the files, as shipped

# Part of the folders' key (`build_inputs`, with this file's code): bump it to mark a change by name.
DEMO_VERSION = "2"
BUILD_NAME = "grpo_build.json"  # the build's kept record (env/kept.py) inside each folder
DEMO_SEED = 1234

# Qwen2.5's ChatML specials, after the regular tokens as in Qwen2.5 (there they are 151643-151645).
PAD_TOKEN, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

# Qwen2.5's ChatML template without tool calls and without the "You are Qwen..." default system message.
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

# The tiny architecture (107k parameters with the demo vocabulary; 9.8M with Qwen2.5's 151,936, tied).
TINY_QWEN2_ARCH: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=512,
    # Untied, unlike Qwen2.5 up to 3B: the demo's LoRA trains the input embeddings in full (`lora_modules_to_save`),
    # a copy that would part from a tied frozen lm_head, so a merged export (re-tied on load) would be another model.
    tie_word_embeddings=False,
)
# Initial weight of the final RMSNorm (Qwen2 starts it at 1). At 1 no logit can exceed ~1.3 (a hidden state of
# length ~8 . lm_head rows of std 0.02): temperature-1 samples are near-uniform noise, which a LoRA (lm_head frozen)
# cannot change, and GRPO learns only from what it samples. The final norm touches nothing but the logits.
FINAL_NORM_WEIGHT = 10.0
QWEN_VOCAB_SIZE = 151936  # Qwen2.5 checkpoints pad the 151,665-token vocabulary to this
# `tiny-demo-vllm`: the demo model with heads 64 wide, as Qwen2.5-0.5B's: vLLM's CPU attention refuses the demo's 16
# (vllm/v1/attention/backends/cpu_attn.py get_supported_head_sizes).
VLLM_CPU_ARCH: dict[str, Any] = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                     intermediate_size=256)
# `tiny-demo-tools`: the demo model with Qwen2.5's own chat template (so TRL parses its tool calls), its fixed tool
# text as whole tokens: one token per byte made it ~600 tokens of every prompt; so ~270, a step ~3x cheaper.
TOOLS_POSITIONS = 1024
TOOL_TEXT_TOKENS = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>",
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>",
    '{"type": "function", "function": {"name": "', '", "description": "',
    '", "parameters": {"type": "object", "properties": {"', '": {"type": "integer", "description": "',
    '": {"type": "string", "description": "', '": {"type": "number", "description": "', '"}}, "required": ["',
    '"]}, "return": {"type": "', '"}}}',
    # and the call's and the result's fixed text, so the numbers a call copies sit a few tokens from their source
    '<tool_call>\n{"name": "', '", "arguments": {"', '}}\n</tool_call>', "<tool_response>\n", "\n</tool_response>",
)
# Each built-in tiny model: what it changes of the demo model's arguments to `build_tiny_qwen2` (`demo_model_dir`).
DEMO_VARIANTS: dict[str, dict[str, Any]] = {
    "tiny-demo": {},
    "tiny-demo-vllm": VLLM_CPU_ARCH,
    "tiny-demo-tools": dict(max_position_embeddings=TOOLS_POSITIONS),
    # tied as Qwen2.5-0.5B/1.5B/3B (and half the parameters of an untied head)
    "tiny-qwen2.5": dict(vocab_size=QWEN_VOCAB_SIZE, final_norm_weight=1.0, max_position_embeddings=32768,
                         tie_word_embeddings=True),
}


def build_demo_tokenizer(chat_template: str = DEMO_CHAT_TEMPLATE, model_max_length: Optional[int] = None):
    """A ChatML tokenizer of one token per byte: Qwen2.5's `Qwen2Tokenizer` (byte-level BPE) without merges. Not a
    WordLevel vocabulary: transformers 5 reloads a `model_type: qwen2` folder's as `Qwen2Tokenizer`, dropping spaces.

    >>> tok = build_demo_tokenizer()
    >>> tok.convert_ids_to_tokens(tok.encode("3+4 =\\n7"))  # Ġ is a space and Ċ a newline, as in Qwen2.5
    ['3', '+', '4', 'Ġ', '=', 'Ċ', '7']
    >>> tok.decode(tok.encode("Ünïcode 你好")) == "Ünïcode 你好"
    True
    >>> tok.eos_token, tok.pad_token, tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    ('<|im_end|>', '<|endoftext|>', [256, 257, 258])
    """
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # lazy: transformers imports torch
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    byte_symbols = bytes_to_unicode()  # byte value -> the printable character that stands for it
    vocab = {byte_symbols[b]: b for b in range(256)}
    for token in (PAD_TOKEN, IM_START, IM_END):
        vocab[token] = len(vocab)
    return Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        eos_token=IM_END,  # generation stops at the end of the assistant turn, as with Qwen2.5-Instruct
        pad_token=PAD_TOKEN,
        unk_token=None,  # every byte has a token: nothing is unknown
        extra_special_tokens=[IM_START],
        chat_template=chat_template,
        padding_side="left",  # GRPO generates from left-padded prompt batches
        model_max_length=model_max_length or TINY_QWEN2_ARCH["max_position_embeddings"],
    )


def build_tools_tokenizer():
    """`tiny-demo-tools`' tokenizer: the demo's, with Qwen2.5's chat template and `TOOL_TEXT_TOKENS`.

    >>> from grpo_pipeline.pipeline.demo.calculator import calculator
    >>> tok = build_tools_tokenizer()
    >>> text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[calculator], tokenize=False)
    >>> len(text), len(tok.encode(text)), tok.decode(tok.encode(text)) == text
    (926, 228, True)
    """
    tokenizer = build_demo_tokenizer(load_qwen_tokenizer().chat_template, TOOLS_POSITIONS)
    tokenizer.add_tokens(list(TOOL_TEXT_TOKENS))
    return tokenizer


def build_tiny_qwen2(vocab_size: int, seed: int = 0, final_norm_weight: float = 1.0, **overrides: Any):
    """A random tiny `Qwen2ForCausalLM`, the same for the same `seed` (the global torch RNG left as it was);
    `overrides`: `Qwen2Config` fields over `TINY_QWEN2_ARCH`.

    >>> a, b = build_tiny_qwen2(60, seed=1), build_tiny_qwen2(60, seed=1)
    >>> all((a.state_dict()[k] == v).all() for k, v in b.state_dict().items())
    True
    """
    import torch  # lazy, as every torch import of this module
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=vocab_size, **{**TINY_QWEN2_ARCH, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():
            model.model.norm.weight.fill_(final_norm_weight)
    return model.to(torch.float32)


def build_inputs(name: str) -> dict[str, Any]:
    """What a built-in model's folder depends on; not the torch/transformers versions, so an adapter trained on it
    keeps applying after an upgrade."""
    inputs: dict[str, Any] = {"name": name, "version": DEMO_VERSION, "code_sha256": file_sha256(Path(__file__))}
    if name in ("tiny-qwen2.5", "tiny-demo-tools"):  # their chat template is the bundled tokenizer's
        inputs["tokenizer_files"] = {p.name: file_sha256(p) for p in sorted(QWEN_TOKENIZER_SRC.iterdir())
                                     if p.is_file()}
    return inputs


def built_dir(name: str, cache_dir: Optional[os.PathLike | str] = None) -> Path:
    """Where the built-in model `name` is kept: `<cache>/<name>-<DEMO_VERSION>-<key>` (`build_inputs`' key)."""
    return Path(cache_dir or cache_root()) / f"{name}-{DEMO_VERSION}-{state_key(build_inputs(name))[:12]}"


def is_built(folder: Path, inputs: dict[str, Any], needs: tuple[str, ...] = ("config.json",)) -> bool:
    """Whether `folder` holds the files it `needs` and a build record (`BUILD_NAME`) of `inputs`' key."""
    saved = read_record(folder / BUILD_NAME)
    return all((folder / name).is_file() for name in needs) and saved is not None and saved.get(
        "key") == state_key(inputs)


def build_once(final: Path, inputs: dict[str, Any], build: Callable[[Path], Optional[dict[str, Any]]],
               needs: tuple[str, ...] = ("config.json",)) -> Path:
    """`final`, built once by `build(staging)` (returning what the build record adds) and reused while `is_built`."""

    def write(tmp: Path) -> None:
        atomic_write_json(tmp / BUILD_NAME, record(inputs, **(build(tmp) or {})))

    return publish_once(final, write, lambda folder: is_built(folder, inputs, needs))


def demo_model_dir(cache_dir: Optional[os.PathLike | str] = None, name: str = "tiny-demo") -> Path:
    """The built-in tiny model `name` (`DEMO_VARIANTS`) and its tokenizer, saved once into `built_dir`.

    >>> from transformers import AutoModelForCausalLM, AutoTokenizer
    >>> path = demo_model_dir()
    >>> AutoModelForCausalLM.from_pretrained(path).config.vocab_size == len(AutoTokenizer.from_pretrained(path))
    True
    """

    def write(tmp: Path) -> None:
        from safetensors.torch import save_model  # lazy: imports torch

        tokenizer = {"tiny-demo-tools": build_tools_tokenizer, "tiny-qwen2.5": load_qwen_tokenizer}.get(
            name, build_demo_tokenizer)()
        model = build_tiny_qwen2(**{"vocab_size": len(tokenizer), "seed": DEMO_SEED,
                                    "final_norm_weight": FINAL_NORM_WEIGHT, "eos_token_id": tokenizer.eos_token_id,
                                    "pad_token_id": tokenizer.pad_token_id, "bos_token_id": None,
                                    **DEMO_VARIANTS[name]})
        # not save_pretrained: under torch.distributed it saves only on rank 0 (should_save_on_this_rank)
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)

    return build_once(built_dir(name, cache_dir), build_inputs(name), write)
