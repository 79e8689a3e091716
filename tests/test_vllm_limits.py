"""`grpo train --check` refuses first what the vLLM engine a run starts will refuse, naming the option (exit 2):
pipeline/backends/vllm_engine.py, its rules read from the installed vLLM. A table over the class: head size,
max_model_len (the model's and the data's), LoRA rank, memory share, tensor parallel size; and one --check end to end.
"""

from __future__ import annotations

import pytest

from tests.vllm_helpers import REAL_VLLM

pytestmark = REAL_VLLM


def _config(name: str = "tiny-demo-vllm", **changes):
    from transformers import AutoConfig

    from grpo_pipeline.pipeline.demo.registry import builtin_model

    config = AutoConfig.from_pretrained(str(builtin_model(name).folder()))
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def _settings(**overrides):
    from train_helpers import demo_config

    return demo_config("/tmp/unused", model_name_or_path="tiny-demo-vllm", vllm_mode="colocate",
                                        **overrides)


# (case, model config, recipe's TRL args, settings overrides, longest request, share, WORLD_SIZE, refused option)
CASES = [
    ("fits", lambda: _config(), {}, {}, 256, 0.01, "1", None),
    ("head size 16 (tiny-demo)", lambda: _config("tiny-demo"), {}, {}, 256, 0.01, "1", "vllm_mode"),
    ("head size 48", lambda: _config(head_dim=48), {}, {}, 256, 0.01, "1", "vllm_mode"),
    ("head size 128", lambda: _config(head_dim=128), {}, {}, 256, 0.01, "1", None),
    ("max_model_len above the model's", lambda: _config(), {"vllm_max_model_length": 4096}, {}, 256, 0.01, "1",
     "vllm_max_model_length"),
    ("max_model_len below the data", lambda: _config(), {"vllm_max_model_length": 128}, {}, 256, 0.01, "1",
     "vllm_max_model_length"),
    ("the data above the model's length", lambda: _config(), {}, {}, 600, 0.01, "1", "max_seq_length"),
    ("a LoRA rank vLLM lacks", lambda: _config(), {}, {"max_lora_rank": 24}, 256, 0.01, "1", "max_lora_rank"),
    ("all of the memory", lambda: _config(), {}, {}, 256, 1.0, "1", "gpu_memory_utilization"),
    ("tensor parallel 3 of 2 processes", lambda: _config(), {"vllm_tensor_parallel_size": 3}, {}, 256, 0.01, "2",
     "vllm_tensor_parallel_size"),
]


@pytest.mark.parametrize("case, config, trl_args, overrides, longest, share, world, refused", CASES,
                         ids=[c[0] for c in CASES])
def test_the_check_refuses_what_the_engine_would_naming_the_option(monkeypatch, case, config, trl_args, overrides,
                                                                   longest, share, world, refused):
    from grpo_pipeline.pipeline.backends import load_backend
    from grpo_pipeline.pipeline.backends.vllm_engine import check_engine
    from grpo_pipeline.pipeline.config import ConfigError

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # vLLM then checks the share against free RAM
    monkeypatch.setenv("WORLD_SIZE", world)
    settings = _settings(**overrides)
    if refused is None:
        assert "takes the model" in check_engine(load_backend("plain"), settings, trl_args, config, longest, share)
        return
    with pytest.raises(ConfigError) as error:
        check_engine(load_backend("plain"), settings, trl_args, config, longest, share)
    assert error.value.field == refused, str(error.value)


def test_the_head_size_rule_is_vllms_own():
    """The sizes vLLM's CPU attention takes, read from it: every one passes, the sizes between them are refused."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from grpo_pipeline.pipeline.backends.vllm_engine import check_head_size
    from grpo_pipeline.pipeline.config import ConfigError

    taken = CPUAttentionBackend.get_supported_head_sizes()
    for size in range(16, max(taken) + 1, 16):
        if size in taken:
            check_head_size(size, "m")
        else:
            with pytest.raises(ConfigError):
                check_head_size(size, "m")


def test_check_refuses_a_model_whose_heads_the_cpu_engine_cannot_take_before_it_loads(tmp_path):
    """End to end: --check (run_checks) on the CPU demo with the 16-wide heads of tiny-demo and vllm_mode colocate
    names vllm_mode, with the fix, and leaves the other checks' results as they were."""
    from grpo_pipeline.pipeline.config import ConfigError
    from grpo_pipeline.pipeline.preflight import run_checks
    from train_helpers import demo_config

    cfg = demo_config(tmp_path / "run", model_name_or_path="tiny-demo", vllm_mode="colocate", min_p=None)
    results = run_checks(cfg, stop_at_first=False)
    [engine] = [c for c in results if c.name == "engine"]
    assert not engine.ok and "heads are 16 wide" in engine.message and "vllm_mode: none" in engine.message
    assert all(c.ok for c in results if c.name != "engine"), [c for c in results if not c.ok]
    with pytest.raises(ConfigError) as refused:
        run_checks(cfg)
    assert refused.value.field == "vllm_mode"


def test_vllms_engine_process_dying_is_an_environments_fault_exit_2(capsys):
    """vLLM's own EngineDeadError (its engine core process died: most often the out-of-memory killer): exit 2 with
    what happened and the fix, never "a bug in grpo-pipeline"."""
    from vllm.v1.engine.exceptions import EngineDeadError

    from grpo_pipeline.pipeline.errors import run_command

    def dies(argv):
        raise EngineDeadError()

    assert run_command("generate", dies, []) == 2
    output = capsys.readouterr().err
    assert "vLLM's engine process died" in output and "gpu_memory_utilization" in output and "bug" not in output
