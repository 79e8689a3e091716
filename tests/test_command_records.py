"""Every value a command reads from a record (an adapter's grpo_adapter.json, a run's manifest.json) is overridable by
that command's own options (issue 59 item 4): one rule, record < --config < the command's flags
(pipeline/infer/session.py command_values), for generate, eval and export; and each message's advice names an option
the command takes: followed, it works."""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import re
import sys
import types
from pathlib import Path

import pytest

from grpo_pipeline.pipeline.infer import session
from tests.vllm_helpers import needs_vllm

RECORD = {"gpu_memory_utilization": "0.9", "max_seq_length": 512, "vllm_mode": "colocate", "max_lora_rank": 8,
          "system_prompt": "recorded", "load_in_4bit": False, "fast_inference": True, "dtype": "float32"}
# another value for each recorded field, as a recipe passed as --config sets it
MINE = {"gpu_memory_utilization": "0.4", "max_seq_length": 256, "vllm_mode": "none", "max_lora_rank": 64,
        "system_prompt": "mine", "load_in_4bit": True, "fast_inference": False, "dtype": "bfloat16"}
FLAGS = {"gpu_memory_utilization": "0.3", "max_lora_rank": 128, "system_prompt": "flag"}


def _parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    if command == "export":
        session.add_config_argument(parser)
        parser.add_argument("--system_prompt", default=None)
        parser.add_argument("--backend", default="auto")
    else:
        session.add_inference_arguments(parser)
    return parser


def _args(command: str, *words: str) -> argparse.Namespace:
    return _parser(command).parse_args([*(["--lora", "x"] if command != "export" else []), *words])


MANIFEST = {"config": RECORD, "system_prompt": "recorded", "max_lora_rank": 8, "max_completion_length": 24}


@pytest.mark.parametrize("command", ["generate", "eval", "export"])
@pytest.mark.parametrize("field", sorted(RECORD))
def test_config_overrides_each_recorded_value_and_a_flag_overrides_both(tmp_path, command, field):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(f"{field}: {json.dumps(MINE[field])}\n")
    assert session.command_values(_args(command), MANIFEST).get(field) == RECORD[field]
    given = session.command_values(_args(command, "--config", str(recipe)), MANIFEST)
    assert given.get(field) == MINE[field] and given.source(field) == f"--config {recipe}"
    option = f"--{field}"
    if option in _parser(command)._option_string_actions:
        flagged = session.command_values(_args(command, "--config", str(recipe), option, str(FLAGS[field])), MANIFEST)
        assert str(flagged.get(field)) == str(FLAGS[field]) and flagged.source(field) == option


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_the_engine_serving_one_adapter_gets_its_rank_below_a_recipe_and_the_flag(tmp_path, command):
    """max_lora_rank: the adapter's own r over the record's (the training engine's limit), as the record's value was;
    a recipe passed as --config and --max_lora_rank still win."""
    given = session.command_values(_args(command), {**MANIFEST, "max_lora_rank": 64}, adapter_rank=4)
    assert given.get("max_lora_rank") == 4 and "adapter's rank" in given.source("max_lora_rank")
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("max_lora_rank: 32\n")
    assert session.command_values(_args(command, "--config", str(recipe)), MANIFEST, adapter_rank=4).get(
        "max_lora_rank") == 32
    assert session.command_values(_args(command, "--config", str(recipe), "--max_lora_rank", "16"), MANIFEST,
                                  adapter_rank=4).get("max_lora_rank") == 16


@pytest.mark.xdist_group("vllm")  # on the worker that imports vLLM anyway
@needs_vllm
@pytest.mark.parametrize("rank", [1, 2, 4, 8, 12, 16, 17, 64, 100, 320, 512])
def test_an_adapters_rank_becomes_the_smallest_lora_rank_vllm_takes_that_holds_it(rank):
    import typing

    from vllm.config.lora import MaxLoRARanks

    from grpo_pipeline.pipeline.backends.vllm_engine import check_lora_rank, slot_rank

    slots = slot_rank(rank)
    check_lora_rank(slots)  # one vLLM takes
    assert slots >= rank and not [r for r in typing.get_args(MaxLoRARanks) if rank <= r < slots]


def test_every_inference_flag_that_names_a_recorded_field_is_read_by_the_rule():
    """A flag of generate/eval named as a config field is one the merge reads (or one whose own rule reads it)."""
    from grpo_pipeline.pipeline.config.fields import field_names

    flags = {a.dest for a in _parser("generate")._actions} & set(field_names())
    own_rules = {"trust_remote_code", "tools", "environment_factory",
                 "temperature", "top_p", "max_tokens"}  # the sampling flags: gen_* (generation_settings), not recorded
    assert flags <= set(session.FIELD_OPTIONS) | own_rules, flags


