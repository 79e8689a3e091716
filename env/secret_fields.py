"""Secrets kept out of every file and line we write. A secret is a value by its name (`is_secret`: `*_token`,
`*api_key*`, `*password*`, `*secret*`, at any depth), by its place (a URL's `https://user:PASSWORD@host/`) or by its
source (a value given as a secret, `remember`, found again in any text, `redact`). The placeholder is transformers'
`TrainingArguments.to_dict` rule (`<HUB_TOKEN>`). Environment variables (HF_TOKEN, WANDB_API_KEY) are read by the
libraries themselves and never copied into a file.
"""

from __future__ import annotations

import contextlib
import copy
import copyreg
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_SECRET_NAME = re.compile(r"(?:^|_)token$|api_?key|password|passwd|secret", re.IGNORECASE)
_SHORTEST = 4  # a shorter value is not searched for in free text (it would mask ordinary words and numbers)
_known: dict[str, str] = {}  # value -> placeholder, for redact
# A URL's user-info with a password (RFC 3986: scheme "://" user ":" password "@"): the password is a secret by place.
_URL_PASSWORD = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:\[\]]*):([^\s/?#@]+)@")
URL_PASSWORD = "<PASSWORD>"


def is_secret(name: Any) -> bool:
    """
    >>> [is_secret(n) for n in ("hub_token", "wandb_api_key", "db_password", "max_tokens", "pad_token_id")]
    [True, True, True, False, False]
    """
    return isinstance(name, str) and bool(_SECRET_NAME.search(name.lstrip("-")))


def placeholder(name: str) -> str:
    """
    >>> placeholder("hub_token")
    '<HUB_TOKEN>'
    """
    return f"<{name.lstrip('-').upper()}>"


def masked(value: Any, name: str = "") -> Any:
    """`value` with every secret inside it replaced by its placeholder; a string that is a JSON object (a mapping
    option given as text) is walked as that mapping. An unset secret (None, "") stays as it is.

    >>> masked({"hub_token": "hf_abc", "config": {"my_api_key": "k"}, "lr": 1e-5, "push_token": None})
    {'hub_token': '<HUB_TOKEN>', 'config': {'my_api_key': '<MY_API_KEY>'}, 'lr': 1e-05, 'push_token': None}
    >>> masked({"dataset_name": "https://me:s3cret@host/d.jsonl", "model_init_kwargs": {"token": "hf_x"}})
    {'dataset_name': 'https://me:<PASSWORD>@host/d.jsonl', 'model_init_kwargs': {'token': '<TOKEN>'}}
    """
    if is_secret(name) and value is not None and value != "" and value is not False:
        return placeholder(name)
    if isinstance(value, Mapping):
        return {key: masked(item, key) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(masked(item) for item in value)
    if isinstance(value, str):
        loaded = _json_mapping(value)
        walked = masked(loaded) if loaded is not None else None
        return json.dumps(walked, ensure_ascii=False) if walked != loaded else redact(value)
    return value


def _json_mapping(text: str) -> "dict | None":
    """The mapping a JSON object's text holds (a nested option given as JSON on the command line); None otherwise."""
    stripped = text.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        with contextlib.suppress(ValueError):
            return json.loads(stripped)  # "{...}" that parses is an object
    return None


def secrets_in(value: Any, name: str = "") -> list[tuple[str, str]]:
    """Every secret inside `value` as (the secret, its placeholder), found as `masked` finds them.

    >>> secrets_in({"kw": {"token": "hf_abc"}, "url": "https://u:pw12@h/x", "keys": {"api_key": ["k1234"]}})
    [('hf_abc', '<TOKEN>'), ('pw12', '<PASSWORD>'), ('k1234', '<API_KEY>')]
    """
    if isinstance(value, Mapping):
        return [found for key, item in value.items() for found in secrets_in(item, key if isinstance(key, str)
                                                                             else "")]
    if isinstance(value, (list, tuple)):
        return [found for item in value for found in secrets_in(item, name)]
    if not isinstance(value, str) or not value:
        return []
    if is_secret(name):
        return [(value, placeholder(name))]
    found = [(match[2], URL_PASSWORD) for match in _URL_PASSWORD.finditer(value) if match[2] != URL_PASSWORD]
    loaded = _json_mapping(value)
    return found + (secrets_in(loaded) if loaded is not None else [])


def unmasked(values: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping read from a file we wrote, without `masked`'s placeholders (the option is then unset, and the run
    reads the secret from where the user keeps it).

    >>> unmasked({"hub_token": "<HUB_TOKEN>", "lr": 1})
    {'lr': 1}
    """
    return {key: value for key, value in values.items() if not (is_secret(key) and value == placeholder(key))}


def _argv_secrets(argv: Sequence[Any]) -> dict[int, tuple[str, bool]]:
    """The words of a command line that hold a secret value: index -> (the option's name, whether the value is in the
    option's own word, `--hub_token=X`, or is the next word, `--hub_token X`, which is then read as no option)."""
    found: dict[int, tuple[str, bool]] = {}
    for index, word in enumerate(argv):
        if index not in found and isinstance(word, str) and word.startswith("--"):
            name, eq, _ = word[2:].partition("=")
            if is_secret(name):
                found[index if eq else index + 1] = (name, bool(eq))
    return found


def masked_argv(argv: Sequence[Any]) -> list[Any]:
    """
    >>> masked_argv(["train", "--hub_token", "hf_abc", "--wandb_api_key=k", "--lr", "1"])
    ['train', '--hub_token', '<HUB_TOKEN>', '--wandb_api_key=<WANDB_API_KEY>', '--lr', '1']
    """
    secret = _argv_secrets(argv)
    out: list[Any] = []
    for index, word in enumerate(argv):
        if index in secret:
            name, inline = secret[index]
            word = f"--{name}={placeholder(name)}" if inline else placeholder(name)
        elif isinstance(word, str):
            name, eq, value = word.partition("=") if word.startswith("--") else ("", "", word)
            word = f"{name}{eq}{masked(value)}"
        out.append(word)
    return out


def secret_options(argv: Sequence[Any]) -> list[str]:
    """The secret options a command line gives, for a line that says to pass them again.
    >>> secret_options(["--config", "r.yaml", "--hub_token=x"])
    ['hub_token']
    """
    return [name for name, _ in _argv_secrets(argv).values()]


def remember_argv(argv: Sequence[Any]) -> None:
    """Note the secret values a command line gives (`--hub_token X`, `--hub_token=X`, by place), for `redact`."""
    words = [w for w in argv if isinstance(w, str)]
    remember({"argv": words})
    for index, (name, inline) in _argv_secrets(words).items():
        remember({name: words[index].partition("=")[2] if inline else words[index] if index < len(words) else ""})


def remember(values: Mapping[str, Any]) -> None:
    """Note the secret values of a config (`secrets_in`), so that `redact` finds them in any text."""
    for value, shown in secrets_in(values):
        if len(value) >= _SHORTEST and value != shown:
            _known[value] = shown


def redact(text: str) -> str:
    """`text` with every URL's password and remembered secret replaced by its placeholder (longest first).
    >>> remember({"hub_token": "hf_doctest_value"}); redact("bad token hf_doctest_value at https://u:pw@h/")
    'bad token <HUB_TOKEN> at https://u:<PASSWORD>@h/'
    """
    text = _URL_PASSWORD.sub(lambda match: f"{match[1]}:{URL_PASSWORD}@", text)
    for value in sorted(_known, key=len, reverse=True):
        if value in text:
            text = text.replace(value, _known[value])
    return text


def masked_pickle_class(cls: type) -> type:
    """A subclass of the dataclass `cls` (TRL's GRPOConfig, or Unsloth's in its place) whose instances pickle as `cls`
    with each secret field masked: the Trainer `torch.save`s its args into every checkpoint (training_args.bin). A
    copy in memory (copy.copy, copy.deepcopy) keeps the value."""

    def __reduce_ex__(self, protocol):
        state = {key: masked(value, key) for key, value in vars(self).items()}
        return copyreg._reconstructor, (cls, object, None), state  # what pickle writes for `cls` by protocol 1

    def __copy__(self):
        twin = object.__new__(type(self))
        twin.__dict__.update(vars(self))
        return twin

    def __deepcopy__(self, memo):
        twin = object.__new__(type(self))
        memo[id(self)] = twin
        twin.__dict__.update(copy.deepcopy(vars(self), memo))
        return twin

    return type(cls.__name__, (cls,), {"__reduce_ex__": __reduce_ex__, "__copy__": __copy__,
                                       "__deepcopy__": __deepcopy__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})
