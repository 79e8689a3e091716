"""Path helpers: absolute paths, adapter directory checks, atomic writes that survive crashes."""

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from grpo_pipeline.env.adapters import AdapterError, verify_adapter_dir
from grpo_pipeline.env.file_modes import current_umask
from grpo_pipeline.env.locations import absolute_path
from grpo_pipeline.env.paths import atomic_directory, atomic_write_json, atomic_write_text, publish_once

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {
    "base_model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct",
    "peft_type": "LORA",
    "r": 8,
    "lora_alpha": 16,
    "target_modules": ["q_proj", "v_proj"],
    "modules_to_save": None,
}


def write_adapter(directory: Path, config: dict | None = None, marker: float = 1.0) -> Path:
    """A real adapter layout: PEFT's config keys and a safetensors file written by the safetensors library."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps(CONFIG if config is None else config))
    tensors = {
        "base_model.model.layers.0.self_attn.q_proj.lora_A.weight": np.full((8, 16), marker, dtype=np.float32),
        "base_model.model.layers.0.self_attn.q_proj.lora_B.weight": np.zeros((16, 8), dtype=np.float32),
    }
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    return directory


# --- absolute_path --------------------------------------------------------------------------------


def test_relative_path_is_resolved_against_the_cwd_at_call_time(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    resolved = absolute_path("outputs/lora")
    monkeypatch.chdir(second)
    assert resolved == first / "outputs" / "lora"  # captured when given, not when used
    assert absolute_path("outputs/lora") == second / "outputs" / "lora"


def test_tilde_and_environment_variables_are_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GRPO_RUNS", str(tmp_path / "runs"))
    assert absolute_path("~/lora") == tmp_path / "home" / "lora"
    assert absolute_path("$GRPO_RUNS/x/../lora") == tmp_path / "runs" / "lora"
    assert absolute_path(Path("${GRPO_RUNS}") / "lora") == tmp_path / "runs" / "lora"


def test_unset_variable_and_empty_path_are_errors(monkeypatch):
    monkeypatch.delenv("GRPO_NOT_SET", raising=False)
    with pytest.raises(ValueError, match=r"\$GRPO_NOT_SET which is not set"):
        absolute_path("$GRPO_NOT_SET/lora")
    with pytest.raises(ValueError, match="path is empty"):
        absolute_path("")


def test_symlinks_are_kept_not_resolved(tmp_path):
    target = tmp_path / "real"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    assert absolute_path(tmp_path / "link" / "lora") == tmp_path / "link" / "lora"


# --- verify_adapter_dir ---------------------------------------------------------------------------


def test_valid_adapter_is_described(tmp_path):
    write_adapter(tmp_path / "lora")
    info = verify_adapter_dir(tmp_path / "lora")
    assert info.path == tmp_path / "lora"
    assert (info.base_model_name_or_path, info.r, info.lora_alpha) == ("Qwen/Qwen2.5-0.5B-Instruct", 8, 16)
    assert info.target_modules == ["q_proj", "v_proj"] and info.modules_to_save is None
    assert info.weights_file == tmp_path / "lora" / "adapter_model.safetensors"


def test_relative_adapter_path_from_another_cwd(tmp_path, monkeypatch):
    write_adapter(tmp_path / "run" / "lora")
    monkeypatch.chdir(tmp_path / "run")
    assert verify_adapter_dir("lora").path == tmp_path / "run" / "lora"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AdapterError) as caught:
        verify_adapter_dir("lora")
    assert caught.value.path == tmp_path / "lora" and caught.value.missing == "directory"
    assert f"relative path resolved against {tmp_path}" in str(caught.value)


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError) as caught:  # AdapterError is a FileNotFoundError ...
        verify_adapter_dir(tmp_path / "nope")
    assert isinstance(caught.value, ValueError)  # ... and a ValueError
    assert str(caught.value) == f"LoRA adapter directory {tmp_path / 'nope'} does not exist"


def test_missing_weights_file(tmp_path):
    adapter = write_adapter(tmp_path / "lora")
    (adapter / "adapter_model.safetensors").unlink()
    with pytest.raises(AdapterError) as caught:
        verify_adapter_dir(adapter)
    assert caught.value.missing == "adapter_model.safetensors"
    assert str(adapter) in str(caught.value) and "no adapter weights" in str(caught.value)


def test_bin_weights_are_accepted_and_empty_ones_are_not(tmp_path):
    adapter = write_adapter(tmp_path / "lora")
    (adapter / "adapter_model.safetensors").unlink()
    (adapter / "adapter_model.bin").write_bytes(b"PK\x03\x04 torch zip")
    assert verify_adapter_dir(adapter).weights_file.name == "adapter_model.bin"
    (adapter / "adapter_model.bin").write_bytes(b"")
    with pytest.raises(AdapterError, match="is empty"):
        verify_adapter_dir(adapter)


@pytest.mark.parametrize(
    ("write", "missing", "message"),
    [
        (lambda p: p.unlink(), "adapter_config.json", "adapter_config.json is missing"),
        (lambda p: p.write_text('{"r": 8, "lora_alpha": '), "adapter_config.json", "is not valid JSON"),
        (lambda p: p.write_bytes(b"\xff\xfe{"), "adapter_config.json", "cannot be read"),
        (lambda p: p.write_text("[8]"), "adapter_config.json", "must hold a JSON object"),
        (lambda p: p.write_text('{"lora_alpha": 16}'), "adapter_config.json: r", "has no 'r'"),
        (lambda p: p.write_text('{"r": 0}'), "adapter_config.json: r", "'r' must be a positive integer"),
        (lambda p: p.write_text('{"r": true}'), "adapter_config.json: r", "'r' must be a positive integer"),
        (lambda p: (p.unlink(), p.mkdir()), "adapter_config.json", "is not a regular file"),
    ],
)
def test_unreadable_or_invalid_config(tmp_path, write, missing, message):
    adapter = write_adapter(tmp_path / "lora")
    write(adapter / "adapter_config.json")
    with pytest.raises(AdapterError) as caught:
        verify_adapter_dir(adapter)
    assert caught.value.missing == missing
    assert message in str(caught.value) and str(adapter) in str(caught.value)


def test_truncated_or_corrupt_safetensors(tmp_path):
    adapter = write_adapter(tmp_path / "lora")
    weights = adapter / "adapter_model.safetensors"
    full = weights.read_bytes()
    weights.write_bytes(full[:-10])  # a save killed while writing tensor data
    with pytest.raises(AdapterError, match="is truncated"):
        verify_adapter_dir(adapter)
    weights.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(AdapterError, match="invalid safetensors header length"):
        verify_adapter_dir(adapter)
    weights.write_bytes(struct.pack("<Q", 4) + b"{no}")
    with pytest.raises(AdapterError, match="corrupt safetensors header"):
        verify_adapter_dir(adapter)
    weights.write_bytes(struct.pack("<Q", 2) + b"{}")
    with pytest.raises(AdapterError, match="contains no tensors"):
        verify_adapter_dir(adapter)


def test_hint_points_at_the_lora_subfolder_and_the_newest_checkpoint(tmp_path):
    output = tmp_path / "outputs"
    write_adapter(output / "lora")
    with pytest.raises(AdapterError, match=rf"did you mean {output / 'lora'}\?"):
        verify_adapter_dir(output)
    other = tmp_path / "other"
    write_adapter(other / "checkpoint-50")
    write_adapter(other / "checkpoint-200")
    (other / "checkpoint-300").mkdir()  # incomplete: not suggested
    with pytest.raises(AdapterError, match=rf"newest checkpoint {other / 'checkpoint-200'}\?"):
        verify_adapter_dir(other)


def test_an_adapter_written_by_peft_passes(tmp_path):
    """What PEFT itself writes must pass: guards against checks stricter than the real format."""
    import transformers
    from peft import LoraConfig, get_peft_model

    config = transformers.Qwen2Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32,
    )  # fmt: skip
    model = get_peft_model(
        transformers.Qwen2ForCausalLM(config), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    model.save_pretrained(tmp_path / "lora")
    info = verify_adapter_dir(tmp_path / "lora")
    assert (info.r, info.lora_alpha, sorted(info.target_modules)) == (4, 8, ["q_proj", "v_proj"])
    assert info.weights_file.name == "adapter_model.safetensors"


# --- atomic writes --------------------------------------------------------------------------------


def hidden_siblings(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_atomic_directory_publishes_on_success_and_replaces_the_old_version(tmp_path):
    final = tmp_path / "out" / "lora"
    with atomic_directory(final) as temp:
        assert temp.parent == final.parent and temp.name.startswith(".lora.tmp-") and not final.exists()
        write_adapter(temp, marker=1.0)
    assert verify_adapter_dir(final).r == 8
    with atomic_directory(final) as temp:
        write_adapter(temp, config={**CONFIG, "r": 16}, marker=2.0)
    assert verify_adapter_dir(final).r == 16
    assert hidden_siblings(final.parent) == []  # neither the temp nor the old copy is left


def test_atomic_directory_exception_leaves_the_previous_version(tmp_path):
    final = write_adapter(tmp_path / "lora")
    before = (final / "adapter_model.safetensors").read_bytes()
    with pytest.raises(RuntimeError, match="disk full"), atomic_directory(final) as temp:
        (temp / "adapter_config.json").write_text('{"r": 16')  # half-written
        raise RuntimeError("disk full")
    assert (final / "adapter_model.safetensors").read_bytes() == before
    assert verify_adapter_dir(final).r == 8
    assert hidden_siblings(tmp_path) == []


def test_atomic_directory_exception_on_first_save_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt), atomic_directory(tmp_path / "lora") as temp:
        (temp / "partial").write_text("x")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_published_directory_has_normal_permissions(tmp_path):
    with atomic_directory(tmp_path / "lora") as temp:
        (temp / "f").write_text("x")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "lora").stat().st_mode & 0o777 == 0o777 & ~umask


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_safetensors_weights_get_the_same_permissions_as_the_other_files(tmp_path, umask):
    """safetensors writes 0600 files; a published folder's weights get 0666 minus the umask like the rest."""
    previous = os.umask(umask)
    try:
        assert current_umask() == umask
        with atomic_directory(tmp_path / "lora") as temp:
            save_file({"w": np.zeros(2, dtype=np.float32)}, str(temp / "adapter_model.safetensors"))
            (temp / "adapter_config.json").write_text("{}")
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "lora").iterdir()}
    assert modes == {"adapter_model.safetensors": 0o666 & ~umask, "adapter_config.json": 0o666 & ~umask}


