"""Optional SFT format warm-up before GRPO (`sft_warmup_steps > 0`), as the Qwen3 GRPO notebook does.

GRPO learns only from differences within a group: if no completion ever contains
`<answer>...</answer>`, every format and correctness reward is 0 and there is nothing to learn
(landscape.md problem 6). A few supervised steps on formatted examples fix that cheaply.

Examples come from the training rows' worked solutions when the dataset has them (GSM8K does:
the text before `####`), else from the built-in demo task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig

MAX_WARMUP_EXAMPLES = 256


def format_completion(reasoning: str, answer: str) -> str:
    """The target format, exactly as the strict format reward wants it."""
    return f"<reasoning>\n{reasoning.strip()}\n</reasoning>\n<answer>\n{answer.strip()}\n</answer>\n"


def warmup_examples(cfg: PipelineConfig, prepared) -> list[dict[str, Any]]:
    """Prompt/completion pairs in TRL's conversational prompt-completion format."""
    dataset = prepared.dataset
    if "solution" in dataset.column_names:
        rows = dataset.select(range(min(len(dataset), MAX_WARMUP_EXAMPLES)))
        return [{"prompt": r["prompt"],
                 "completion": [{"role": "assistant", "content": format_completion(r["solution"], r["answer"])}]}
                for r in rows if r.get("solution")]
    if cfg.data.dataset_name == "demo-arithmetic":
        from pipeline.demo import sft_examples

        return sft_examples(MAX_WARMUP_EXAMPLES, seed=cfg.grpo.seed, system_prompt=cfg.data.system_prompt)
    raise ValueError("sft_warmup_steps > 0 needs worked solutions: a dataset with a `solution` column (GSM8K "
                     "solutions before `####` are used automatically). Set sft_warmup_steps: 0 otherwise.")


def run_format_warmup(model, tokenizer, cfg: PipelineConfig, prepared, peft_config, output_dir: Path):
    """A short SFTTrainer pass; returns the (possibly LoRA-wrapped) model for GRPO to continue from."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    examples = warmup_examples(cfg, prepared)
    print(f"[grpo] format warm-up: {cfg.health.sft_warmup_steps} SFT steps on {len(examples)} formatted examples",
          flush=True)
    import torch

    from pipeline.backends import mixed_precision

    on_cpu = not torch.cuda.is_available()
    # From the model's dtype, not from what the GPU supports: Unsloth's SFTTrainer raises when they disagree
    # (a dtype: float16 model on an Ampere card), and the plain backend's model dtype is the one it chose.
    precision = {"bf16": False, "fp16": False} if on_cpu else mixed_precision(model)
    args = SFTConfig(
        output_dir=str(output_dir / "sft_warmup"),
        max_steps=cfg.health.sft_warmup_steps,
        learning_rate=cfg.health.sft_learning_rate,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        lr_scheduler_type="linear",
        warmup_steps=0,
        logging_steps=max(1, cfg.health.sft_warmup_steps // 5),
        save_strategy="no",  # the warm-up is cheap to redo; GRPO checkpoints are what resume needs
        report_to="none",
        seed=cfg.grpo.seed,
        use_cpu=on_cpu,
        **precision,
        gradient_checkpointing=False,
        completion_only_loss=True,  # learn the answer format, not to parrot the prompt
        max_length=cfg.model.max_seq_length,
        disable_tqdm=True,
    )
    from transformers import PrinterCallback

    from pipeline.run_logging import WarmupLogCallback

    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(examples),
                         processing_class=tokenizer, peft_config=peft_config,
                         callbacks=[WarmupLogCallback(cfg.health.sft_warmup_steps)])
    trainer.remove_callback(PrinterCallback)  # it prints raw dicts of strings; one readable line instead
    trainer.train()
    return trainer.model

