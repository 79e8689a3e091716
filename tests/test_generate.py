"""generate / eval / export with the tiny demo model's LoRA from a real training run (plain backend, CPU)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from grpo_pipeline.env.file_modes import current_umask
from grpo_pipeline.pipeline.infer import evaluate, export, generate
from grpo_pipeline.pipeline.infer.session import inference_args, open_inference
from grpo_pipeline.pipeline.train import run_training
from train_helpers import demo_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A real 3-step run whose LoRA has moved (digit_share_reward gives the random model's groups variance)."""
    run_dir = tmp_path_factory.mktemp("gen") / "run"
    result = run_training(demo_config(run_dir, max_steps=3, learning_rate=2e-2, max_completion_length="24",
                                      reward_funcs=["correctness", "train_helpers:digit_share_reward"]))
    assert result.status == "completed"
    return run_dir


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_relative_lora_path_works_from_another_cwd(trained_run, tmp_path, monkeypatch):
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    relative = Path(os.path.relpath(trained_run / "lora", elsewhere))
    assert not relative.is_absolute() and (elsewhere / relative).resolve() == (trained_run / "lora").resolve()
    assert generate.main(["--lora", str(relative), "--prompt", "3+4", "--output", "out.jsonl"]) == 0
    [record] = read_jsonl(elsewhere / "out.jsonl")
    assert record["adapter"] == str(trained_run / "lora")  # resolved to the absolute, verified path
    assert set(record) >= {"prompt", "text", "answer", "format_valid", "completion_tokens"}


