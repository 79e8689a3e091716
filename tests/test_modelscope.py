"""`model_source: modelscope`, offline: the real `modelscope` package with only its download functions replaced
by ones that copy a local folder (the network boundary); tokenizer, model, data, --check and Unsloth's switch run
as they are."""

from __future__ import annotations

import inspect
import json
import shutil
import sys
from pathlib import Path

import pytest

import modelscope
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig
from grpo_pipeline.pipeline.demo.registry import builtin_model
from tests.unsloth_helpers import fake  # noqa: F401  (the fixture)

ZH_ROWS = {
    "train": [{"question_zh-cn": "小明有 5 个苹果，又买了 3 个，一共有几个？", "answer_only": 8},
              {"question_zh-cn": "一支笔 3 元，4 支笔多少钱？", "answer_only": 12}],
    "test": [{"question_zh-cn": "一本书 7 元，两本多少钱？", "answer_only": 14}],
}


@pytest.fixture
def modelscope_hub(tmp_path, monkeypatch):
    """ModelScope's two download functions, serving a local 'hub': `models/<id>` and `datasets/<id>` folders."""
    hub, calls = tmp_path / "ms-hub", []
    model_dir = hub / "models" / "Qwen" / "Qwen2.5-0.5B-Instruct"
    shutil.copytree(builtin_model("tiny-qwen2.5").folder(), model_dir)
    data_dir = hub / "datasets" / "someone" / "gsm8k_zh"
    data_dir.mkdir(parents=True)
    for split, rows in ZH_ROWS.items():
        (data_dir / f"{split}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                                 encoding="utf-8")

    def serve(kind, real):
        signature = inspect.signature(real)  # calls must fit the real function, or the stub refuses them

        def download(*args, **kwargs):
            arguments = signature.bind(*args, **kwargs).arguments
            repo_id = arguments.get("model_id") or arguments.get("dataset_id") or arguments.get("repo_id")
            calls.append((kind, repo_id, arguments.get("revision")))
            source = hub / kind / repo_id
            if not source.is_dir():
                raise ValueError(f"{repo_id} not found on the (local) hub")
            target = tmp_path / "ms-cache" / kind / repo_id
            if not target.exists():
                shutil.copytree(source, target)
            return str(target)
        return download

    monkeypatch.setattr(modelscope, "snapshot_download", serve("models", modelscope.snapshot_download))
    monkeypatch.setattr(modelscope, "dataset_snapshot_download",
                        serve("datasets", modelscope.dataset_snapshot_download))
    return calls


def test_the_model_and_tokenizer_come_from_modelscope_only_when_asked(modelscope_hub):
    from grpo_pipeline.pipeline.backends import plain
    from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer, resolve_model_path

    name = "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolve_model_path(name) == name and modelscope_hub == []  # hf: the name goes to transformers as is
    tokenizer = load_tokenizer(name, source="modelscope")
    assert tokenizer.eos_token == "<|im_end|>"
    cfg = PipelineConfig().replace(model_name_or_path=name, model_source="modelscope", load_in_4bit=False)
    model = plain.load_model(name, cfg, for_training=False)
    assert model.config.model_type == "qwen2"
    assert modelscope_hub == [("models", name, None)] * 2
    local = resolve_model_path(str(Path(model.name_or_path)), "modelscope")  # a local folder is never downloaded
    assert local == str(Path(model.name_or_path)) and len(modelscope_hub) == 2


def test_a_hub_dataset_comes_from_modelscope_and_is_saved_for_offline_runs(modelscope_hub, tmp_path):
    from grpo_pipeline.pipeline.data.source_spec import source_spec
    from grpo_pipeline.pipeline.data.sources import resolve_source

    cfg = PipelineConfig().replace(model_source="modelscope", dataset_name="someone/gsm8k_zh", dataset_config=None,
                                   question_field="question_zh-cn", answer_field="answer_only")
    source = resolve_source(cfg, source_spec(cfg, "train"), tmp_path / "cache")
    assert source.description["source"] == "modelscope" and "modelscope" in source.description["saved_copy"]
    rows = source.load()
    assert rows.questions == [r["question_zh-cn"] for r in ZH_ROWS["train"]] and rows.answers == [8, 12]
    assert resolve_source(cfg, source_spec(cfg, "train", "test"),
                          tmp_path / "cache").load().answers == [14]
    assert modelscope_hub == [("datasets", "someone/gsm8k_zh", None)]  # the second split: from the saved copy
    hf = resolve_source(cfg.replace(model_source="hf"), source_spec(cfg, "train"),
                        tmp_path / "cache")
    assert hf.identity != source.identity  # the cache never mixes the two hubs' copies

    wrong = cfg.replace(question_field="question")
    with pytest.raises(ConfigError, match="question_field.*question_zh-cn"):
        resolve_source(wrong, source_spec(wrong, "train"), tmp_path / "cache").load()


def test_a_missing_dataset_names_the_id_and_the_fixes(modelscope_hub, tmp_path):
    from grpo_pipeline.pipeline.data.source_spec import source_spec
    from grpo_pipeline.pipeline.data.sources import resolve_source

    cfg = PipelineConfig().replace(model_source="modelscope", dataset_name="nobody/none", dataset_config=None)
    with pytest.raises(RuntimeError,
                       match=r"(?s)could not download dataset 'nobody/none' from ModelScope.*network_turbo"):
        resolve_source(cfg, source_spec(cfg, "train"), tmp_path / "cache").load()


def test_check_reports_a_missing_modelscope_package_with_the_install_command(monkeypatch, tmp_path):
    from grpo_pipeline.pipeline.preflight import run_checks

    monkeypatch.setitem(sys.modules, "modelscope", None)  # what find_spec sees when it is not installed
    cfg = PipelineConfig().replace(model_source="modelscope", model_name_or_path="tiny-qwen2.5",
                                   dataset_name="sample", output_dir=str(tmp_path / "out"), backend="plain")
    checks = {c.name: c for c in run_checks(cfg, stop_at_first=False)}
    assert not checks["packages"].ok
    assert "pip install 'grpo-pipeline[modelscope]'" in checks["packages"].message
    assert "`model_source`" in checks["packages"].message
    assert checks["model"].ok  # a built-in model needs no hub


def test_model_source_is_a_choice_field():
    from grpo_pipeline.pipeline.config import validate

    with pytest.raises(ConfigError, match="model_source"):
        validate(PipelineConfig().replace(model_source="huggingface"), n_processes=1)


def test_unsloth_reads_its_modelscope_switch_at_import(fake, monkeypatch):  # noqa: F811 (the fixture)
    from grpo_pipeline.pipeline.backends import unsloth_setup
    from tests.unsloth_helpers import make_cfg

    monkeypatch.setenv("UNSLOTH_USE_MODELSCOPE", "0")  # restored after the test: prepare_environment sets it
    unsloth_setup.prepare_environment(make_cfg(model_source="modelscope"))
    assert fake.STATE.modelscope_at_import == "1"


def test_unsloth_switch_is_off_for_hf_even_when_exported(fake, monkeypatch):  # noqa: F811 (the fixture)
    from grpo_pipeline.pipeline.backends import unsloth_setup
    from tests.unsloth_helpers import make_cfg

    monkeypatch.setenv("UNSLOTH_USE_MODELSCOPE", "1")
    unsloth_setup.prepare_environment(make_cfg())
    assert fake.STATE.modelscope_at_import == "0"


def test_the_bootstrap_hands_model_source_to_prepare_environment():
    from grpo_pipeline.pipeline.bootstrap import _early_settings

    _, settings = _early_settings("train", ["--backend", "plain", "--model_source", "modelscope"])
    assert settings["model_source"] == "modelscope"


def test_grpo_env_says_which_hub_is_in_use_and_whether_each_answers(monkeypatch):
    import contextlib

    import grpo_pipeline.env.hubs
    from grpo_pipeline.env.doctor import render_text
    from grpo_pipeline.env.report import collect_report

    def connect(address, timeout):  # the network boundary: only the Hugging Face mirror answers
        if address[0] != "hf-mirror.com":
            raise OSError("unreachable")
        return contextlib.nullcontext()

    monkeypatch.setattr(grpo_pipeline.env.hubs.socket, "create_connection", connect)
    monkeypatch.setenv("HF_ENDPOINT", "https://hf-mirror.com")
    monkeypatch.setitem(sys.modules, "modelscope", None)
    report = collect_report(model_source="modelscope")
    rows = {row["source"]: row for row in report["hubs"]["sources"]}
    assert report["hubs"]["in_use"] == "modelscope"
    assert rows["hf"]["reachable"] and rows["hf"]["endpoint"] == "https://hf-mirror.com"
    assert not rows["modelscope"]["reachable"] and rows["modelscope"]["install"] == grpo_pipeline.env.hubs.MODELSCOPE_INSTALL
    text = render_text(report)
    assert "*modelscope" in text and "NOT reachable; not installed: pip install 'grpo-pipeline[modelscope]'" in text


# ------------------------------------------------------------------ ModelScope through Unsloth's own loader
MS_ID = "Qwen/Qwen2.5-0.5B-Instruct"  # on the local hub of `modelscope_hub`


def _import_unsloth_with(monkeypatch, modelscope: str):
    """`import unsloth` (the double) with UNSLOTH_USE_MODELSCOPE as given: the wheel reads it then, only then."""
    monkeypatch.setenv("UNSLOTH_USE_MODELSCOPE", modelscope)
    import unsloth

    return unsloth.FastLanguageModel


@pytest.mark.usefixtures("fake")
def test_the_double_fetches_a_hub_id_from_modelscope_and_names_the_model_by_it(monkeypatch, modelscope_hub):
    # unsloth/models/loader.py FastLanguageModel.from_pretrained: `if USE_MODELSCOPE and not os.path.exists(...)`
    # -> modelscope.snapshot_download(model_name); then _record_modelscope_repo_id names the model by the repo id.
    flm = _import_unsloth_with(monkeypatch, "1")
    model, _ = flm.from_pretrained(model_name=MS_ID, fast_inference=False)
    assert modelscope_hub == [("models", MS_ID, None)]
    assert model.config._name_or_path == MS_ID


@pytest.mark.usefixtures("fake")
def test_the_double_reads_modelscope_at_import_and_never_downloads_a_local_folder(monkeypatch, modelscope_hub,
                                                                                 tmp_path):
    flm = _import_unsloth_with(monkeypatch, "1")
    model, _ = flm.from_pretrained(model_name=str(tmp_path), fast_inference=False)
    assert modelscope_hub == [] and model.config._name_or_path == str(tmp_path)
    sys.modules.pop("unsloth")  # a fresh `import unsloth` ...
    flm = _import_unsloth_with(monkeypatch, "0")
    monkeypatch.setenv("UNSLOTH_USE_MODELSCOPE", "1")  # ... and the variable set after it: no effect
    flm.from_pretrained(model_name=MS_ID, fast_inference=False)
    assert modelscope_hub == []


@pytest.mark.usefixtures("fake")
def test_the_double_raises_where_the_modelscope_download_raises(monkeypatch, modelscope_hub):
    flm = _import_unsloth_with(monkeypatch, "1")
    with pytest.raises(ValueError, match="nobody/none not found"):  # the first branch does not catch it
        flm.from_pretrained(model_name="nobody/none", fast_inference=False)


@pytest.mark.usefixtures("fake")
def test_the_double_loads_an_adapters_base_from_modelscope_or_else_the_hub(monkeypatch, modelscope_hub, tmp_path):
    # _modelscope_snapshot_or_none: the adapter's base by repo id from ModelScope; a failed download warns and
    # loads it from the Hugging Face Hub instead (the name stays the repo id either way).
    flm = _import_unsloth_with(monkeypatch, "1")
    for base in (MS_ID, "nobody/none"):
        adapter = tmp_path / base.replace("/", "_")
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base, "r": 8,
                                                                 "lora_alpha": 16, "target_modules": ["q_proj"]}))
        model, _ = flm.from_pretrained(model_name=str(adapter), fast_inference=False)
        assert model.config._name_or_path == base and model.peft_config
    assert [call[1] for call in modelscope_hub] == [MS_ID, "nobody/none"]


