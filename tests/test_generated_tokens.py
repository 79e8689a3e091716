"""Eval and `grpo generate` count the tokens the model generated, as the generator saw them (the EOS
included), not the decoded text re-tokenised."""

from __future__ import annotations

import torch

from grpo_pipeline.pipeline.backends.plain import PlainGenerator, generated_length
from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer, resolve_model_path
from grpo_pipeline.pipeline.infer.evaluate import evaluate_rows
from grpo_pipeline.pipeline.infer.scoring import build_scorer


def test_counts_are_the_generated_ids_up_to_eos():
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer("tiny-demo")
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-demo"), dtype=torch.float32)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True) for q in ("1+2", "30+45", "7")]
    max_tokens = 12
    completions = PlainGenerator(model, tokenizer).generate(prompts, max_tokens=max_tokens)
    for prompt, completion in zip(prompts, completions):
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        out = model.generate(**ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)[0, ids["input_ids"].shape[1]:].tolist()
        assert completion.tokens == generated_length(out, tokenizer.eos_token_id) <= max_tokens
    rows = [{"prompt": [{"role": "user", "content": q}], "answer": "3", "id": q} for q in ("1+2", "30+45", "7")]
    scorer = build_scorer([], keywords=lambda columns, texts: {})  # no rewards: the built-in reading
    result = evaluate_rows(PlainGenerator(model, tokenizer), tokenizer, rows, scorer, max_tokens)
    assert result["mean_completion_length"] == sum(c.tokens for c in completions) / 3
