"""The base model a run, an adapter or an export names: a hub id or a built-in name, never a folder of this machine.

Every writer of a base name (manifest.json, lora/ and best_lora/'s adapter_config.json and grpo_adapter.json, a
checkpoint's adapter_config.json, the export's marker and grpo_adapter.json) goes through one function,
pipeline/run/manifest.py recorded_base, tested here over {hub model, ModelScope-resolved model, built-in model};
and the "other base" warning (pipeline/backends/unsloth.py _warn_if_other_base) compares those names, not the
last part of a cache path.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from grpo_pipeline.pipeline.demo.registry import builtin_model
from grpo_pipeline.pipeline.run.manifest import (ADAPTER_METADATA_NAME, build_manifest, other_base, recorded_base,
                                   write_adapter_metadata)
from tests.fake_models import _write_tiny_safetensors
from tests.unsloth_helpers import IMPORT_ORDER_WARNINGS
from tests.unsloth_helpers import fake  # noqa: F401 (a fixture the tests take)

HUB_ID = "Qwen/Qwen2.5-0.5B-Instruct"


def _loaded(kind: str, tmp_path: Path) -> tuple[str, str]:
    """(the name the recipe gives, what the loaded model calls itself, so what peft/Unsloth save as its base)."""
    if kind == "hub":
        return HUB_ID, HUB_ID
    if kind == "modelscope":  # the plain backend's snapshot_download folder (ModelScope escapes dots)
        snapshot = tmp_path / "modelscope" / "models" / "Qwen" / "Qwen2___5-0___5B-Instruct"
        snapshot.mkdir(parents=True)
        return HUB_ID, str(snapshot)
    return "tiny-demo", str(builtin_model("tiny-demo").folder())


KINDS = ("hub", "modelscope", "builtin")


def _manifest(base_model: str, tmp_path: Path) -> dict:
    return build_manifest(cfg_dict={}, backend="plain", base_model=base_model, system_prompt="s", chat_template=None,
                          max_prompt_length=8, max_completion_length=8, data_fingerprint="f",
                          adapter_dir=tmp_path / "lora")


def _saved_adapter(folder: Path, base: str | None) -> Path:
    """A folder as peft's save_pretrained / Unsloth's save_lora leave it: adapter_config.json names `base`."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4,
                                                            "target_modules": ["q_proj"],
                                                            "base_model_name_or_path": base}))
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    _write_tiny_safetensors(folder / "adapter_model.safetensors",
                            {f"{prefix}.lora_A.weight": (2, 16), f"{prefix}.lora_B.weight": (16, 2)})
    return folder


@pytest.mark.parametrize("kind", KINDS)
def test_the_manifest_records_the_hub_id_or_the_builtin_name(kind, tmp_path):
    configured, _ = _loaded(kind, tmp_path)
    assert _manifest(configured, tmp_path)["base_model"] == configured


@pytest.mark.parametrize("kind", KINDS)
def test_a_saved_adapter_records_the_hub_id_or_the_builtin_name(kind, tmp_path):
    """lora/ (pipeline/train.py) and best_lora/ (periodic_eval.py): the backend saves, write_adapter_metadata
    describes; adapter_config.json is what peft, Unsloth and vLLM read the base from."""
    configured, loaded = _loaded(kind, tmp_path)
    adapter = _saved_adapter(tmp_path / "lora", loaded)
    write_adapter_metadata(adapter, _manifest(configured, tmp_path))
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == configured
    assert json.loads((adapter / ADAPTER_METADATA_NAME).read_text())["base_model"] == configured


def test_unsloths_own_hub_name_for_the_weights_is_kept():
    # Unsloth maps a 16-bit name to its pre-quantised repo (mapper.py) and records that: a hub id, kept.
    assert recorded_base(HUB_ID, "unsloth/qwen2.5-0.5b-instruct-unsloth-bnb-4bit") == \
        "unsloth/qwen2.5-0.5b-instruct-unsloth-bnb-4bit"
    assert recorded_base(HUB_ID, None) == HUB_ID


def test_a_local_model_folder_is_recorded_absolutely(tmp_path, monkeypatch):
    (tmp_path / "my-model").mkdir()
    monkeypatch.chdir(tmp_path)
    assert recorded_base("my-model", "my-model") == str(tmp_path / "my-model")


