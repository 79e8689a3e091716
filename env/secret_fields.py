"""Secrets: the value of any option named as a token, a key or a password, kept out of every file and line we write.

A secret is a value by its name, by its place or by its source:
- by name (`is_secret`): the value of `hub_token` and any other `*_token`, `*api_key*`, `*password*` (and
  `*secret*`), in TRL's set (GRPOConfig / TrainingArguments) or ours, at any depth of a mapping (a nested option's
  `{"token": ...}`, as model_init_kwargs passes it), and each item of a list under such a name;
- by place: the password of a URL's user-info (`https://user:PASSWORD@host/...`), in any string of any value (a
  dataset URL, a JSON text of a mapping option, a word of a command line), shown as `<PASSWORD>`;
- by source: every value this process was given as a secret (`remember`), found again in any text (`redact`).
transformers' `TrainingArguments.to_dict` shows each `*_token` field as `<HUB_TOKEN>` (its upper-cased name);
`placeholder` is that rule, for the wider set of names. The homes that apply it:

- `masked`: THE structural walk: any value (a mapping, a list, a string) with every secret in it (by name, by place,
  by source) replaced by its placeholder, for every file the project writes (manifest.json, lora/grpo_adapter.json,
  effective_config.json, exports, checkpoints' grpo_shape.json, `grpo plan --write`'s recipe) and every record
  another process reads (pipeline/run/nodes.py: a node's recipe never carries its secrets to another node);
- `unmasked`: the same mapping read back, the placeholders dropped (a placeholder is never a value to use);
- `masked_argv`: a command line with the value after `--hub_token` (or `--hub_token=...`) replaced, and each other
  word `masked`; every printed command goes through env/paths.py `shell_command`, which calls it;
- `remember` / `redact`: the secret values this process was given (by name and by place, at any depth), and any
  text (an error message, a crash log, the `--check` report: env/text.py `printable`) with each of them, and any
  URL's password, replaced by its placeholder;
- `masked_pickle_class`: a TrainingArguments class whose pickle (a checkpoint's training_args.bin) holds the
  placeholder, while the object in memory keeps the value for the run (a push to the hub still authenticates).

Environment variables (HF_TOKEN, WANDB_API_KEY) are read by the libraries themselves and never copied into a file.
"""

from __future__ import annotations

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
    """Whether a field of this name holds a secret.

    >>> [is_secret(n) for n in ("hub_token", "wandb_api_key", "db_password", "max_tokens", "pad_token_id")]
    [True, True, True, False, False]
    """
    return isinstance(name, str) and bool(_SECRET_NAME.search(name.lstrip("-")))


def placeholder(name: str) -> str:
    """What stands in a file for the secret field `name`, as transformers' TrainingArguments.to_dict writes it.

    >>> placeholder("hub_token")
    '<HUB_TOKEN>'
    """
    return f"<{name.lstrip('-').upper()}>"


def _given(value: Any) -> bool:
    return value is not None and value != "" and value is not False


