"""No secret is written or printed (issue 48, class 1): every secret-shaped field of TRL's GRPOConfig /
TrainingArguments and ours (env/secret_fields.py is_secret) x every file a real run, its checkpoint, its export and
a crash log write, and every line printed, scanned for the value."""

import contextlib
import copy
import dataclasses
import io
import json
import pickle
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_helpers import own_cache_root
from grpo_pipeline.env.paths import shell_command
from grpo_pipeline.env.secret_fields import is_secret, masked, masked_argv, placeholder, unmasked
from grpo_pipeline.pipeline.config.fields import field_names
from grpo_pipeline.pipeline.run.stop import resume_command


def secret_fields() -> list[str]:
    """Every field a recipe may set whose name makes it a secret: TRL's (GRPOConfig, with TrainingArguments') and
    ours."""
    import trl

    names = {f.name for f in dataclasses.fields(trl.GRPOConfig)} | set(field_names())
    return sorted(name for name in names if is_secret(name))


SECRETS = secret_fields()


def test_the_class_holds_trls_hub_token_and_no_ordinary_field():
    assert "hub_token" in SECRETS
    assert not {"max_completion_length", "pad_token_id", "include_num_input_tokens_seen"} & set(SECRETS)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(SECRETS), st.text(alphabet=st.characters(blacklist_categories=("Cs", "Zs", "Cc")), min_size=4))
def test_every_printed_command_and_mapping_hides_every_secret_value(name, value):
    shown = placeholder(name)
    assert masked_argv(["train", f"--{name}", value, "--seed", "1"]) == ["train", f"--{name}", shown, "--seed", "1"]
    assert masked_argv(["train", f"--{name}={value}"]) == ["train", f"--{name}={shown}"]
    assert shlex.split(shell_command("grpo", "train", f"--{name}", value)) == ["grpo", "train", f"--{name}", shown]
    written = masked({"config": {name: value, "seed": 1}})
    assert written == {"config": {name: placeholder(name), "seed": 1}}
    assert unmasked(written["config"]) == {"seed": 1}  # read back: the option is unset, never the placeholder


@pytest.mark.parametrize("name", SECRETS)
def test_the_resume_line_masks_the_secret_and_says_to_pass_it_again(name):
    line = resume_command(["--config", "r.yaml", f"--{name}", "hf_resume_secret"])
    assert "hf_resume_secret" not in line and f"pass your {name} again in place of {placeholder(name)}" in line


VALUE = "hf_RecipeSecretValue"
URL_PASSWORD = "UrlPasswordSecret"  # a secret by place: a URL's user-info password in a free-text option
ARGV_VALUE = "hf_CommandLineSecret"
ENV_VALUE, ENV_SECRETS = "hf_EnvironmentSecret", ("HF_TOKEN", "WANDB_API_KEY")


@pytest.fixture(scope="module")
def run_with_secrets(tmp_path_factory):
    """A real 1-step run with every secret field set in the recipe and hub_token again on the command line, an
    export, and a crash of `grpo generate`: (folder, cache root, [(exit status, printed)])."""
    from cli_helpers import fault_table
    from grpo_pipeline.pipeline import cli

    faults = fault_table()
    with own_cache_root(tmp_path_factory) as cache, pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("secrets")
        patch.chdir(folder)
        for name in ENV_SECRETS:  # read by the libraries themselves; never copied into a file of ours
            patch.setenv(name, ENV_VALUE)
        text = ("".join(f"{name}: {VALUE}\n" for name in SECRETS) + faults.SHORT_RUN
                + f"hub_model_id: https://me:{URL_PASSWORD}@hub.example/me/model\n")
        lora = str(folder / "run" / "lora")
        outputs = []
        # (--check with a secret: tests/fault_table.py's "--check with a hub_token prints its placeholder")
        for argv in (faults.train(folder, text, "--hub_token", ARGV_VALUE),
                     ["export", "--lora", lora, "--to", "merged16", "--out", str(folder / "merged"), "--backend",
                      "plain"],
                     ["generate", "--lora", lora, "--prompt", "1+1?", "--backend", "plain"]):
            if argv[0] == "generate":
                patch.setattr("grpo_pipeline.pipeline.infer.generate.generate_answers", _crash)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                code = cli.main(argv)
            outputs.append((code, printed.getvalue()))
        yield folder, cache, outputs


def _crash(*args, **kwargs):
    raise RuntimeError(f"crashed holding {VALUE}")


def test_no_file_of_the_run_its_checkpoint_its_export_or_a_crash_log_holds_a_secret(run_with_secrets):
    folder, cache, outputs = run_with_secrets
    assert [code for code, _ in outputs] == [0, 0, 1], outputs  # the crash: a bug, with its log
    # every file we wrote (the recipe is the user's own)
    files = [p for root in (folder / "run", folder / "merged", cache / "logs") for p in root.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in files)
    assert any(p.name == "training_args.bin" for p in files) and any(p.parent.name == "merged" for p in files)
    for path in files:
        data = path.read_bytes()
        assert not [v for v in (VALUE, ARGV_VALUE, ENV_VALUE, URL_PASSWORD) if v.encode() in data], path


def test_nothing_printed_holds_a_secret(run_with_secrets):
    _, _, outputs = run_with_secrets
    for _, printed in outputs:
        assert not [v for v in (VALUE, ARGV_VALUE, ENV_VALUE, URL_PASSWORD) if v in printed], printed[-2000:]