_ADVICE = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)")


def _fake_vllm(monkeypatch, free_share: float, started: list):
    """vLLM's LLM at its start-up memory check (the GPU boundary): more than `free_share` is refused as vLLM refuses
    it (ValueError naming memory); a share that fits is recorded and stops the command there."""
    class LLM:
        def __init__(self, **kwargs):
            share = kwargs.get("gpu_memory_utilization")
            if share is None or share > free_share:
                raise ValueError(f"Free memory on device is less than desired GPU memory utilization ({share}).")
            started.append(share)
            raise KeyboardInterrupt("the engine started")

    fake = types.ModuleType("vllm")
    fake.__spec__, fake.LLM = importlib.machinery.ModuleSpec("vllm", None), LLM
    monkeypatch.setitem(sys.modules, "vllm", fake)
    from grpo_pipeline.pipeline.backends import vllm_engine

    monkeypatch.setattr(vllm_engine, "on_cpu_build", lambda: False)  # the platform: a GPU
    vllm_engine.release_shared_engine()


@pytest.fixture(scope="module")
def recorded_adapter(tmp_path_factory) -> Path:
    """A real LoRA of the built-in tiny model, whose record says a GPU recipe's vLLM share (0.9)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path
    from grpo_pipeline.pipeline.run.manifest import build_manifest, write_adapter_metadata

    folder = tmp_path_factory.mktemp("recorded") / "lora"
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-demo"))
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])).save_pretrained(str(folder))
    config = {"backend": "plain", "vllm_mode": "colocate", "gpu_memory_utilization": "0.9", "max_lora_rank": 8}
    write_adapter_metadata(folder, build_manifest(
        cfg_dict=config, backend="plain", base_model="tiny-demo", system_prompt="s", chat_template=None,
        max_prompt_length=64, max_completion_length=8, data_fingerprint="f", adapter_dir=folder))
    return folder


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_following_the_memory_advice_of_generate_and_eval_starts_the_engine(recorded_adapter, tmp_path, monkeypatch,
                                                                            capsys, command):
    """Seen: "vLLM could not start with gpu_memory_utilization 0.9 ... Set gpu_memory_utilization in the recipe (or
    --config)", which generate and eval never read. The advice now names an option the command takes; followed, the
    engine gets that share."""
    from grpo_pipeline.pipeline import cli

    started: list = []
    _fake_vllm(monkeypatch, 0.5, started)
    monkeypatch.chdir(tmp_path)
    argv = [command, "--lora", str(recorded_adapter), "--backend", "plain",
            *(["--prompt", "1+1?"] if command == "generate" else ["--data", "demo-arithmetic", "--limit", "1",
                                                                  "--output", str(tmp_path / "e.json")])]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "gpu_memory_utilization 0.9" in err, err
    options = _ADVICE.findall(err.split("could not start", 1)[1])
    parser_options = _parser(command)._option_string_actions
    assert options and all(option in parser_options for option in options), (options, err)
    assert "--gpu_memory_utilization" in options
    assert cli.main([*argv, "--gpu_memory_utilization", "0.4"]) == 130
    assert started == [0.4]
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("gpu_memory_utilization: 0.45\n")
    assert cli.main([*argv, "--config", str(recipe)]) == 130  # or the same field in the recipe passed as --config
    assert started == [0.4, 0.45]


BAD_ROWS = {  # a row of an input file that cannot be used: (its bytes, what the message says)
    "not JSON": (b'{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?" "answer": "4"}\n', "line 2"),
    "not UTF-8": (b'{"prompt": "1+1?", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "4"}\n', "line 2"),
}


@pytest.mark.parametrize("command", ["generate", "eval"])
@pytest.mark.parametrize("bad", BAD_ROWS)
def test_a_bad_row_of_an_input_file_is_located_exit_2(recorded_adapter, tmp_path, monkeypatch, capsys, command,
                                                      bad):
    """generate --input and eval --data: the file, the line and what is wrong, exit 2; the record's vLLM mode is
    overridden by --config (item 4) so that the CPU's transformers path answers."""
    from grpo_pipeline.pipeline import cli

    monkeypatch.chdir(tmp_path)
    data, where = BAD_ROWS[bad]
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(data)
    recipe = tmp_path / "cpu.yaml"
    recipe.write_text("vllm_mode: none\n")
    argv = [command, "--lora", str(recorded_adapter), "--backend", "plain", "--config", str(recipe),
            *(["--input", str(rows)] if command == "generate" else ["--data", str(rows), "--output",
                                                                    str(tmp_path / "e.json")])]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert str(rows) in err and where in err and "Traceback" not in err, err
    assert "the adapter's" not in err.split("error:", 1)[1], err  # options given here are not "the adapter's"
