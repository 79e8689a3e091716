"""`read_tokenizer` (pipeline/assets): a tokenizer folder is read from disk once per process while its files stay the
same, and every call, the first included, gets its own copy, equal to a fresh read and free to change. Over the
bundled real Qwen2.5 tokenizer (151k tokens) and a demo model's small one, and a folder whose files change."""

from __future__ import annotations

import json
import shutil

import pytest

from grpo_pipeline.pipeline import assets
from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer, resolve_model_path

TEXTS = ["What is 27+52?", "小明有5个苹果，又买了3个。", "<tool_call>{\"name\": \"add\"}</tool_call>",
         "<|im_start|>user\nhi<|im_end|>", "  spaces\tand\nlines  ", "emoji 🙂 and ünïcödé", ""]


def fresh(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def described(tok) -> dict:
    """What a caller can tell of a tokenizer: its class, vocabulary, special and added tokens, template, encodings."""
    return {"class": type(tok).__name__, "vocab": tok.get_vocab(), "len": len(tok),
            "added": {i: str(t) for i, t in tok.added_tokens_decoder.items()},
            "special": tok.special_tokens_map, "template": tok.chat_template, "sides": (tok.padding_side,
                                                                                      tok.truncation_side),
            "ids": [tok.encode(t, add_special_tokens=False) for t in TEXTS],
            "padded": tok(TEXTS[:3], padding=True)["input_ids"] if tok.pad_token is not None else None,
            "decoded": [tok.decode(tok.encode(t, add_special_tokens=False)) for t in TEXTS]}


@pytest.fixture(params=["bundled", "tiny-demo"])
def folder(request):
    return assets.qwen_tokenizer_dir() if request.param == "bundled" else resolve_model_path(request.param)


def test_a_copy_is_what_a_fresh_read_gives_and_changing_it_changes_no_later_one(folder):
    first, expected = assets.read_tokenizer(folder), described(fresh(folder))  # the first call gets a copy too
    assert described(first) == expected
    first.padding_side = "left"
    first.chat_template = "{{ 'mine' }}"
    first.add_special_tokens({"additional_special_tokens": ["<added-by-a-caller>"]})
    first(TEXTS, truncation=True, max_length=2, padding="max_length")  # the backend's truncation and padding set
    assert "<added-by-a-caller>" in first.get_vocab()
    second = assets.read_tokenizer(folder)
    assert described(second) == expected and "<added-by-a-caller>" not in second.get_vocab()
    assert second._tokenizer is not first._tokenizer


def test_copies_share_the_kept_reads_bpe_model_until_its_settings_change(folder):
    """A copy is rebuilt on the kept read's BPE model object (a deep copy rebuilt the model: 0.6 s for Qwen2.5). The
    model's own settings are the one thing copies then share, which no library call changes: set on one copy, they
    show on the others, and every later copy is a deep copy of its own until they are as they were."""
    assets.read_tokenizer(folder)
    first, shared = assets.read_tokenizer(folder), assets.read_tokenizer(folder)
    try:
        first.backend_tokenizer.model.dropout = 0.5
        assert shared.backend_tokenizer.model.dropout == 0.5  # one model object
        deep = assets.read_tokenizer(folder)
        first.backend_tokenizer.model.dropout = None
        assert deep.backend_tokenizer.model.dropout == 0.5 and shared.backend_tokenizer.model.dropout is None
    finally:
        first.backend_tokenizer.model.dropout = None
    again = assets.read_tokenizer(folder)
    again.backend_tokenizer.model.dropout = 0.25
    try:
        assert shared.backend_tokenizer.model.dropout == 0.25  # sharing again, the settings as they were
    finally:
        again.backend_tokenizer.model.dropout = None
    assert described(assets.read_tokenizer(folder)) == described(fresh(folder))


def test_an_unchanged_folder_is_read_from_disk_once_and_a_changed_one_again(tmp_path, monkeypatch):
    """On the demo model's small tokenizer (the rule is the folder's, whatever its size; ~20 ms a read)."""
    from transformers import AutoTokenizer

    folder = tmp_path / "tok"
    shutil.copytree(resolve_model_path("tiny-demo"), folder)
    template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    reads = []
    read = AutoTokenizer.from_pretrained.__func__
    monkeypatch.setattr(AutoTokenizer, "from_pretrained",
                        classmethod(lambda cls, *args, **kwargs: reads.append(args[0]) or read(cls, *args, **kwargs)))
    for _ in range(4):  # read once and kept, each call a copy
        assert load_tokenizer(str(folder)).chat_template == template
    assert reads.count(str(folder)) == 1
    (folder / "chat_template.jinja").write_text("{{ 'changed' }}", encoding="utf-8")  # size and mtime change
    assert load_tokenizer(str(folder)).chat_template == "{{ 'changed' }}" and reads.count(str(folder)) == 2
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}), encoding="utf-8")
    assert load_tokenizer(str(folder)).model_max_length == 77 and reads.count(str(folder)) == 3
    (folder / "tokenizer.json").write_text("{ not json", encoding="utf-8")  # broken after a good read: named, not kept
    with pytest.raises(Exception, match="tokenizer.json"):
        load_tokenizer(str(folder))
