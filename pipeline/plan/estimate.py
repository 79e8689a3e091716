"""The estimated peak GPU memory of a recipe, part by part, and whether it fits a card.

Each part is one formula over the model's shape (shape.py) and the recipe, written after the code that
allocates it in the pinned wheels:
- weights: bitsandbytes NF4 with double quantization (the plain backend's BitsAndBytesConfig, and Unsloth's
  pre-quantized bnb-4bit repos): 0.5 byte per weight of each decoder nn.Linear, plus an 8-bit absmax per 64-weight
  block and an fp32 absmax per 256 such blocks. Embeddings, lm_head, norms and biases stay 16-bit.
- LoRA: r x (in + out) per adapted linear, stored in fp32 (PEFT's autocast_adapter_dtype), an fp32 gradient each,
  and Adam's two moments: 1 byte each with an 8-bit optimizer (bitsandbytes, blockwise), 4 bytes otherwise.
- activations of one micro-batch (per_device_train_batch_size rows of prompt + completion tokens) under
  gradient checkpointing: the layer inputs kept for the backward (on the GPU with standard checkpointing; in
  CPU RAM with Unsloth's offloaded variant, which Unsloth uses from max_seq_length 512 up:
  unsloth/models/_utils.py apply_unsloth_gradient_checkpointing) plus one layer recomputed.
- log-probabilities: TRL 1.15 never materialises [batch, tokens, vocab] logits (GRPOTrainer
  _get_per_token_logps_and_entropies calls the model with `fused_lm_head=True`: trl/kernels/chunked_logprob.py
  ChunkedLogProbFunction, 4096-token x 32768-vocab tiles, fp32 hidden-state gradient). Unsloth's loss
  (unsloth_zoo/rl_replacements.py grpo_accumulated_loss) splits each row into max(4, tokens // 4096) chunks and
  keeps two fp32 [chunk, vocab] tensors per chunk (autotune_batch_and_chunks counts the logits twice).
- reference model (beta > 0): with LoRA it is the same base with the adapter disabled, so it costs nothing.
- vLLM (Unsloth fast_inference): `gpu_memory_utilization` x the GPU's total, holding the shared weights, the
  LoRA slot and the KV cache. With standby its KV cache sleeps while the trainer computes, so the peak is the
  larger of the rollout phase and the training phase; without standby both add up.
Nothing here imports torch (count_parameters does, once per model, then reads its cache).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from pipeline.backends.gpu_settings import choose_gpu_memory_utilization, parse_gpu_memory_utilization, \
    standby_enabled
from pipeline.config import PipelineConfig, parse_limit
from pipeline.plan.cards import GIB, Card
from pipeline.plan.shape import ModelShape, ParamCounts

# bench/memory_plan.py compares the planner with every published figure we have (Unsloth's, verl's, EasyR1's); this
# is the largest error of its comparable rows (-29.8%: Unsloth's activation figure for Llama 3.1 8B at 8 x 20K
# tokens), rounded up to 5% (tests/test_plan.py holds the two equal). No GPU has measured a peak beside the planner
# yet. The estimate is never printed with more precision than this.
UNCERTAINTY = 0.30

NF4_BYTES_PER_WEIGHT = 0.5 + 1 / 64 + 4 / (64 * 256)
EIGHT_BIT_OPTIMIZERS = ("adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit", "adam8bit", "paged_adam8bit",
                        "lion_8bit", "paged_lion_8bit")
# `max_prompt_length: auto` is the longest kept prompt, unknown before the data is read. GSM8K prompts with the
# default system prompt are ~150-250 tokens; `grpo data` prints the real number, `--max_prompt_length N` plans it.
AUTO_PROMPT_TOKENS = 256
TRL_TOKEN_TILE, TRL_VOCAB_TILE = 4096, 32768  # trl/kernels/chunked_logprob.py, trl/trainer/utils.py
TRL_VLLM_COLOCATE_SHARE = 0.3  # trl GRPOConfig.vllm_gpu_memory_utilization default
VLLM_OVERHEAD_GIB = 0.5  # vLLM's CUDA graphs, sampler and profile-run buffers inside its share (not measured)


@dataclass(frozen=True)
class Part:
    name: str
    gib: float
    how: str


@dataclass
class Estimate:
    """The plan of one recipe on one card."""

    card: Card
    backend: str  # "unsloth+vllm", "unsloth (no vLLM)", "plain", "plain+vllm colocate"
    parts: list[Part]
    peak_gib: float
    peak_how: str
    prompt_tokens: int
    completion_tokens: int
    notes: list[str] = field(default_factory=list)
    blocker: Optional[str] = None  # fails regardless of the peak (vLLM cannot hold one sequence)
    reserved_gib: float = 0.0  # the part of the peak that is a fixed reservation (vLLM's share), not estimated

    @property
    def band_gib(self) -> tuple[float, float]:
        """The peak with the uncertainty applied to its estimated part only (a reservation is exact)."""
        spread = UNCERTAINTY * (self.peak_gib - self.reserved_gib)
        return self.peak_gib - spread, self.peak_gib + spread

    @property
    def usable_gib(self) -> float:
        return self.card.usable_gib

    @property
    def margin_gib(self) -> float:
        return self.usable_gib - self.peak_gib

    @property
    def fits(self) -> bool:
        return self.blocker is None and self.peak_gib <= self.usable_gib

    @property
    def ratio(self) -> float:
        return self.peak_gib / self.usable_gib if self.usable_gib > 0 else float("inf")

    def part(self, name: str) -> float:
        return next(p.gib for p in self.parts if p.name == name)


def token_lengths(cfg: PipelineConfig) -> tuple[int, int]:
    """(prompt, completion) tokens per row, the longest the recipe allows (see prompts.LengthBudget)."""
    seq = cfg.model.max_seq_length
    prompt = parse_limit(cfg.data.max_prompt_length, "max_prompt_length")
    completion = parse_limit(cfg.data.max_completion_length, "max_completion_length")
    if prompt is None:  # the longest kept prompt, never past what the completion leaves
        prompt = min(AUTO_PROMPT_TOKENS, seq // 2 if completion is None else max(1, seq - completion))
    if completion is None:
        completion = max(1, seq - prompt)
    return prompt, completion


def backend_path(cfg: PipelineConfig) -> str:
    """The GPU path the recipe takes on a CUDA machine with the [gpu] extras (backend auto -> Unsloth)."""
    if cfg.model.backend == "plain":
        return "plain+vllm colocate" if cfg.model.vllm_mode == "colocate" else "plain"
    return "unsloth+vllm" if cfg.model.fast_inference else "unsloth (no vLLM)"


def lora_parameters(cfg: PipelineConfig, counts: ParamCounts, rank: Optional[int] = None) -> int:
    rank = cfg.lora.lora_r if rank is None else rank
    adapted = sum(rank * (n_in + n_out) * how_many for name, (n_in, n_out, how_many) in counts.linears.items()
                  if name in cfg.lora.lora_target_modules)
    return adapted + sum(counts.by_module.get(name, 0) for name in cfg.lora.lora_modules_to_save)


def weight_bytes(cfg: PipelineConfig, counts: ParamCounts) -> tuple[float, str]:
    if cfg.model.load_in_4bit:
        return (counts.quantizable * NF4_BYTES_PER_WEIGHT + counts.sixteen_bit * 2,
                f"{counts.quantizable / 1e9:.2f}B linear weights in NF4 ({NF4_BYTES_PER_WEIGHT:.4f} B each with "
                f"its quant state) + {counts.sixteen_bit / 1e9:.2f}B in 16-bit (embeddings"
                f"{'' if counts.lm_head == 0 else ', lm_head'}, norms, biases)")
    width = 4 if cfg.model.dtype == "float32" else 2
    return counts.total * width, f"{counts.total / 1e9:.2f}B parameters x {width} B"


def activation_bytes(cfg: PipelineConfig, shape: ModelShape, rows: int, tokens: int, unsloth: bool,
                     width: int = 2) -> tuple[float, str]:
    """One micro-batch's activations kept for the backward."""
    h, i, layers = shape.hidden_size, shape.intermediate_size, shape.num_hidden_layers
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_key_value_heads * shape.head_dim
    n = rows * tokens
    # A decoder layer's saved tensors per token: two norm inputs/outputs and the residual (4h), q and the attention
    # output (2q), k and v (2kv), gate, up, silu(gate) and their product (4i).
    per_layer = n * (4 * h + 2 * q + 2 * kv + 4 * i) * width
    boundary = n * h * width  # one layer input
    if not cfg.lora.gradient_checkpointing:
        return layers * per_layer, f"no checkpointing: {layers} layers x {rows} x {tokens} tokens"
    if unsloth and cfg.model.max_seq_length >= 512:
        return (2 * boundary + per_layer,
                f"Unsloth offloaded checkpointing: layer inputs in CPU RAM, 2 on the GPU + 1 layer recomputed "
                f"({rows} rows x {tokens} tokens)")
    return (layers * boundary + per_layer,
            f"checkpointing: {layers} layer inputs + 1 layer recomputed ({rows} rows x {tokens} tokens)")


