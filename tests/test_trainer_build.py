"""pipeline/trainer/build.py on the real plain backend: the resume step reaches metrics.jsonl at construction,
and TRL's model card names the base model and dataset the user chose (or is not written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_pipeline.pipeline.backends import plain
from grpo_pipeline.pipeline.data.prepare import prepare_dataset
from grpo_pipeline.pipeline.trainer.agents import resolve_agents
from grpo_pipeline.pipeline.trainer.build import ModelCard, build_trainer, is_hub_id
from tests.train_helpers import demo_config


@pytest.fixture
def built(tmp_path):
    def build(resume_step=None):
        cfg = demo_config(tmp_path / "run")
        out = Path(cfg.grpo.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        model, tokenizer = plain.load_for_training(cfg)
        prepared = prepare_dataset(cfg, tokenizer, report_dir=out)
        trainer, _ = build_trainer(resolve_agents(cfg.grpo), plain,
                                   cfg, model, tokenizer, prepared, plain.peft_config(cfg), out, resume_step)
        return trainer, out

    return build


def write_metrics(out: Path, steps) -> Path:
    path = out / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 0.1 * s}) + "\n" for s in steps), encoding="utf-8")
    return path


def test_resume_step_drops_the_replaced_metrics_when_training_begins(built, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    path = write_metrics(out, range(1, 6))

    def begin(trainer, main=True):
        trainer.state.is_world_process_zero = main
        trainer.callback_handler.on_train_begin(trainer.args, trainer.state, trainer.control)

    trainer, _ = built(resume_step=3)
    assert len(path.read_text().splitlines()) == 5  # building trims nothing: the main process does, at train begin
    begin(trainer, main=False)  # another rank of a multi-node resume never rewrites the main process's file
    assert len(path.read_text().splitlines()) == 5
    trainer, _ = built(resume_step=3)
    begin(trainer)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    trainer, _ = built(resume_step=None)  # a fresh trainer keeps what is there (the run moves an earlier run aside)
    begin(trainer)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


def test_model_card_names_a_hub_base_and_dataset_and_skips_local_ones(built):
    trainer, out = built()
    trainer.create_model_card(model_name="run")  # the demo's base is a built-in local folder: no card
    assert not (out / "README.md").exists()

    local_name = trainer.model.config._name_or_path
    ModelCard("Qwen/Qwen2.5-0.5B-Instruct", "openai/gsm8k").write(trainer, model_name="run")
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "Qwen/Qwen2.5-0.5B-Instruct" in card and "openai/gsm8k" in card
    assert trainer.model.config._name_or_path == local_name  # restored for everything after the card


def test_is_hub_id():
    assert is_hub_id("Qwen/Qwen2.5-0.5B-Instruct")
    assert not is_hub_id("tiny-demo") and not is_hub_id(None) and not is_hub_id("a/b/c")


def test_trls_trainer_logs_each_reward_under_the_name_the_pipeline_gave_it(tmp_path, monkeypatch):
    """Callable instances and functools.partials used to reach TRL's GRPOTrainer as our guard's wrapper, so TRL
    logged them as rewards/held/mean, all under that one key. TRL reads the name with get_callable_name."""
    (tmp_path / "scoring.py").write_text(
        "import functools\n\n\nclass Scorer:\n    def __init__(self, value):\n        self.value = value\n\n"
        "    def __call__(self, completions, **kwargs):\n        return [self.value for _ in completions]\n\n\n"
        "def _scaled(completions, factor, **kwargs):\n    return [factor for _ in completions]\n\n\n"
        "low, high = Scorer(0.0), Scorer(1.0)\nhalf = functools.partial(_scaled, factor=0.5)\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = demo_config(tmp_path / "run", reward_funcs=["correctness", "scoring:low", "scoring:high", "scoring:half"],
                      reward_weights=[1.0, 1.0, 1.0, 1.0])
    out = Path(cfg.grpo.output_dir)
    out.mkdir(parents=True)
    model, tokenizer = plain.load_for_training(cfg)
    prepared = prepare_dataset(cfg, tokenizer, report_dir=out)
    trainer, _ = build_trainer(resolve_agents(cfg.grpo), plain, cfg,
                               model, tokenizer, prepared, plain.peft_config(cfg), out, None)
    assert trainer.reward_func_names[:4] == ["correctness_reward_func", "low", "high", "half"]  # then the health
    # monitor's zero-weight probe (pipeline/health)
