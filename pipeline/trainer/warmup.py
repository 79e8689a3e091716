"""Optional SFT format warm-up before GRPO (`sft_warmup_steps > 0`), as the Qwen3 GRPO notebook does.

If no completion contains `<answer>...</answer>`, every reward is 0 and GRPO learns nothing; a few supervised steps
fix that. The warmed weights are kept in `output_dir/warmup/` (with `warmup.json`), so a resumed run starts from the
same model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from grpo_pipeline.env.disk import storage_errors_named
from grpo_pipeline.env.kept import file_sha256, record, reusable, versions
from grpo_pipeline.env.paths import atomic_directory, atomic_write_json
from grpo_pipeline.pipeline.backends import mixed_precision, on_cpu
from grpo_pipeline.pipeline.config import PipelineConfig, role_values
from grpo_pipeline.pipeline.data.cache import model_identity
from grpo_pipeline.pipeline.trainer.agent_check import tool_schema

WARMUP_DIR = "warmup"
WARMUP_KEY_NAME = "warmup.json"


def warmup_inputs(cfg: PipelineConfig, prepared) -> dict[str, Any]:
    """Everything the warmed weights depend on (env/kept.py): the fields declaring warmup_input, the training data's
    key, this module's code (its SFTConfig) and the library versions."""
    inputs = role_values(cfg, "warmup_input")
    return {**inputs, "model": model_identity(**inputs["model"]), "data_fingerprint": prepared.fingerprint,
            "code_sha256": file_sha256(Path(__file__)), "versions": versions("torch", "transformers", "peft", "trl")}


def with_tools(tools: Sequence[Any], examples: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """The examples with the run's `tools`' JSON schemas attached (TRL's `tools` column), and whether any is a tool
    conversation (more than one message in its completion). Without tools, the examples as they are and False."""
    if not tools:
        return examples, False
    schemas = json.dumps([tool_schema(tool, "tools", getattr(tool, "__name__", "?")) for tool in tools])
    conversations = any(isinstance(e["completion"], list) and len(e["completion"]) > 1 for e in examples)
    return [{**example, "tools": schemas} for example in examples], conversations


def _load_warmup(model, peft_config, folder: Path) -> Optional[Any]:
    """`model` with the saved warm-up weights, wrapped as the SFTTrainer had wrapped it; None if they do not fit."""
    # lazy: peft and safetensors import torch
    from peft import PeftModel, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    if peft_config is not None:
        model = get_peft_model(model, peft_config)  # what SFTTrainer(peft_config=...) does before training
    if isinstance(model, PeftModel):
        weights = folder / "adapter_model.safetensors"
        if not weights.is_file():
            return None
        result = set_peft_model_state_dict(model, load_file(str(weights)))
        return model if not result.unexpected_keys else None
    weights = folder / "model.safetensors"
    if not weights.is_file():
        return None
    missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
    # save_pretrained drops a tied lm_head (it is the embedding); anything else missing means a mismatch.
    tied = getattr(model.config, "tie_word_embeddings", False)
    if unexpected or any(not (tied and name.startswith("lm_head")) for name in missing):
        return None
    return model


def _saved_warmup(output_dir: Path, inputs: dict[str, Any]) -> Optional[Path]:
    folder = output_dir / WARMUP_DIR
    saved = reusable(folder / WARMUP_KEY_NAME, inputs, "format warm-up", log=lambda m: print(f"[grpo] {m}"))
    return folder if saved is not None else None


def run_format_warmup(model, tokenizer, cfg: PipelineConfig, prepared, examples: list[dict[str, Any]],
                      tools: Sequence[Any], peft_config, output_dir: Path, reuse: bool = True):
    """A short SFTTrainer pass on `examples` with the run's `tools`; returns the (possibly LoRA-wrapped) model for
    GRPO to continue from. With `reuse`, weights saved by an earlier attempt with the same settings are loaded."""
    inputs = warmup_inputs(cfg, prepared)
    saved = _saved_warmup(output_dir, inputs) if reuse else None
    if saved is not None:
        warmed = _load_warmup(model, peft_config, saved)
        if warmed is not None:
            print(f"[grpo] format warm-up: reusing {saved} (same settings; pass --resume never to redo it)",
                  flush=True)
            return warmed
        print(f"[grpo] format warm-up: {saved} does not fit this model; training the warm-up again", flush=True)
    # lazy: datasets and trl import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    examples, conversations = with_tools(tools, examples)
    print(f"[grpo] format warm-up: {cfg.health.sft_warmup_steps} SFT steps on {len(examples)} formatted examples"
          + (" (tool conversations)" if conversations else ""), flush=True)

    cpu = on_cpu()
    # From the model's dtype, not from what the GPU supports: Unsloth's SFTTrainer raises when they disagree
    # (a dtype: float16 model on an Ampere card), and the plain backend's model dtype is the one it chose.
    precision = {"bf16": False, "fp16": False} if cpu else mixed_precision(model)
    args = SFTConfig(
        output_dir=str(output_dir / "sft_warmup"),
        max_steps=cfg.health.sft_warmup_steps,
        learning_rate=cfg.health.sft_learning_rate,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        lr_scheduler_type="linear",
        warmup_steps=0,
        logging_steps=max(1, cfg.health.sft_warmup_steps // 5),
        save_strategy="no",  # no mid-warm-up checkpoints; the result is saved to warmup/ at the end
        report_to="none",
        seed=cfg.grpo.seed,
        use_cpu=cpu,
        **precision,
        gradient_checkpointing=False,
        completion_only_loss=True,  # learn the answer format, not to parrot the prompt
        assistant_only_loss=conversations,  # nor a tool's answers
        max_length=cfg.model.max_seq_length,
        disable_tqdm=True,
    )
    # lazy: transformers and run/log (its callbacks) import torch
    from transformers import PrinterCallback

    from grpo_pipeline.pipeline.run.log import WarmupLogCallback

    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(examples),
                         processing_class=tokenizer, peft_config=peft_config,
                         callbacks=[WarmupLogCallback(cfg.health.sft_warmup_steps)])
    trainer.remove_callback(PrinterCallback)  # it prints raw dicts of strings; one readable line instead
    trainer.train()

    # One writer: every DDP process trained the same warm-up, and each publishing warmup/ found the others' copy
    # there (exit 2). The main process writes; all wait for it.
    # lazy: accelerate imports torch
    from accelerate import PartialState

    processes = PartialState()  # the launcher's processes, as the trainer's accelerator sees them
    if processes.is_main_process:
        with storage_errors_named(output_dir, "run the same command again (the warm-up is trained again)."), \
                atomic_directory(output_dir / WARMUP_DIR) as staging:
            trainer.model.save_pretrained(staging)  # the adapter
            atomic_write_json(staging / WARMUP_KEY_NAME, record(inputs))
    processes.wait_for_everyone()
    return trainer.model

