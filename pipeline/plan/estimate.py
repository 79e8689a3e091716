"""The estimated peak GPU memory of a recipe, part by part, each a formula after the code that allocates it in the
pinned wheels. Nothing here imports torch (count_parameters does, once per model).
- weights: bitsandbytes NF4 with double quantization: 0.5 byte per decoder nn.Linear weight, plus an 8-bit absmax
  per 64-weight block and an fp32 absmax per 256 blocks. The rest stays 16-bit with Unsloth; the plain backend's
  peft prepare_model_for_kbit_training (peft/utils/other.py) casts it to fp32, and then the residual stream is fp32
  too (Qwen2RMSNorm multiplies by its fp32 weight; Linear4bit.forward returns its input's dtype), so the kept
  activations and `generate`'s KV cache take 4 bytes a value.
- LoRA: r x (in + out) per adapted linear in fp32 (PEFT's autocast_adapter_dtype), an fp32 gradient, and Adam's two
  moments (1 byte each with a bitsandbytes 8-bit optimizer, else 4).
- activations of one micro-batch under gradient checkpointing: the layer inputs (in CPU RAM with Unsloth's offloaded
  variant, from max_seq_length 512 and layer inputs over 2 MiB: unsloth/models/_utils.py
  apply_unsloth_gradient_checkpointing, unsloth_zoo gradient_checkpointing.py MINIMUM_SIZE) plus one recomputed layer.
- log-probabilities: TRL 1.15 never materialises the logits (GRPOTrainer _get_per_token_logps_and_entropies with
  `fused_lm_head=True`: trl/kernels/chunked_logprob.py, 4096-token x 32768-vocab tiles). Unsloth (unsloth_zoo
  2026.10.9 rl_replacements.py grpo_accumulated_loss -> fused_losses/chunked_logprob.py) projects the micro-batch's
  completion tokens `chunked_logprob_rows` at a time (a chunk near 2 GiB at 8 bytes a logit, capped at
  max(512, tokens / 8)); the backward holds a chunk's fp32 logits and their gradient, and the hidden states.
- the cuBLAS workspace, through torch's caching allocator: 32 MiB on Hopper (`:4096:8`), the larger of the cards'.
- reference model (beta > 0): the base with the LoRA adapter disabled, so nothing.
- vLLM (Unsloth fast_inference): `gpu_memory_utilization` x the GPU's total. With standby its KV cache sleeps while
  the trainer computes, so the peak is the larger of the two phases; without standby both add up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from grpo_pipeline.pipeline.backends import planned_backend
from grpo_pipeline.pipeline.backends.gpu_settings import choose_gpu_memory_utilization, parse_gpu_memory_utilization, \
    standby_enabled, standby_replaces_share
from grpo_pipeline.pipeline.config import PipelineConfig, given, parse_limit
from grpo_pipeline.pipeline.plan.cards import GIB, Card
from grpo_pipeline.pipeline.plan.shape import ModelShape, ParamCounts

# The largest error of tests/memory_plan_figures.py's comparable rows (published figures and measured peaks,
# docs/gpu-reports; bench/memory_plan.py prints them: -29.8%, Unsloth's Llama 3.1 8B activations at 8 x 20K tokens),
# rounded up to 5% (tests/test_plan.py holds the two equal). The estimate is never printed more precisely.
UNCERTAINTY = 0.30

NF4_BYTES_PER_WEIGHT = 0.5 + 1 / 64 + 4 / (64 * 256)
EIGHT_BIT_OPTIMIZERS = ("adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit", "adam8bit", "paged_adam8bit",
                        "lion_8bit", "paged_lion_8bit")
# `max_prompt_length: auto` is unknown before the data is read; GSM8K prompts are ~150-250 tokens.
AUTO_PROMPT_TOKENS = 256
TRL_TOKEN_TILE, TRL_VOCAB_TILE = 4096, 32768  # trl/kernels/chunked_logprob.py, trl/trainer/utils.py
TRL_VLLM_COLOCATE_SHARE = 0.3  # trl GRPOConfig.vllm_gpu_memory_utilization default
# unsloth_zoo/fused_losses/chunked_logprob.py: _CHUNK_GB, _BYTES_PER_LOGIT and _MIN_ROWS of chunked_logprob_rows
UNSLOTH_LOGPROB_CHUNK_BYTES, UNSLOTH_BYTES_PER_LOGIT, UNSLOTH_MIN_CHUNK_ROWS = 2 * 2**30, 8, 512
# unsloth_zoo/gradient_checkpointing.py MINIMUM_SIZE: a layer input of at most this many bytes stays on the GPU
UNSLOTH_OFFLOAD_MIN_BYTES = 2 * 1024 * 1024
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 8  # torch's default cuBLAS(Lt) workspace on sm90 (:4096:8)
VLLM_OVERHEAD_GIB = 0.5  # vLLM's CUDA graphs, sampler and profile-run buffers inside its share (not measured)
HELD = "LoRA/optimizer/workspace"  # what the trainer holds through the whole step besides the weights
TRAINING = "kept activations + max(log-probs, recomputed layer + grads)"


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


def memory_path(cfg: PipelineConfig) -> str:
    """The GPU path the recipe takes on a CUDA machine with the [gpu] extras."""
    return planned_backend(cfg.model.backend).memory_path(cfg.model.vllm_mode, cfg.model.fast_inference)


def compute_width(cfg: PipelineConfig) -> int:
    """Bytes of the compute dtype: 4 for float32, else 2."""
    return 4 if cfg.model.dtype == "float32" else 2


def kbit_upcast(cfg: PipelineConfig) -> bool:
    """True when the backend loads in 4 bits and upcasts the rest to fp32 (KBIT_UPCAST)."""
    return planned_backend(cfg.model.backend).KBIT_UPCAST and cfg.model.load_in_4bit


def planned_standby(cfg: PipelineConfig) -> bool:
    """vLLM's standby as the Unsloth backend turns it on with a CUDA GPU (unsloth+vllm only)."""
    return memory_path(cfg) == "unsloth+vllm" and standby_enabled(cfg, has_cuda=True)