def logprob_bytes(shape: ModelShape, rows: int, completion: int, unsloth: bool, width: int = 2) -> tuple[float, str]:
    h, vocab = shape.hidden_size, shape.vocab_size
    n = rows * completion
    if unsloth:
        chunks = max(4, completion // 4096)
        chunk_tokens = -(-completion // chunks)
        return (n * h * (width + 4) + 2 * chunk_tokens * vocab * 4,
                f"Unsloth chunked loss: {rows} x {completion} hidden states (+ fp32 grad) and 2 fp32 "
                f"[{chunk_tokens} x {vocab}] logit chunks")
    tile = min(n, TRL_TOKEN_TILE) * TRL_VOCAB_TILE * width
    return (n * h * (width + 4) + tile + n * 8 * 4,
            f"TRL fused LM head: {rows} x {completion} hidden states (+ fp32 grad) and one "
            f"[{min(n, TRL_TOKEN_TILE)} x {TRL_VOCAB_TILE}] logit tile")


def vllm_share(cfg: PipelineConfig, card: Card, standby: bool) -> tuple[float, str]:
    """The share vLLM takes, as the Unsloth backend resolves it (gpu_settings.resolve_gpu_memory_utilization)."""
    explicit = parse_gpu_memory_utilization(cfg.model.gpu_memory_utilization)
    tier = choose_gpu_memory_utilization(card.total_gib, standby)
    if explicit is None:
        return tier, f"auto for a {card.total_gib:.1f} GiB GPU{' with standby' if standby else ''}"
    if standby and os.environ.get("UNSLOTH_VLLM_STANDBY_UTIL_OVERRIDE", "0") == "0":
        return tier, f"standby replaces {explicit} with Unsloth's tier"
    return explicit, "as set"


def estimate(cfg: PipelineConfig, shape: ModelShape, counts: ParamCounts, card: Card) -> Estimate:
    path = backend_path(cfg)
    unsloth = path.startswith("unsloth")
    g = cfg.grpo
    prompt, completion = token_lengths(cfg)
    tokens = prompt + completion
    rows = g.per_device_train_batch_size
    generation_rows = rows * g.gradient_accumulation_steps  # TRL generates steps_per_generation micro-batches at once
    width = 4 if cfg.model.dtype == "float32" else 2
    gib = lambda value: value / GIB  # noqa: E731

    weights, weights_how = weight_bytes(cfg, counts)
    lora = lora_parameters(cfg, counts)
    eight_bit = g.optim in EIGHT_BIT_OPTIMIZERS
    optimizer = lora * (2 + 8 / 2048 if eight_bit else 8)
    activations, act_how = activation_bytes(cfg, shape, rows, tokens, unsloth, width)
    logprobs, logprob_how = logprob_bytes(shape, rows, completion, unsloth, width)
    kv_per_token = shape.kv_bytes_per_token * (0.5 if (cfg.model.float8_kv_cache and path == "unsloth+vllm") else 1)
    kv_need = generation_rows * tokens * kv_per_token

    parts = [
        Part("weights", gib(weights), weights_how),
        Part("lora", gib(lora * 4), f"{lora / 1e6:.1f}M LoRA parameters (r={cfg.lora.lora_r}) in fp32"),
        Part("gradients", gib(lora * 4), "fp32, one per LoRA parameter"),
        Part("optimizer", gib(optimizer), f"{g.optim}: {'8-bit' if eight_bit else '32-bit'} Adam moments"),
        Part("activations", gib(activations), act_how),
        Part("logprobs", gib(logprobs), logprob_how),
        Part("reference", 0.0, "beta > 0 with LoRA: the base with the adapter disabled (shared)" if g.beta > 0
             else "beta = 0: no reference model"),
    ]
    notes: list[str] = []
    blocker = None
    trainable = gib(lora * 8 + optimizer)  # LoRA + gradients + optimizer
    training = gib(activations + logprobs)
    if path == "unsloth+vllm":
        standby = standby_enabled(cfg, has_cuda=True)
        share, share_how = vllm_share(cfg, card, standby)
        share_gib = share * card.total_gib
        slot = gib(lora_parameters(cfg, counts, cfg.model.max_lora_rank) * 2)
        kv_room = share_gib - gib(weights) - slot - VLLM_OVERHEAD_GIB
        parts.append(Part("vllm", share_gib, f"gpu_memory_utilization {share:.3f} ({share_how}) x "
                          f"{card.total_gib:.1f} GiB: the shared weights, the LoRA slot, {VLLM_OVERHEAD_GIB} GiB "
                          f"of graphs/buffers and {max(kv_room, 0):.1f} GiB of KV cache"))
        parts.append(Part("kv_need", gib(kv_need), f"{generation_rows} completions x {tokens} tokens x "
                          f"{kv_per_token / 1024:.0f} KiB per token (inside the vLLM share)"))
        if kv_room * GIB < tokens * kv_per_token:
            blocker = (f"vLLM's share leaves {kv_room:.2f} GiB of KV cache, less than one {tokens}-token sequence "
                       f"needs ({gib(tokens * kv_per_token):.2f} GiB): vLLM refuses to start")
        elif kv_room * GIB < kv_need:
            notes.append(f"the KV cache ({kv_room:.1f} GiB) holds {kv_room * GIB / (tokens * kv_per_token):.0f} of "
                         f"the {generation_rows} sequences at full length: vLLM generates in waves (slower, no OOM)")
        if standby:
            rollout = share_gib + trainable
            train_phase = gib(weights) + slot + trainable + training
            reserved = share_gib if rollout >= train_phase else 0.0
            peak, peak_how = max(rollout, train_phase), (
                "standby: max(rollout = vLLM share + LoRA/grads/optimizer, "
                "training = weights + LoRA/grads/optimizer + activations + log-probs)")
            peak_how += f" = max({rollout:.1f}, {train_phase:.1f})"
        else:
            peak, reserved = share_gib + trainable + training, share_gib
            peak_how = "no standby: vLLM share + LoRA/grads/optimizer + activations + log-probs"
    elif path == "plain+vllm colocate":
        share = parse_gpu_memory_utilization(cfg.model.gpu_memory_utilization) or TRL_VLLM_COLOCATE_SHARE
        share_gib = share * card.total_gib
        parts.append(Part("vllm", share_gib, f"TRL colocate vLLM: {share} x {card.total_gib:.1f} GiB, its own "
                          "16-bit copy of the weights and KV cache"))
        peak, reserved = share_gib + gib(weights) + trainable + training, share_gib
        peak_how = "colocate: vLLM share + weights + LoRA/grads/optimizer + activations + log-probs"
    else:
        generate = kv_need + generation_rows * shape.vocab_size * 4
        parts.append(Part("generation", gib(generate), f"transformers generate: KV cache of {generation_rows} x "
                          f"{tokens} tokens + fp32 next-token logits"))
        peak, reserved = gib(weights) + trainable + max(gib(generate), training), 0.0
        peak_how = "weights + LoRA/grads/optimizer + max(generation, activations + log-probs)"
    return Estimate(card=card, backend=path, parts=parts, peak_gib=peak, peak_how=peak_how, prompt_tokens=prompt,
                    completion_tokens=completion, notes=notes, blocker=blocker,
                    reserved_gib=reserved)