def test_missing_or_incomplete_adapter_exits_2_with_no_output(trained_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert generate.main(["--lora", "no/such/lora", "--prompt", "1+1", "--output", "out.jsonl"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "no" / "such" / "lora") in err and not (tmp_path / "out.jsonl").exists()

    incomplete = tmp_path / "incomplete"
    shutil.copytree(trained_run / "lora", incomplete)
    (incomplete / "adapter_model.safetensors").unlink()
    assert generate.main(["--lora", str(incomplete), "--prompt", "1+1", "--output", "out.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "adapter_model.safetensors" in err and not (tmp_path / "out.jsonl").exists()


def test_rank_above_max_lora_rank_and_wrong_base_are_refused(trained_run, capsys):
    lora = str(trained_run / "lora")
    assert generate.main(["--lora", lora, "--prompt", "1+1", "--max_lora_rank", "4"]) == 2
    assert "above max_lora_rank=4" in capsys.readouterr().err
    assert generate.main(["--lora", lora, "--prompt", "1+1", "--model", "Qwen/Qwen2.5-0.5B-Instruct"]) == 2
    assert "was trained on 'tiny-demo'" in capsys.readouterr().err


@pytest.mark.parametrize(("option", "value"), [("--temperature", "2.5"), ("--temperature", "-1"),
                                                ("--top_p", "0"), ("--top_p", "1.5")])
def test_sampling_values_outside_vllms_ranges_are_refused_before_loading(trained_run, capsys, option, value):
    assert generate.main(["--lora", str(trained_run / "lora"), "--prompt", "1+1", option, value]) == 2
    err = capsys.readouterr().err
    assert f"{option} {float(value)}" in err and "Traceback" not in err


def test_max_tokens_defaults_from_manifest_and_larger_warns(trained_run):
    manifest = json.loads((trained_run / "manifest.json").read_text())
    setup = open_inference(inference_args(lora=str(trained_run / "lora")))
    assert setup.max_tokens == manifest["max_completion_length"] == 24
    assert setup.system_prompt == manifest["system_prompt"]
    with pytest.warns(UserWarning, match="above the trained max_completion_length 24"):
        open_inference(inference_args(lora=str(trained_run / "lora"), max_tokens=100))


def test_train_recipe_generation_fields_are_the_defaults_and_flags_override(trained_run, tmp_path):
    recipe = tmp_path / "gen.yaml"
    recipe.write_text("model_name_or_path: tiny-demo\ndataset_name: demo-arithmetic\neval_split: test\n"
                      "eval_limit: 3\ngen_temperature: 0.7\ngen_top_p: 0.9\ngen_max_tokens: 12\n")
    lora = str(trained_run / "lora")
    setup = open_inference(inference_args(lora=lora, config=str(recipe)))
    assert (setup.temperature, setup.top_p, setup.max_tokens) == (0.7, 0.9, 12)
    setup = open_inference(inference_args(lora=lora, config=str(recipe), temperature=0.0, max_tokens=20))
    assert (setup.temperature, setup.top_p, setup.max_tokens) == (0.0, 0.9, 20)
    out = tmp_path / "eval.json"  # --config alone: its dataset, eval_split and eval_limit too
    assert evaluate.main(["--lora", lora, "--config", str(recipe), "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["n"], result["split"], result["temperature"], result["max_tokens"]) == (3, "test", 0.7, 12)


def test_recipe_generation_past_the_trained_length_needs_allow_longer_generation(trained_run, tmp_path, capsys):
    import warnings

    recipe = tmp_path / "long.yaml"
    lora = str(trained_run / "lora")
    recipe.write_text("gen_max_tokens: 100\n")  # the run trained with max_completion_length 24
    assert generate.main(["--lora", lora, "--config", str(recipe), "--prompt", "1+1"]) == 2
    err = capsys.readouterr().err
    assert "`gen_max_tokens`" in err and "allow_longer_generation: true" in err and "Traceback" not in err
    recipe.write_text("gen_max_tokens: 100\nallow_longer_generation: true\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # allowed: no "above the trained length" warning either
        assert open_inference(inference_args(lora=lora, config=str(recipe))).max_tokens == 100
    recipe.write_text("gen_top_p: 0\n")
    assert generate.main(["--lora", lora, "--config", str(recipe), "--prompt", "1+1"]) == 2
    assert "`gen_top_p`: got 0" in capsys.readouterr().err


def test_lora_really_applies_and_matches_merged_export(trained_run, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    lora_setup = open_inference(inference_args(lora=str(trained_run / "lora")))
    base_setup = open_inference(inference_args(base=True, run=str(trained_run)))
    assert base_setup.adapter is None and base_setup.base_model == "tiny-demo"
    out = tmp_path / "merged"
    assert export.main(["--lora", str(trained_run / "lora"), "--to", "merged16", "--out", str(out)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()

    prompt = lora_setup.tokenizer.apply_chat_template(
        [{"role": "system", "content": lora_setup.system_prompt}, {"role": "user", "content": "3+4"}],
        tokenize=False, add_generation_prompt=True)
    ids = lora_setup.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        lora_logits = lora_setup.generator.model(ids).logits
        base_logits = base_setup.generator.model(ids).logits
        merged_logits = merged(ids).logits
    assert not torch.allclose(lora_logits, base_logits, atol=1e-4), "the adapter changed nothing"
    with torch.no_grad():  # the export is the adapter merged in float32, then stored in bfloat16
        torch.testing.assert_close(merged_logits, bf16_rounded_merge(lora_setup.generator.model)(ids).logits,
                                   atol=1e-5, rtol=1e-5)


def bf16_rounded_merge(peft_model):
    """The adapter merged into its base in float32 and rounded to bfloat16: what merged16 must hold."""
    import torch

    merged = peft_model.merge_and_unload()
    for param in merged.parameters():
        param.data = param.data.to(torch.bfloat16).to(torch.float32)
    return merged.eval()


def test_merged_export_keeps_the_modules_trained_in_full(tmp_path):
    """The demo's LoRA also trains norms and (untied) input embeddings in full; merged16 must carry them."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path

    run_dir = tmp_path / "run"
    result = run_training(demo_config(run_dir, max_steps=2, learning_rate=2e-2, max_completion_length="24",
                                      lora_modules_to_save=["norm", "embed_tokens"],
                                      reward_funcs=["correctness", "train_helpers:digit_share_reward"]))
    assert result.status == "completed"
    out = tmp_path / "merged"
    assert export.main(["--lora", str(run_dir / "lora"), "--to", "merged16", "--out", str(out)]) == 0
    with open(out / "model.safetensors", "rb") as handle:  # saved in 16-bit, though the merge ran in fp32 on CPU
        header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
    assert {info["dtype"] for name, info in header.items() if name != "__metadata__"} == {"BF16"}
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~current_umask()
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    lora_setup = open_inference(inference_args(lora=str(run_dir / "lora")))
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(lora_setup.base_model)).eval()
    trained = lora_setup.generator.model.merge_and_unload().state_dict()  # float32
    for name in ("model.embed_tokens.weight", "model.norm.weight"):
        assert not torch.equal(trained[name], base.state_dict()[name]), f"{name} was not trained"
    for name, value in merged.state_dict().items():  # every weight: the trained one, stored in bfloat16
        torch.testing.assert_close(value, trained[name].to(torch.bfloat16).to(torch.float32), atol=0, rtol=0)


def test_export_refusals(trained_run, tmp_path, capsys):
    lora = str(trained_run / "lora")
    assert export.main(["--lora", lora, "--to", "gguf", "--out", str(tmp_path / "g")]) == 2
    assert "GGUF export is Unsloth-only" in capsys.readouterr().err and not (tmp_path / "g").exists()
    (tmp_path / "taken").mkdir()
    assert export.main(["--lora", lora, "--to", "merged16", "--out", str(tmp_path / "taken")]) == 2
    assert "already exists" in capsys.readouterr().err


def test_eval_writes_eval_json_with_fields(trained_run, tmp_path, capsys):
    recipe = tmp_path / "eval.yaml"
    recipe.write_text("model_name_or_path: tiny-demo\ndataset_name: demo-arithmetic\neval_split: test\n"
                      "reward_funcs: [correctness, train_helpers:digit_share_reward]\n")  # yours: it may run
    out = tmp_path / "eval.json"
    assert evaluate.main(["--lora", str(trained_run / "lora"), "--data", str(recipe), "--limit", "6",
                          "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["n"] == 6 and result["split"] == "test" and result["adapter"] == str(trained_run / "lora")
    for key in ("accuracy", "format_rate", "garbled_rate"):
        assert 0.0 <= result[key] <= 1.0
    assert result["mean_completion_length"] > 0 and result["max_tokens"] == 24
    assert len(result["samples"]) == 5 and {"completion", "correct", "format_valid"} <= set(result["samples"][0])
    # scored with the run's own rewards (its manifest), not the recipe's defaults: its correctness, the rest beside
    assert result["scorer"] == "correctness_reward_func"
    assert set(result["rewards"]) == {"correctness_reward_func", "digit_share_reward"}
    table = capsys.readouterr().out
    assert "accuracy" in table and "format rate" in table and str(out) in table
    assert "accuracy scored by      correctness_reward_func" in table and "eval set: 6 problems" in table


def test_eval_imports_a_reward_the_adapter_records_only_when_you_name_it(trained_run, tmp_path, monkeypatch, capsys):
    """A shared adapter's record does not decide what code `grpo eval` imports: a custom reward it names runs only
    when your --reward_funcs or your recipe names it; else the built-ins score, and a note says what to pass."""
    import sys

    shared = tmp_path / "shared" / "lora"
    shutil.copytree(trained_run / "lora", shared)  # no manifest.json beside it: its grpo_adapter.json speaks
    record = json.loads((shared / "grpo_adapter.json").read_text())
    record["config"]["reward_funcs"] = ["correctness", "planted:score"]
    (shared / "grpo_adapter.json").write_text(json.dumps(record))
    marker = tmp_path / "imported"
    (tmp_path / "planted.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
                                         "def score(completions, **kwargs):\n    return [0.5] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "eval.json"
    command = ["--lora", str(shared), "--data", "demo-arithmetic", "--limit", "2", "--output", str(out)]
    assert evaluate.main(command) == 0
    said = capsys.readouterr().err
    assert not marker.exists() and "planted" not in sys.modules
    assert "(planted:score)" in said and "pass `--reward_funcs correctness planted:score`" in said
    assert set(json.loads(out.read_text())["rewards"]) == {"correctness_reward_func"}
    assert evaluate.main([*command, "--reward_funcs", "correctness", "planted:score"]) == 0
    assert marker.read_text() == "ran" and "planted:score" not in capsys.readouterr().err
    rewards = json.loads(out.read_text())["rewards"]
    assert set(rewards) == {"correctness_reward_func", "score"} and rewards["score"] == 0.5


def test_adapter_copied_away_from_its_run_generates_as_trained(trained_run, tmp_path, capsys):
    moved = tmp_path / "elsewhere" / "lora"
    shutil.copytree(trained_run / "lora", moved)  # no manifest.json beside it any more
    manifest = json.loads((trained_run / "manifest.json").read_text())
    setup = open_inference(inference_args(lora=str(moved)))
    assert setup.system_prompt == manifest["system_prompt"] and setup.max_tokens == manifest["max_completion_length"]
    assert setup.tokenizer.chat_template == manifest["chat_template"] and setup.base_model == manifest["base_model"]
    assert generate.main(["--lora", str(moved), "--prompt", "3+4"]) == 0
    assert json.loads(capsys.readouterr().out)["adapter"] == str(moved)


def test_adapter_without_any_metadata_is_refused_unless_the_system_prompt_is_given(trained_run, tmp_path, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(trained_run / "lora", bare)
    (bare / "grpo_adapter.json").unlink()
    assert generate.main(["--lora", str(bare), "--prompt", "3+4"]) == 2
    err = capsys.readouterr().err
    assert str(bare) in err and "grpo_adapter.json" in err and "--system_prompt" in err and "Traceback" not in err
    assert export.main(["--lora", str(bare), "--to", "merged16", "--out", str(tmp_path / "m")]) == 0  # no prompt needed
    assert generate.main(["--lora", str(bare), "--prompt", "3+4", "--system_prompt", "Answer briefly."]) == 0
    captured = capsys.readouterr()
    assert "warning:" in captured.err and json.loads(captured.out.splitlines()[-1])["text"] is not None


def test_eval_of_the_demo_by_dataset_name_offline_writes_into_the_run_folder(trained_run, tmp_path, capsys,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may land in the current folder
    assert evaluate.main(["--lora", str(trained_run / "lora"), "--data", "demo-arithmetic", "--limit", "4"]) == 0
    out = capsys.readouterr().out
    result = json.loads((trained_run / "eval.json").read_text())
    assert result["n"] == 4 and result["split"] == "test" and f"wrote {trained_run / 'eval.json'}" in out
    assert evaluate.main(["--base", "--run", str(trained_run), "--data", "demo-arithmetic", "--limit", "4"]) == 0
    assert (trained_run / "eval_base.json").is_file() and str(trained_run / "eval_base.json") in capsys.readouterr().out
    assert evaluate.main(["--base", "--model", "tiny-demo", "--data", "demo-arithmetic", "--limit", "4"]) == 2
    assert "--output" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_eval_reads_the_recipes_own_eval_set_and_a_data_file_whole(trained_run, tmp_path, capsys):
    held = tmp_path / "held.csv"
    held.write_text("problem,final\n3+4?,7\n1+2?,3\n5+1?,6\n", encoding="utf-8")
    recipe = tmp_path / "own.yaml"
    recipe.write_text(f"model_name_or_path: tiny-demo\ndataset_name: {tmp_path / 'absent-train.jsonl'}\n"
                      f"eval_dataset_name: {held}\neval_question_field: problem\neval_answer_field: final\n")
    out = tmp_path / "own.json"
    assert evaluate.main(["--lora", str(trained_run / "lora"), "--data", str(recipe), "--output", str(out)]) == 0
    assert json.loads(out.read_text())["n"] == 3  # eval_split (test) does not apply to a single file
    assert evaluate.main(["--lora", str(trained_run / "lora"), "--data", str(held), "--output", str(out)]) == 2
    assert "eval_question_field" in capsys.readouterr().err  # the run's fields are question/answer


# grpo eval's own data, refused before any weights load (as grpo train prepares its data first): each case is a file
# of held-out problems, the field its message names, and what the message says.
BAD_EVAL_DATA = [
    ("no answer column", "problem,final\n3+4?,7\n", "eval_question_field", "pass it as --config"),
    ("answers under another name", "question,final\n3+4?,7\n", "eval_answer_field", "pass it as --config"),
    ("no answer a reward can read", "question,answer\n3+4?,seven-ish\n5+1?,n/a\n", "eval_answer_field",
     "cannot be read by the correctness reward"),
    ("an empty file", "", "", "empty"),
    ("a blank header only", "question,answer\n", "", "no rows"),
]


@pytest.mark.parametrize("name,text,field,says", BAD_EVAL_DATA, ids=[case[0] for case in BAD_EVAL_DATA])
def test_eval_refuses_bad_data_before_the_weights_load(trained_run, tmp_path, monkeypatch, capsys, name, text, field,
                                                       says):
    """Exit 2 naming the field and the fix, and no model loaded: the backend's load_generator (watched, not replaced)
    is never reached; the same command on good data reaches it once."""
    from grpo_pipeline.pipeline.backends import plain

    loads = []
    real = plain.load_generator
    monkeypatch.setattr(plain, "load_generator", lambda *args, **kwargs: loads.append(args) or real(*args, **kwargs))
    held = tmp_path / "held.csv"
    held.write_text(text, encoding="utf-8")
    argv = ["--lora", str(trained_run / "lora"), "--data", str(held), "--limit", "1", "--max_tokens", "4",
            "--output", str(tmp_path / "eval.json")]
    assert evaluate.main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and (f"config error in `{field}`" in err if field else True), err
    assert "Traceback" not in err and loads == [] and not (tmp_path / "eval.json").exists()
    held.write_text("question,answer\n3+4?,7\n", encoding="utf-8")
    assert evaluate.main(argv) == 0 and len(loads) == 1


def test_merged_export_behaves_as_trained_in_plain_transformers(trained_run, tmp_path):
    """A plain transformers user who sends only a user message gets the trained system prompt."""
    from transformers import AutoTokenizer

    manifest = json.loads((trained_run / "manifest.json").read_text())
    out = tmp_path / "merged"
    assert export.main(["--lora", str(trained_run / "lora"), "--to", "merged16", "--out", str(out)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "3+4"}], tokenize=False,
                                         add_generation_prompt=True)
    assert manifest["system_prompt"] and manifest["system_prompt"] in text
    # the same text the run trained on (the trained template with the trained system prompt)
    trained = AutoTokenizer.from_pretrained(str(trained_run / "lora"))
    assert text == trained.apply_chat_template([{"role": "system", "content": manifest["system_prompt"]},
                                                {"role": "user", "content": "3+4"}], tokenize=False,
                                               add_generation_prompt=True)
    own = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1"}],
                                        tokenize=False)
    assert "Be brief." in own and manifest["system_prompt"] not in own  # a given system message wins
    carried = json.loads((out / "grpo_adapter.json").read_text())
    assert carried["system_prompt"] == manifest["system_prompt"] and carried["base_model"] == manifest["base_model"]
    # --system overrides the recorded one as the chat template's default
    assert export.main(["--lora", str(trained_run / "lora"), "--to", "merged16", "--out", str(tmp_path / "m2"),
                        "--system", "Answer in one word."]) == 0
    other = AutoTokenizer.from_pretrained(str(tmp_path / "m2")).apply_chat_template(
        [{"role": "user", "content": "3+4"}], tokenize=False, add_generation_prompt=True)
    assert "Answer in one word." in other and manifest["system_prompt"] not in other
