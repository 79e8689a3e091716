"""Secrets: the value of any option named as a token, a key or a password, kept out of every file and line we write.

A secret is a field's value by the field's name (`is_secret`): `hub_token` and any other `*_token`, `*api_key*`,
`*password*` (and `*secret*`), in TRL's set (GRPOConfig / TrainingArguments) or ours. transformers'
`TrainingArguments.to_dict` shows each `*_token` field as `<HUB_TOKEN>` (its upper-cased name); `placeholder` is that
rule, for the wider set of names. The homes that apply it:

- `masked`: a mapping (a config, a manifest) with each secret value replaced by its placeholder, for every file
  the project writes (manifest.json, lora/grpo_adapter.json, effective_config.json, exports);
- `unmasked`: the same mapping read back, the placeholders dropped (a placeholder is never a value to use);
- `masked_argv`: a command line with the value after `--hub_token` (or `--hub_token=...`) replaced; every printed
  command goes through env/paths.py `shell_command`, which calls it;
- `remember` / `redact`: the secret values this process was given, and any text (an error message, a crash log,
  the `--check` report) with each of them replaced by its placeholder;
- `masked_pickle_class`: a TrainingArguments class whose pickle (a checkpoint's training_args.bin) holds the
  placeholder, while the object in memory keeps the value for the run (a push to the hub still authenticates).

Environment variables (HF_TOKEN, WANDB_API_KEY) are read by the libraries themselves and never copied into a file.
"""

from __future__ import annotations

import copy
import copyreg
import re
from collections.abc import Mapping, Sequence
from typing import Any

_SECRET_NAME = re.compile(r"(?:^|_)token$|api_?key|password|passwd|secret", re.IGNORECASE)
_SHORTEST = 4  # a shorter value is not searched for in free text (it would mask ordinary words and numbers)
_known: dict[str, str] = {}  # value -> placeholder, for redact


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
    """`value` with every secret inside it replaced by its placeholder: a mapping's secret-named keys, at any depth.
    An unset secret (None, "") stays as it is.

    >>> masked({"hub_token": "hf_abc", "config": {"my_api_key": "k"}, "lr": 1e-5, "push_token": None})
    {'hub_token': '<HUB_TOKEN>', 'config': {'my_api_key': '<MY_API_KEY>'}, 'lr': 1e-05, 'push_token': None}
    """
    if is_secret(name) and _given(value):
        return placeholder(name)
    if isinstance(value, Mapping):
        return {key: masked(item, key) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(masked(item) for item in value)
    return value


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
            out.append(word)
    return out


def secret_options(argv: Sequence[Any]) -> list[str]:
    """The secret options a command line gives (by name), for a line that says to pass them again.

    >>> secret_options(["--config", "r.yaml", "--hub_token=x"])
    ['hub_token']
    """
    names = [w[2:].partition("=")[0] for w in argv if isinstance(w, str) and w.startswith("--")]
    return [name for name in names if is_secret(name)]


def remember_argv(argv: Sequence[Any]) -> None:
    """Note the secret values a command line gives (`--hub_token X`, `--hub_token=X`), for `redact`."""
    words = [w for w in argv if isinstance(w, str)]
    for index, word in enumerate(words):
        name, eq, value = word[2:].partition("=") if word.startswith("--") else ("", "", "")
        if is_secret(name):
            remember({name: value if eq else (words[index + 1] if index + 1 < len(words) else "")})


def remember(values: Mapping[str, Any]) -> None:
    """Note the secret values of a config (any depth), so that `redact` finds them in any text."""
    for key, value in values.items():
        if isinstance(value, Mapping):
            remember(value)
        elif is_secret(key) and isinstance(value, str) and len(value) >= _SHORTEST:
            _known[value] = placeholder(key)


def redact(text: str) -> str:
    """`text` with every remembered secret value replaced by its placeholder (longest first).

    >>> remember({"hub_token": "hf_doctest_value"}); redact("bad token hf_doctest_value")
    'bad token <HUB_TOKEN>'
    """
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