def masked(value: Any, name: str = "") -> Any:
    """`value` with every secret inside it replaced by its placeholder: a mapping's secret-named keys at any depth
    (and every item of a list under one), a URL's password in any string, any remembered secret in any string, and
    a string that is a JSON object (a mapping option given as text) walked as that mapping. An unset secret (None,
    "") stays as it is. The one walk every writer and printer of values calls.

    >>> masked({"hub_token": "hf_abc", "config": {"my_api_key": "k"}, "lr": 1e-5, "push_token": None})
    {'hub_token': '<HUB_TOKEN>', 'config': {'my_api_key': '<MY_API_KEY>'}, 'lr': 1e-05, 'push_token': None}
    >>> masked({"dataset_name": "https://me:s3cret@host/d.jsonl", "model_init_kwargs": {"token": "hf_x"}})
    {'dataset_name': 'https://me:<PASSWORD>@host/d.jsonl', 'model_init_kwargs': {'token': '<TOKEN>'}}
    """
    if is_secret(name) and _given(value):
        return placeholder(name)
    if isinstance(value, Mapping):
        return {key: masked(item, key) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(masked(item) for item in value)
    if isinstance(value, str):
        return _masked_string(value)
    return value


def _json_mapping(text: str) -> "dict | None":
    """The mapping a JSON object's text holds (a nested option given as JSON on the command line); None otherwise."""
    stripped = text.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return None
    try:
        loaded = json.loads(stripped)
    except ValueError:
        return None
    return loaded if isinstance(loaded, dict) else None


def _masked_string(text: str) -> str:
    """A string with its secrets by place and by source masked; a JSON object's text masked as its mapping."""
    loaded = _json_mapping(text)
    if loaded is not None:
        walked = masked(loaded)
        if walked != loaded:
            return json.dumps(walked, ensure_ascii=False)
    return redact(text)


def masked_url(text: str) -> str:
    """`text` with each URL's user-info password shown as <PASSWORD> (the user name is kept).

    >>> masked_url("pull https://me:ghp_abc@github.com/x.git and https://host/y")
    'pull https://me:<PASSWORD>@github.com/x.git and https://host/y'
    """
    return _URL_PASSWORD.sub(lambda match: f"{match[1]}:{URL_PASSWORD}@", text)


def secrets_in(value: Any, name: str = "") -> list[tuple[str, str]]:
    """Every secret inside `value` as (the secret, its placeholder), found as `masked` finds them: by name at any
    depth (a list under a secret name: each item), by place (a URL's password), in a JSON object's text.

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
    """A mapping read from a file we wrote, without the placeholders `masked` put there (the option is then unset,
    and the run reads the secret from where the user keeps it: the command line or the environment).

    >>> unmasked({"hub_token": "<HUB_TOKEN>", "lr": 1})
    {'lr': 1}
    """
    return {key: value for key, value in values.items() if not (is_secret(key) and value == placeholder(key))}


def masked_argv(argv: Sequence[Any]) -> list[Any]:
    """A command line with each secret option's value replaced by its placeholder.

    >>> masked_argv(["train", "--hub_token", "hf_abc", "--wandb_api_key=k", "--lr", "1"])
    ['train', '--hub_token', '<HUB_TOKEN>', '--wandb_api_key=<WANDB_API_KEY>', '--lr', '1']
    """
    out: list[Any] = []
    secret_next = ""
    for word in argv:
        text = word if isinstance(word, str) else ""
        if secret_next:
            out.append(placeholder(secret_next))
            secret_next = ""
        elif text.startswith("--") and "=" in text and is_secret(text[2:].partition("=")[0]):
            name = text[2:].partition("=")[0]
            out.append(f"--{name}={placeholder(name)}")
        else:
            if text.startswith("--") and is_secret(text[2:]):
                secret_next = text[2:]
            out.append(_masked_word(word) if isinstance(word, str) else word)
    return out


def _masked_word(word: str) -> str:
    """A word of a command line with its secrets by place and source masked: a URL's password, a token in a JSON
    mapping's text, alone or as `--name=VALUE`."""
    name, eq, value = word.partition("=") if word.startswith("--") else ("", "", word)
    return f"{name}{eq}{masked(value)}"


def secret_options(argv: Sequence[Any]) -> list[str]:
    """The secret options a command line gives (by name), for a line that says to pass them again.

    >>> secret_options(["--config", "r.yaml", "--hub_token=x"])
    ['hub_token']
    """
    names = [w[2:].partition("=")[0] for w in argv if isinstance(w, str) and w.startswith("--")]
    return [name for name in names if is_secret(name)]


def remember_argv(argv: Sequence[Any]) -> None:
    """Note the secret values a command line gives (`--hub_token X`, `--hub_token=X`, a URL's password, a token in
    a JSON mapping's text), for `redact`."""
    words = [w for w in argv if isinstance(w, str)]
    remember({"argv": words})
    for index, word in enumerate(words):
        name, eq, value = word[2:].partition("=") if word.startswith("--") else ("", "", "")
        if is_secret(name):
            remember({name: value if eq else (words[index + 1] if index + 1 < len(words) else "")})


def remember(values: Mapping[str, Any]) -> None:
    """Note the secret values of a config (by name at any depth, in lists, by place: `secrets_in`), so that `redact`
    finds them in any text."""
    for value, shown in secrets_in(values):
        if len(value) >= _SHORTEST and value != shown:
            _known[value] = shown


def redact(text: str) -> str:
    """`text` with every URL's password and every remembered secret value replaced by its placeholder (longest
    first).

    >>> remember({"hub_token": "hf_doctest_value"}); redact("bad token hf_doctest_value at https://u:pw@h/")
    'bad token <HUB_TOKEN> at https://u:<PASSWORD>@h/'
    """
    text = masked_url(text)
    for value in sorted(_known, key=len, reverse=True):
        if value in text:
            text = text.replace(value, _known[value])
    return text


def masked_pickle_class(cls: type) -> type:
    """A subclass of the dataclass `cls` (TRL's GRPOConfig, or the class Unsloth left in its place) whose instances
    pickle as `cls` itself with each secret field masked: transformers' Trainer writes `torch.save(self.args)` into
    every checkpoint (training_args.bin), and a load finds the class it knows. A copy in memory (copy.copy,
    copy.deepcopy) keeps the value."""

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