def test_each_file_shows_the_placeholder_as_trl_does_and_the_run_reads_it_back_as_unset(run_with_secrets):
    import torch

    from grpo_pipeline.pipeline.run.manifest import find_manifest

    folder, _, _ = run_with_secrets
    manifest = json.loads((folder / "run" / "manifest.json").read_text(encoding="utf-8"))
    assert all(manifest["config"][name] == placeholder(name) for name in SECRETS if name in manifest["config"])
    assert json.loads((folder / "run" / "effective_config.json").read_text())["fields"]["hub_token"]["value"] == \
        "<HUB_TOKEN>"
    args = torch.load(folder / "run" / "checkpoint-1" / "training_args.bin", weights_only=False)
    assert type(args).__name__ == "GRPOConfig" and args.hub_token == "<HUB_TOKEN>"
    assert not set(SECRETS) & set(find_manifest(folder / "run" / "lora")["config"])


def test_the_trainers_args_keep_the_value_in_memory_and_pickle_it_masked():
    from grpo_pipeline.env.secret_fields import masked_pickle_class
    from trl import GRPOConfig

    args = masked_pickle_class(GRPOConfig)(output_dir="unused", hub_token=VALUE, report_to="none", use_cpu=True,
                                           bf16=False)
    assert args.hub_token == VALUE  # a push to the hub still authenticates
    assert copy.deepcopy(args).hub_token == VALUE and copy.copy(args).hub_token == VALUE
    loaded = pickle.loads(pickle.dumps(args))
    assert type(loaded) is GRPOConfig and loaded.hub_token == "<HUB_TOKEN>" and loaded.output_dir == "unused"


def test_the_adapters_model_card_names_the_recorded_base_not_a_cache_folder(run_with_secrets):
    folder, cache, _ = run_with_secrets
    for card in (folder / "run").rglob("README.md"):
        assert str(cache) not in card.read_text(encoding="utf-8"), card


# -- a secret by place and by source, in every writer (issue 59 item 7): positions x writers --------------------------

POSITIONS = {  # where a secret sits in a recipe: (its values, the secret)
    "by name": ({"hub_token": "hf_PosByName1"}, "hf_PosByName1"),
    "nested mapping": ({"model_init_kwargs": {"token": "hf_PosNested2"}}, "hf_PosNested2"),
    "mapping as JSON text": ({"model_init_kwargs": '{"token": "hf_PosJsonText3"}'}, "hf_PosJsonText3"),
    "list under a secret name": ({"my_api_keys": ["k_PosListKey4"]}, "k_PosListKey4"),
    "URL password": ({"dataset_name": "https://me:PosUrlPass5@host.example/d.jsonl"}, "PosUrlPass5"),
    "URL password in a list": ({"report_to": ["https://u:PosUrlList6@h.example/x"]}, "PosUrlList6"),
}


def _write_manifest(folder, values):
    from grpo_pipeline.pipeline.run.manifest import build_manifest, write_adapter_metadata, write_manifest

    manifest = build_manifest(cfg_dict=values, backend="plain", base_model="tiny-demo", system_prompt="s",
                              chat_template=None, max_prompt_length=8, max_completion_length=8, data_fingerprint="f",
                              adapter_dir=folder / "lora")
    (folder / "lora").mkdir()
    write_adapter_metadata(folder / "lora", manifest)
    write_manifest(folder, manifest)
    return "".join(p.read_text() for p in folder.rglob("*.json"))


def _write_plan_recipe(folder, values):
    from grpo_pipeline.pipeline.plan.command import write_recipe

    return write_recipe(str(folder / "fitted.yaml"), {"learning_rate": 1e-5, **values}, "a test").read_text()


def _node_record(folder, values):
    from grpo_pipeline.pipeline.run.nodes import differences, node_record

    record = node_record(values, {})
    other = {**record, "rank": 1, "node": 1, "recipe_key": "another", "recipe": {}}
    return json.dumps(record) + " ".join(differences([record, other]))


def _printed_command(folder, values):
    [(name, value)] = values.items()
    words = [f"--{name}", *(value if isinstance(value, list) else
                            [json.dumps(value) if isinstance(value, dict) else value])]
    return shell_command("grpo", "train", *words) + " " + shell_command("grpo", "train", f"--{name}={words[1]}")


def _log_line(folder, values):
    """A crash log and an error message: text through env/text.py printable, once the recipe was read."""
    from grpo_pipeline.env.secret_fields import remember
    from grpo_pipeline.env.text import printable

    remember(values)
    return printable(f"crashed with {values!r} and {json.dumps(values)}")


WRITERS = {"manifest.json and grpo_adapter.json": _write_manifest, "grpo plan --write": _write_plan_recipe,
           "a node's record and its refusal": _node_record, "a printed command": _printed_command,
           "a crash log or message": _log_line}


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("writer", WRITERS)
def test_a_secret_in_any_position_reaches_no_writer(tmp_path, position, writer):
    values, secret = POSITIONS[position]
    written = WRITERS[writer](tmp_path, values)
    assert secret not in written, written
    assert "<" in written  # said by its placeholder, not dropped silently


def test_a_recipe_plan_wrote_reads_its_placeholders_back_as_unset(tmp_path):
    from grpo_pipeline.pipeline.config.parse import read_recipe

    text = _write_plan_recipe(tmp_path, {"hub_token": "hf_PlanWritten"})
    assert "hub_token: <HUB_TOKEN>" in text and "pass them again" in text
    assert read_recipe(str(tmp_path / "fitted.yaml")) == {"learning_rate": 1e-5}