def _loaded_names(double):
    return [call.kwargs["model_name"] for call in double.calls_named("FastLanguageModel.from_pretrained")]


@pytest.mark.parametrize("fast_inference", [True, False])
def test_the_unsloth_backend_hands_unsloth_the_hub_id_for_modelscope(fake, monkeypatch, modelscope_hub,  # noqa: F811
                                                                     tmp_path, fast_inference):
    """Unsloth maps the name (mapper.py), downloads it and records the repo id only for a name that is not a
    local folder: the backend never resolves a ModelScope snapshot itself (the plain backend does)."""
    from grpo_pipeline.pipeline.backends import unsloth as backend
    from tests.unsloth_helpers import make_cfg, train_and_save_adapter

    monkeypatch.setenv("UNSLOTH_USE_MODELSCOPE", "0")  # restored after the test: prepare_environment sets it
    cfg = make_cfg(model_name_or_path=MS_ID, model_source="modelscope", fast_inference=fast_inference,
                   vllm_standby="false", output_dir=str(tmp_path / "run"))
    adapter = train_and_save_adapter(fake, cfg, tmp_path / "lora")
    assert fake.STATE.modelscope_at_import == "1"
    assert adapter.base_model_name_or_path == MS_ID  # the repo id, not a folder of this machine
    backend.load_generator(MS_ID, None, cfg)
    backend.load_generator(MS_ID, adapter, cfg)
    names = _loaded_names(fake)
    assert names[:2] == [MS_ID, MS_ID] and all(not Path(name).is_dir() or name == str(adapter.path)
                                               for name in names), names
    assert {call[1] for call in modelscope_hub} == {MS_ID}  # every download was Unsloth's, by the hub id