def run_killed_save(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """Run a save in a fresh interpreter that dies with os._exit (no cleanup, no finally blocks)."""
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from grpo_pipeline.env.paths import atomic_directory
        final = Path({str(tmp_path / "lora")!r})
        """
    ) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60)


def test_process_killed_mid_write_keeps_the_previous_version(tmp_path):
    write_adapter(tmp_path / "lora")
    before = (tmp_path / "lora" / "adapter_model.safetensors").read_bytes()
    result = run_killed_save(
        tmp_path,
        """
        with atomic_directory(final) as temp:
            (temp / "adapter_config.json").write_text('{"r": 16}')
            (temp / "adapter_model.safetensors").write_bytes(b"half")
            os._exit(9)
        """,
    )
    assert result.returncode == 9, result.stderr
    assert verify_adapter_dir(tmp_path / "lora").r == 8
    assert (tmp_path / "lora" / "adapter_model.safetensors").read_bytes() == before
    assert [name.split("-")[0] for name in hidden_siblings(tmp_path)] == [".lora.tmp"]  # the abandoned temp


def test_process_killed_between_the_two_renames(tmp_path):
    """The documented crash window where renameat2 cannot swap (no RENAME_EXCHANGE): no directory under the final
    name, the old copy is found by the hint."""
    write_adapter(tmp_path / "lora")
    result = run_killed_save(
        tmp_path,
        """
        import grpo_pipeline.env.paths
        grpo_pipeline.env.paths._renameat2 = lambda src, dst, flags: False  # a kernel or file system without renameat2
        real_rename = os.rename
        def rename_then_die(src, dst):
            real_rename(src, dst)
            if ".old-" in str(dst):
                os._exit(9)
        os.rename = rename_then_die
        with atomic_directory(final) as temp:
            (temp / "adapter_config.json").write_text('{"r": 16}')
        """,
    )
    assert result.returncode == 9, result.stderr
    assert not (tmp_path / "lora").exists()
    with pytest.raises(AdapterError, match=r"interrupted save left the previous version at .*\.lora\.old-"):
        verify_adapter_dir(tmp_path / "lora")
    old = next(tmp_path.glob(".lora.old-*"))
    assert verify_adapter_dir(old).r == 8


def test_process_killed_on_first_save_leaves_no_final_dir(tmp_path):
    result = run_killed_save(
        tmp_path,
        """
        with atomic_directory(final) as temp:
            (temp / "adapter_config.json").write_text("{")
            os._exit(3)
        """,
    )
    assert result.returncode == 3, result.stderr
    assert not (tmp_path / "lora").exists()


def test_atomic_write_text_and_json(tmp_path):
    target = tmp_path / "sub" / "state.json"
    assert atomic_write_json(target, {"step": 1, "名": "答案"}) == target
    assert json.loads(target.read_text(encoding="utf-8")) == {"step": 1, "名": "答案"}
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert hidden_siblings(target.parent) == []


def test_atomic_write_text_failure_keeps_the_old_file(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        atomic_write_text(target, "\udcff", encoding="utf-8")  # a lone surrogate cannot be encoded
    assert target.read_text() == "old"
    assert hidden_siblings(tmp_path) == []


def _has_data(folder: Path) -> bool:
    return (folder / "data.txt").is_file()


def test_publish_once_replaces_a_damaged_folder_and_keeps_a_complete_one(tmp_path):
    final = tmp_path / "cache"
    final.mkdir()
    (final / "stray.txt").write_text("left by hand")  # incomplete: no data.txt
    publish_once(final, lambda tmp: (tmp / "data.txt").write_text("built"), _has_data)
    assert sorted(p.name for p in final.iterdir()) == ["data.txt"]

    def must_not_run(tmp):
        raise AssertionError("a complete folder must be reused, not rebuilt")

    assert publish_once(final, must_not_run, _has_data) == final
    assert (final / "data.txt").read_text() == "built"


def test_publish_once_failed_write_leaves_nothing_behind(tmp_path):
    def fail(tmp):
        (tmp / "half.txt").write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        publish_once(tmp_path / "cache", fail, _has_data)
    assert list(tmp_path.iterdir()) == []  # no final folder, no staging sibling


def test_publish_once_never_publishes_a_copy_its_own_check_calls_incomplete(tmp_path):
    """A build that wrote less than its readers need (as transformers' save_pretrained does on a rank other than 0
    under torch.distributed) is refused before it is published: nothing appears under the final name."""
    import pytest

    from grpo_pipeline.env.paths import publish_once

    def has_weights(folder):
        return (folder / "weights.bin").is_file()

    with pytest.raises(RuntimeError, match="incomplete copy"):
        publish_once(tmp_path / "cache", lambda tmp: (tmp / "config.json").write_text("{}"), has_weights)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