def token_budget(cfg: PipelineConfig) -> tuple[int, int]:
    """(prompt, completion) tokens per row, the longest the recipe allows (as prompts.LengthBudget)."""
    seq = cfg.model.max_seq_length
    prompt = parse_limit(cfg.data.max_prompt_length, "max_prompt_length")
    completion = parse_limit(cfg.data.max_completion_length, "max_completion_length")
    if prompt is None:  # the longest kept prompt, never past what the completion leaves
        prompt = min(AUTO_PROMPT_TOKENS, seq // 2 if completion is None else max(1, seq - completion))
    return prompt, given(completion, max(1, seq - prompt))


def adapter_parameters(cfg: PipelineConfig, counts: ParamCounts, rank: Optional[int] = None) -> int:
    rank = cfg.lora.lora_r if rank is None else rank
    adapted = sum(rank * (n_in + n_out) * how_many for name, (n_in, n_out, how_many) in counts.linears.items()
                  if name in cfg.lora.lora_target_modules)
    return adapted + sum(counts.by_module.get(name, 0) for name in cfg.lora.lora_modules_to_save)


def weight_bytes(cfg: PipelineConfig, counts: ParamCounts) -> tuple[float, str]:
    if cfg.model.load_in_4bit:
        rest = 4 if kbit_upcast(cfg) else 2
        return (counts.quantizable * NF4_BYTES_PER_WEIGHT + counts.sixteen_bit * rest,
                f"{counts.quantizable / 1e9:.2f}B linear weights in NF4 ({NF4_BYTES_PER_WEIGHT:.4f} B each with "
                f"its quant state) + {counts.sixteen_bit / 1e9:.2f}B (embeddings"
                f"{'' if counts.lm_head == 0 else ', lm_head'}, norms, biases) in "
                + ("fp32 (peft's prepare_model_for_kbit_training upcasts them)" if rest == 4 else "16-bit"))
    return counts.total * compute_width(cfg), f"{counts.total / 1e9:.2f}B parameters x {compute_width(cfg)} B"


def activation_bytes(cfg: PipelineConfig, shape: ModelShape, rows: int, tokens: int, unsloth: bool,
                     width: int = 2) -> tuple[float, float, str]:
    """One micro-batch's activations: (kept through the backward, recomputed one layer at a time, how)."""
    h, i, layers = shape.hidden_size, shape.intermediate_size, shape.num_hidden_layers
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_key_value_heads * shape.head_dim
    n = rows * tokens
    # A decoder layer's saved tensors per token: two norm inputs/outputs and the residual (4h), q and the attention
    # output (2q), k and v (2kv), gate, up, silu(gate) and their product (4i).
    per_layer = n * (4 * h + 2 * q + 2 * kv + 4 * i) * width
    boundary = n * h * width  # one layer input
    if not cfg.lora.gradient_checkpointing:
        return layers * per_layer, 0.0, f"no checkpointing: {layers} layers x {rows} x {tokens} tokens"
    if unsloth and cfg.model.max_seq_length >= 512 and boundary > UNSLOTH_OFFLOAD_MIN_BYTES:
        return (2 * boundary, per_layer,
                f"Unsloth offloaded checkpointing: layer inputs in CPU RAM, 2 on the GPU + 1 layer recomputed "
                f"({rows} rows x {tokens} tokens)")
    return (layers * boundary, per_layer,
            f"checkpointing: {layers} layer inputs + 1 layer recomputed ({rows} rows x {tokens} tokens)")


def unsloth_chunk_tokens(vocab: int, tokens: int) -> int:
    """Tokens per chunk of Unsloth's log-prob projection (unsloth_zoo chunked_logprob_rows, more than 2 GiB free).

    >>> unsloth_chunk_tokens(151936, 8 * 128), unsloth_chunk_tokens(128256, 8 * 19488)
    (512, 2092)
    """
    by_size = UNSLOTH_LOGPROB_CHUNK_BYTES // (vocab * UNSLOTH_BYTES_PER_LOGIT)
    return max(2, min(tokens, by_size, max(UNSLOTH_MIN_CHUNK_ROWS, -(-tokens // 8))))


def logprob_bytes(shape: ModelShape, rows: int, completion: int, unsloth: bool, width: int = 2,
                  hidden_width: int = 2) -> tuple[float, str]:
    """The loss's working set; `hidden_width`: 4 with the plain backend's fp32 residual stream."""
    h, vocab = shape.hidden_size, shape.vocab_size
    n = rows * completion
    if unsloth:
        chunk = unsloth_chunk_tokens(vocab, n)
        return (n * h * 2 * width + chunk * vocab * (4 + width),
                f"Unsloth chunked log-probs: {rows} x {completion} hidden states (+ grad) and one "
                f"[{chunk} x {vocab}] chunk of fp32 logits with their gradient")
    tile = min(n, TRL_TOKEN_TILE) * TRL_VOCAB_TILE * width
    return (n * h * (hidden_width + 4) + tile + n * 8 * 4,
            f"TRL fused LM head: {rows} x {completion} hidden states (+ fp32 grad) and one "
            f"[{min(n, TRL_TOKEN_TILE)} x {TRL_VOCAB_TILE}] logit tile")


def _vllm_peak(cfg: PipelineConfig, card: Card, counts: ParamCounts, weights: float, fixed: float, training: float,
               need: tuple[int, int, float]) -> tuple[list[Part], float, float, str, list[str], Optional[str]]:
    """Unsloth + vLLM: (parts, peak, reserved, how, notes, blocker) in GiB; `fixed`: what the trainer holds through
    the step besides the weights."""
    generation_rows, tokens, kv_per_token = need
    kv_need = generation_rows * tokens * kv_per_token
    standby = planned_standby(cfg)
    # the share as the Unsloth backend resolves it (gpu_settings.resolve_gpu_memory_utilization)
    explicit = parse_gpu_memory_utilization(cfg.model.gpu_memory_utilization)
    share, share_how = choose_gpu_memory_utilization(card.total_gib, standby), "as set"
    if explicit is None:
        share_how = f"auto for a {card.total_gib:.1f} GiB GPU{' with standby' if standby else ''}"
    elif standby_replaces_share(standby):
        share_how = f"standby replaces {explicit} with Unsloth's tier"
    else:
        share = explicit
    share_gib = share * card.total_gib
    slot = adapter_parameters(cfg, counts, cfg.model.max_lora_rank) * 2 / GIB
    kv_room = share_gib - weights - slot - VLLM_OVERHEAD_GIB
    parts = [Part("vllm", share_gib, f"gpu_memory_utilization {share:.3f} ({share_how}) x {card.total_gib:.1f} GiB: "
                  f"the shared weights, the LoRA slot, {VLLM_OVERHEAD_GIB} GiB of graphs/buffers and "
                  f"{max(kv_room, 0):.1f} GiB of KV cache"),
             Part("kv_need", kv_need / GIB, f"{generation_rows} completions x {tokens} tokens x "
                  f"{kv_per_token / 1024:.0f} KiB per token (inside the vLLM share)")]
    notes, blocker = [], None
    if kv_room * GIB < tokens * kv_per_token:
        blocker = (f"vLLM's share leaves {kv_room:.2f} GiB of KV cache, less than one {tokens}-token sequence "
                   f"needs ({tokens * kv_per_token / GIB:.2f} GiB): vLLM refuses to start")
    elif kv_room * GIB < kv_need:
        notes.append(f"the KV cache ({kv_room:.1f} GiB) holds {kv_room * GIB / (tokens * kv_per_token):.0f} of "
                     f"the {generation_rows} sequences at full length: vLLM generates in waves (slower, no OOM)")
    if not standby:
        return (parts, share_gib + fixed + training, share_gib,
                f"no standby: vLLM share + {HELD} + {TRAINING}", notes, blocker)
    rollout, train_phase = share_gib + fixed, weights + slot + fixed + training
    how = (f"standby: max(rollout = vLLM share + {HELD}, training = weights + {HELD} + {TRAINING}) "
           f"= max({rollout:.1f}, {train_phase:.1f})")
    return (parts, max(rollout, train_phase), share_gib if rollout >= train_phase else 0.0, how, notes,
            blocker)


def estimate(cfg: PipelineConfig, shape: ModelShape, counts: ParamCounts, card: Card) -> Estimate:
    """The peak of `cfg` on `card` for a model of `shape` and `counts`."""
    path = memory_path(cfg)
    unsloth = planned_backend(cfg.model.backend).MEMORY_SAVERS  # chunked log-probs and offloaded checkpoints
    prompt, completion = token_budget(cfg)
    tokens = prompt + completion
    rows = cfg.grpo.per_device_train_batch_size
    # TRL generates steps_per_generation micro-batches at once
    generation_rows = rows * cfg.grpo.gradient_accumulation_steps
    width = compute_width(cfg)
    residual = 4 if kbit_upcast(cfg) else width  # the fp32 residual stream of prepare_model_for_kbit_training
    gib = lambda value: value / GIB  # noqa: E731

    weights, weights_how = weight_bytes(cfg, counts)
    lora = adapter_parameters(cfg, counts)
    eight_bit = cfg.grpo.optim in EIGHT_BIT_OPTIMIZERS
    optimizer = lora * (2 + 8 / 2048 if eight_bit else 8)
    kept, recomputed, act_how = activation_bytes(cfg, shape, rows, tokens, unsloth, residual)
    logprobs, logprob_how = logprob_bytes(shape, rows, completion, unsloth, width, residual)
    kv_per_token = shape.kv_bytes_per_token * (0.5 if (cfg.model.float8_kv_cache and path == "unsloth+vllm") else 1)

    parts = [
        Part("weights", gib(weights), weights_how),
        Part("lora", gib(lora * 4), f"{lora / 1e6:.1f}M LoRA parameters (r={cfg.lora.lora_r}) in fp32"),
        Part("gradients", gib(lora * 4), "fp32, one per LoRA parameter"),
        Part("optimizer", gib(optimizer), f"{cfg.grpo.optim}: {'8-bit' if eight_bit else '32-bit'} Adam moments"),
        Part("workspace", gib(CUBLAS_WORKSPACE_BYTES), "cuBLAS workspace (torch's caching allocator; Hopper's size)"),
        Part("activations", gib(kept + recomputed), act_how),
        Part("logprobs", gib(logprobs), logprob_how),
        Part("reference", 0.0, "beta > 0 with LoRA: the base with the adapter disabled (shared)" if cfg.grpo.beta > 0
             else "beta = 0: no reference model"),
    ]
    notes: list[str] = []
    blocker = None
    fixed = gib(lora * 4 + optimizer + CUBLAS_WORKSPACE_BYTES)  # LoRA + optimizer + workspace: held all step
    # The backward runs the loss's first (the log-prob working set), then the layers' one at a time (the recomputed
    # layer, and the LoRA gradients appearing); the checkpointed layer inputs are kept through both.
    training = gib(kept + max(logprobs, recomputed + lora * 4))
    if path == "unsloth+vllm":
        more, peak, reserved, peak_how, notes, blocker = _vllm_peak(
            cfg, card, counts, gib(weights), fixed, training, (generation_rows, tokens, kv_per_token))
        parts += more
    elif path == "plain+vllm colocate":
        share = parse_gpu_memory_utilization(cfg.model.gpu_memory_utilization) or TRL_VLLM_COLOCATE_SHARE
        share_gib = share * card.total_gib
        parts.append(Part("vllm", share_gib, f"TRL colocate vLLM: {share} x {card.total_gib:.1f} GiB, its own "
                          "16-bit copy of the weights and KV cache"))
        peak, reserved = share_gib + gib(weights) + fixed + training, share_gib
        peak_how = f"colocate: vLLM share + weights + {HELD} + {TRAINING}"
    else:
        # transformers generate: the KV cache in the residual stream's dtype (k/v projections return their input's
        # dtype) and the fp32 next-token logits of the last position only (generate passes logits_to_keep=1)
        kv_width = residual / 2
        generate = generation_rows * tokens * kv_per_token * kv_width + generation_rows * shape.vocab_size * 4
        parts.append(Part("generation", gib(generate), f"transformers generate: KV cache of {generation_rows} x "
                          f"{tokens} tokens{' (fp32)' if kv_width == 2 else ''} + fp32 next-token logits"))
        peak, reserved = gib(weights) + fixed + max(gib(generate), training), 0.0
        peak_how = f"weights + {HELD} + max(generation, {TRAINING})"
    return Estimate(card=card, backend=path, parts=parts, peak_gib=peak, peak_how=peak_how, prompt_tokens=prompt,
                    completion_tokens=completion, notes=notes, blocker=blocker,
                    reserved_gib=reserved)