@IMPORT_ORDER_WARNINGS
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("fake")
def test_an_export_records_the_hub_id_or_the_builtin_name(kind, tmp_path, monkeypatch):
    """`grpo export` (pipeline/infer/export.py) of an adapter as training saved it: its marker and the
    grpo_adapter.json it carries name the base; the merge goes through the Unsloth double (no download)."""
    from grpo_pipeline.env.path_check import EXPORT_MARKER
    from grpo_pipeline.pipeline.infer import export

    configured, loaded = _loaded(kind, tmp_path)
    adapter = _saved_adapter(tmp_path / "run" / "lora", loaded)
    # the network boundary
    monkeypatch.setattr("grpo_pipeline.pipeline.data.model_check.check_model", lambda name, source="hf": name)
    monkeypatch.setattr("grpo_pipeline.pipeline.infer.session.adapter_mismatch", lambda adapter, base: None)
    write_adapter_metadata(adapter, _manifest(configured, tmp_path))
    out = tmp_path / "merged"
    assert export.main(["--lora", str(adapter), "--to", "merged16", "--out", str(out), "--backend", "unsloth"]) == 0
    assert json.loads((out / EXPORT_MARKER).read_text())["base_model"] == configured
    assert json.loads((out / ADAPTER_METADATA_NAME).read_text())["base_model"] == configured


def test_a_checkpoint_records_the_builtin_name(tmp_path):
    """checkpoint-N/ (pipeline/run/checkpoints.py stage_checkpoint_saves): transformers' Trainer saves the adapter,
    naming whatever the in-memory model calls itself."""
    from tests.test_checkpoints_rules import real_trainer

    from grpo_pipeline.pipeline.run.checkpoints import list_checkpoints

    trainer = real_trainer(tmp_path / "run", max_steps=1)  # demo_config: model_name_or_path tiny-demo
    trainer.train()
    (checkpoint,) = list_checkpoints(tmp_path / "run")
    assert json.loads((checkpoint / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny-demo"


# ------------------------------------------------------------------ the "other base" warning
@pytest.mark.parametrize(("recorded", "given"), [
    ("tiny-demo", "tiny-demo"),
    (HUB_ID, HUB_ID),
    ("unsloth/qwen2.5-0.5b-instruct-unsloth-bnb-4bit", HUB_ID),  # Unsloth's 4-bit repo of the same model
    ("unsloth/Qwen2.5-0.5B-Instruct", HUB_ID),
    # an adapter saved before the names were recorded: a cache or snapshot folder says nothing about a hub id
    ("/root/.cache/grpo-pipeline/tiny-demo-2", "tiny-demo"),
    ("/root/.cache/modelscope/models/Qwen/Qwen2___5-0___5B-Instruct", HUB_ID),
    ("/data/ms/hub/models--Qwen--Qwen2.5-0.5B-Instruct/snapshots/0123abc", HUB_ID),
])
def test_the_same_base_is_not_another_base(recorded, given):
    assert not other_base(recorded, given)


@pytest.mark.parametrize(("recorded", "given"), [
    ("tiny-demo", "tiny-qwen2.5"),
    ("tiny-demo", HUB_ID),
    ("Qwen/Qwen2.5-1.5B-Instruct", HUB_ID),
    ("unsloth/qwen2.5-1.5b-instruct-unsloth-bnb-4bit", HUB_ID),
])
def test_another_base_is_another_base(recorded, given):
    assert other_base(recorded, given)


@IMPORT_ORDER_WARNINGS
@pytest.mark.usefixtures("fake")
def test_the_unsloth_backend_warns_for_another_base_only(tmp_path):
    from grpo_pipeline.env.adapters import verify_adapter_dir
    from grpo_pipeline.pipeline.backends import unsloth as backend
    from tests.unsloth_helpers import make_cfg

    adapter = _saved_adapter(tmp_path / "lora", "tiny-demo")
    info = verify_adapter_dir(adapter)
    cfg = make_cfg(fast_inference=False, vllm_standby="false", output_dir=str(tmp_path / "run"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend.load_generator("tiny-demo", info, cfg)
    assert not [w for w in caught if "produces garbage" in str(w.message)]
    with pytest.warns(UserWarning, match="trained on 'tiny-demo'.*'tiny-qwen2.5' was given.*produces garbage"):
        backend.load_generator("tiny-qwen2.5", info, cfg)
