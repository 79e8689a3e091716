"""Every rule of pipeline/config/validate.py, over the whole class of values it governs: the field each refusal
names, the facts its message gives (the numbers and option names), and each boundary (the value just inside
passes, the one just outside is refused). Pure Python: no model, tokenizer or torch."""

from __future__ import annotations

import dataclasses
import math
import typing
import warnings

import pytest

from grpo_pipeline.pipeline.config import (
    SECTIONS,
    UNSLOTH_OVERRIDDEN_SAMPLING_FIELDS,
    ConfigError,
    PipelineConfig,
    check_field_values,
    parse_limit,
    sampling_params_mapping,
    validate,
    validate_unsloth,
)
from grpo_pipeline.pipeline.config.fields import field_rules
from grpo_pipeline.pipeline.config.pipeline_config import list_fields
from grpo_pipeline.pipeline.config.trl_fields import TRL_BOUNDS
from grpo_pipeline.pipeline.config.validate import world_size
from grpo_pipeline.pipeline.config.pipeline_config import coerce


def config(**overrides) -> PipelineConfig:
    return PipelineConfig().replace(**overrides)


def refusal(call, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        call(*args, **kwargs)
    return caught.value


def assert_names(err: ConfigError, field: str, *facts: str) -> None:
    """The error names `field` (attribute and text) and its message holds every fact."""
    text = str(err)
    assert err.field == field, text
    assert text.startswith(f"config error in `{field}`: "), text
    for fact in facts:
        assert fact in text, (fact, text)


def passes(cfg: PipelineConfig, n_processes: int = 1, backend: str | None = None) -> list[str]:
    """validate() accepts `cfg` and warns about nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return validate(cfg, n_processes=n_processes, backend=backend)


# ------------------------------------------------------------------------------------ the declared fields


def _kind(section: type, f: dataclasses.Field) -> tuple[type, bool]:
    kind = typing.get_type_hints(section)[f.name]
    optional = type(None) in typing.get_args(kind)
    if optional:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    return kind, optional


ALL_FIELDS = [(f, *_kind(section, f)) for section in SECTIONS for f in dataclasses.fields(section)]
BOUND_KEYS = ("gt", "ge", "lt", "le")  # the order the message lists them in
SYMBOL = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
BOUNDED = {f.name: (f, kind) for f, kind, _ in ALL_FIELDS if set(BOUND_KEYS) & set(field_rules(f))}
CHOICE_FIELDS = {f.name: field_rules(f)["choices"] for f, _, _ in ALL_FIELDS if "choices" in field_rules(f)}
REQUIRED = sorted(f.name for f, _, optional in ALL_FIELDS if not optional and f.name not in CHOICE_FIELDS)
OPTIONAL = sorted(f.name for f, _, optional in ALL_FIELDS if optional)
LIST_FIELDS = {name: item for section in SECTIONS for name, item in list_fields(section).items()}


def test_the_field_tables_cover_the_config():
    assert len(BOUNDED) > 40 and {"top_p", "seed", "lora_dropout", "gen_max_tokens", "min_p"} <= set(BOUNDED)
    assert {"backend", "vllm_standby", "kl_action"} <= set(CHOICE_FIELDS)
    assert {"output_dir", "max_steps", "lora_target_modules"} <= set(REQUIRED)
    assert {"gen_max_tokens", "vllm_server_base_url", "reward_weights"} <= set(OPTIONAL)


def wanted(rules: dict) -> str:
    """The declared bounds as the message states them: gt, ge, lt, le, joined with " and "."""
    return " and ".join(f"{SYMBOL[key]} {rules[key]}" for key in BOUND_KEYS if key in rules)


def outside(key: str, bound, kind: type):
    """A value past one bound, with a short printed form: the bound itself for gt/lt, one step past for ge/le."""
    step = 1 if kind is int else 0.5
    return {"gt": bound, "ge": bound - step, "lt": bound, "le": bound + step}[key]


def just_outside(key: str, bound, kind: type):
    if kind is int:
        return {"gt": bound, "ge": bound - 1, "lt": bound, "le": bound + 1}[key]
    toward = {"gt": -math.inf, "ge": -math.inf, "lt": math.inf, "le": math.inf}[key]
    return bound if key in ("gt", "lt") else math.nextafter(bound, toward)


def just_inside(key: str, bound, kind: type):
    if kind is int:
        return {"gt": bound + 1, "ge": bound, "lt": bound - 1, "le": bound}[key]
    toward = {"gt": math.inf, "ge": math.inf, "lt": -math.inf, "le": -math.inf}[key]
    return math.nextafter(bound, toward) if key in ("gt", "lt") else bound


BOUND_CASES = [(name, key) for name, (f, _) in BOUNDED.items() for key in BOUND_KEYS if key in field_rules(f)]
BOUND_IDS = [f"{name}-{key}" for name, key in BOUND_CASES]


@pytest.mark.parametrize("name, key", BOUND_CASES, ids=BOUND_IDS)
def test_a_value_past_a_bound_is_refused_stating_every_bound_and_the_default(name, key):
    f, kind = BOUNDED[name]
    rules = field_rules(f)
    value = outside(key, rules[key], kind)
    err = refusal(check_field_values, config(**{name: value}))
    default = "" if f.default is None else f" (the default is {f.default})"
    assert err.field == name
    why = f": {rules['why']}" if rules.get("why") else ""
    assert str(err) == f"config error in `{name}`: got {value:g}; it must be {wanted(rules)}{default}{why}."


@pytest.mark.parametrize("name, key", BOUND_CASES, ids=BOUND_IDS)
def test_each_bound_is_exact_just_inside_passes_and_just_outside_is_refused(name, key):
    f, kind = BOUNDED[name]
    bound = field_rules(f)[key]
    cfg = config(**{name: just_inside(key, bound, kind)})
    check_field_values(cfg)
    assert getattr(getattr(cfg, _section_of(name)), name) == just_inside(key, bound, kind)
    assert refusal(check_field_values, config(**{name: just_outside(key, bound, kind)})).field == name


# TRL's numeric options (pipeline/config/trl_fields.py TRL_BOUNDS): the same boundaries, set as TRL options.
TRL_BOUND_CASES = [(name, key) for name, rules in TRL_BOUNDS.items() for key in BOUND_KEYS if key in rules]


@pytest.mark.parametrize("name, key", TRL_BOUND_CASES, ids=[f"{name}-{key}" for name, key in TRL_BOUND_CASES])
def test_each_trl_bound_is_exact_just_inside_passes_and_just_outside_is_refused(name, key):
    rules = TRL_BOUNDS[name]
    check_field_values(PipelineConfig(trl={name: just_inside(key, float(rules[key]), float)}))
    err = refusal(check_field_values, PipelineConfig(trl={name: just_outside(key, float(rules[key]), float)}))
    assert_names(err, name, "it must be", rules["why"])


def test_every_numeric_field_of_ours_has_a_bound():
    numeric = {f.name for f, kind, _ in ALL_FIELDS if kind in (int, float)}
    assert len(numeric) > 40 and sorted(numeric - set(BOUNDED)) == []


def _section_of(name: str) -> str:
    from grpo_pipeline.pipeline.config.fields import field_names
    from grpo_pipeline.pipeline.config.pipeline_config import SECTION_ATTR

    return SECTION_ATTR[field_names()[name]]


def test_the_bounds_message_joins_bounds_in_gt_ge_lt_le_order():
    assert wanted({"le": 1, "gt": 0}) == "> 0 and <= 1"
    err = refusal(check_field_values, config(top_p=0))
    assert str(err) == "config error in `top_p`: got 0; it must be > 0 and <= 1 (the default is 1.0)."
    err = refusal(check_field_values, config(min_p=1.5))  # no default: no suggestion
    assert str(err) == "config error in `min_p`: got 1.5; it must be >= 0 and <= 1."


# ---------------------------------------------------------------------------------------- empty values


@pytest.mark.parametrize("name", REQUIRED)
def test_none_in_a_field_that_needs_a_value_is_refused_as_empty_naming_it(name):
    err = refusal(check_field_values, config(**{name: None}))
    assert_names(err, name)
    assert str(err).startswith(f"config error in `{name}`: is empty; ")


@pytest.mark.parametrize("name", sorted(CHOICE_FIELDS))
def test_none_in_a_choice_field_is_refused_listing_the_choices(name):
    err = refusal(check_field_values, config(**{name: None}))
    assert_names(err, name, f"got None; choose one of {', '.join(CHOICE_FIELDS[name])}.")


@pytest.mark.parametrize("name", OPTIONAL)
def test_none_in_an_optional_field_passes(name):
    check_field_values(config(**{name: None}))


# ---------------------------------------------------------------------------------------- list fields


NUMBER_LISTS = sorted(name for name, item in LIST_FIELDS.items() if item in (int, float))
NAME_LISTS = sorted(name for name, item in LIST_FIELDS.items() if item is str)


def test_the_list_tables_are_found():
    assert NUMBER_LISTS == ["reward_weights"] and {"reward_funcs", "lora_target_modules"} <= set(NAME_LISTS)


@pytest.mark.parametrize("name", NUMBER_LISTS)
def test_number_list_items_are_coerced_to_their_kind(name):
    item = LIST_FIELDS[name]
    cfg = config(**{name: [1, "2", "2.5", 3.0] if item is float else [1, "2", 3.0]})
    check_field_values(cfg)
    got = getattr(getattr(cfg, _section_of(name)), name)
    assert got == ([1.0, 2.0, 2.5, 3.0] if item is float else [1, 2, 3])
    assert all(type(v) is item for v in got)


@pytest.mark.parametrize("name", NUMBER_LISTS)
@pytest.mark.parametrize("bad, fact", [("a", "got 'a'; use {article}."), (True, "got True; use {article}."),
                                       (float("nan"), "got nan; use a finite number."),
                                       ([1], "got [1] (list); use {article}.")])
def test_a_bad_number_list_item_is_refused_naming_the_field(name, bad, fact):
    article = {int: "an integer", float: "a number"}[LIST_FIELDS[name]]
    err = refusal(check_field_values, config(**{name: [1.0, bad]}))
    assert_names(err, name, fact.format(article=article))


@pytest.mark.parametrize("name", NAME_LISTS)
@pytest.mark.parametrize("bad", [3, "", "  ", None])
def test_a_bad_name_list_item_is_refused_naming_it_and_the_list(name, bad):
    err = refusal(check_field_values, config(**{name: ["q_proj", bad]}))
    assert_names(err, name, f"got {bad!r} in ['q_proj', {bad!r}]; each entry is a name (text).")


# --------------------------------------------------------------------------------------------- coerce


COERCED = [
    (int, "3", 3), (int, 2.0, 2), (int, -1, -1), (int, "-1", -1), (int, " 7 ", 7),
    (float, "1e-5", 1e-5), (float, 3, 3.0), (float, "2", 2.0), (float, 0.25, 0.25),
    (bool, True, True), (bool, False, False),
]


@pytest.mark.parametrize("kind, value, expected", COERCED)
def test_coerce_turns_good_values_into_the_kind(kind, value, expected):
    got = coerce(value, kind, "x")
    assert got == expected and type(got) is kind


ARTICLE = {int: "an integer", float: "a number", bool: "true or false"}
REFUSED_COERCE = [
    (int, True, "got True; use an integer."),
    (int, False, "got False; use an integer."),
    (int, "abc", "got 'abc'; use an integer."),
    (int, "1.5", "got '1.5'; use an integer."),  # text for an int field is read as an int, never as a float
    (int, "1e3", "got '1e3'; use an integer."),
    (int, "inf", "got 'inf'; use an integer."),
    (int, [1], "got [1] (list); use an integer."),
    (int, None, "got None (NoneType); use an integer."),
    (int, float("inf"), "got inf; use a finite number."),
    (int, float("nan"), "got nan; use a finite number."),
    (int, 1.5, "got 1.5; use a whole number such as 1."),
    (int, 0.5, "got 0.5; use a whole number such as 1."),
    (int, 2.5, "got 2.5; use a whole number such as 2."),
    (int, -1.5, "got -1.5; use a whole number such as 1."),
    (float, True, "got True; use a number."),
    (float, "fast", "got 'fast'; use a number."),
    (float, {"a": 1}, "got {'a': 1} (dict); use a number."),
    (float, [1.0], "got [1.0] (list); use a number."),
    (float, "inf", "got inf; use a finite number."),
    (float, float("-inf"), "got -inf; use a finite number."),
    (float, float("nan"), "got nan; use a finite number."),
    (bool, "yes", "got 'yes'; use true or false."),
    (bool, 1, "got 1; use true or false."),
    (bool, None, "got None; use true or false."),
]


@pytest.mark.parametrize("kind, value, message", REFUSED_COERCE,
                         ids=[f"{k.__name__}-{v!r}" for k, v, _ in REFUSED_COERCE])
def test_coerce_refuses_a_bad_value_naming_the_field_and_the_kind_wanted(kind, value, message):
    err = refusal(coerce, value, kind, "some_field")
    assert err.field == "some_field"
    assert str(err) == f"config error in `some_field`: {message}"


SCALARS = [(f.name, kind) for f, kind, _ in ALL_FIELDS if kind in (int, float, bool) and f.name not in CHOICE_FIELDS]


@pytest.mark.parametrize("name, kind", SCALARS, ids=[n for n, _ in SCALARS])
def test_every_scalar_field_refuses_the_wrong_type_saying_what_to_use(name, kind):
    bad = "yes" if kind is bool else True
    err = refusal(check_field_values, config(**{name: bad}))
    assert_names(err, name, f"got {bad!r}; use {ARTICLE[kind]}.")


# ------------------------------------------------------------------------------------------ world size


@pytest.mark.parametrize("env, expected", [(None, 1), ("1", 1), ("2", 2), ("8", 8), ("0", 1), ("-3", 1),
                                           ("abc", 1), ("", 1), ("2.5", 1)])
def test_world_size_reads_WORLD_SIZE_and_is_at_least_one(monkeypatch, env, expected):
    if env is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", env)
    assert world_size() == expected


def test_validate_counts_the_processes_from_WORLD_SIZE_when_not_given(monkeypatch):
    cfg = config(num_generations=8, per_device_train_batch_size=4)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert validate(cfg) == []  # 4 x 1 x 2 = 8
    monkeypatch.delenv("WORLD_SIZE")
    err = refusal(validate, cfg)
    assert_names(err, "per_device_train_batch_size", "x processes (1) = 4 is not divisible by num_generations (8)")


# ---------------------------------------------------------------------------------------------- limits


@pytest.mark.parametrize("value, expected", [(None, None), ("auto", None), (" Auto ", None), ("AUTO", None),
                                             ("1", 1), (1, 1), ("16", 16), (512, 512)])
def test_parse_limit_reads_auto_or_a_positive_integer(value, expected):
    assert parse_limit(value, "max_prompt_length") == expected


@pytest.mark.parametrize("name", ["max_prompt_length", "max_completion_length"])
@pytest.mark.parametrize("value, fact", [("0", "got 0;"), (0, "got 0;"), ("-5", "got -5;"), (-1, "got -1;"),
                                         ("lots", "got 'lots';"), ([1], "got [1];"), ("", "got '';")])
def test_parse_limit_refuses_anything_else_naming_the_field(name, value, fact):
    err = refusal(parse_limit, value, name)
    assert_names(err, name, fact, "use a positive integer or `auto`")


# ------------------------------------------------------------------------------------ validate()'s rules


# (id, overrides, n_processes, field, facts): each just past a rule's boundary.
REFUSED = [
    ("max_steps-0", {"max_steps": 0}, 1, "max_steps", ["`max_steps`: got 0,", "-1 to train num_train_epochs"]),
    ("num_generations-1", {"num_generations": 1, "per_device_train_batch_size": 1}, 1, "num_generations",
     ["got 1;", "at least 2"]),
    ("num_generations-0", {"num_generations": 0}, 1, "num_generations", ["got 0;"]),
    ("num_generations--2", {"num_generations": -2}, 1, "num_generations", ["got -2;"]),
    ("batch-4-of-8", {"num_generations": 8, "per_device_train_batch_size": 4}, 1, "per_device_train_batch_size",
     [("per_device_train_batch_size (4) x gradient_accumulation_steps (1) x processes (1) = 4 is not divisible by "
       "num_generations (8)"), "a multiple of 8 (e.g. 8)"]),
    ("batch-1-of-2", {"num_generations": 2, "per_device_train_batch_size": 1}, 1, "per_device_train_batch_size",
     [("per_device_train_batch_size (1) x gradient_accumulation_steps (1) x processes (1) = 1 is not divisible by "
       "num_generations (2)")]),
    ("batch-3x2x2-of-8", {"num_generations": 8, "per_device_train_batch_size": 3, "gradient_accumulation_steps": 2}, 2,
     "per_device_train_batch_size", ["(3) x gradient_accumulation_steps (2) x processes (2) = 12 is not divisible"]),
    ("prompt+completion", {"max_prompt_length": "512", "max_completion_length": "600"}, 1, "max_completion_length",
     ["max_prompt_length (512) + max_completion_length (600) = 1112 exceeds max_seq_length (1024)",
      "raise max_seq_length, or set max_completion_length: auto"]),
    ("prompt+completion-by-1", {"max_seq_length": 256, "max_prompt_length": "128", "max_completion_length": "129"}, 1,
     "max_completion_length",
     ["max_prompt_length (128) + max_completion_length (129) = 257 exceeds max_seq_length (256)"]),
    ("prompt-fills-seq", {"max_seq_length": 256, "max_prompt_length": "256"}, 1, "max_prompt_length",
     ["256 leaves no room in max_seq_length (256)"]),
    ("prompt-past-seq", {"max_seq_length": 256, "max_prompt_length": "300"}, 1, "max_prompt_length",
     ["300 leaves no room in max_seq_length (256)"]),
    ("completion-fills-seq", {"max_seq_length": 256, "max_completion_length": "256"}, 1, "max_completion_length",
     ["256 leaves no room in max_seq_length (256)"]),
    ("prompt-0", {"max_prompt_length": "0"}, 1, "max_prompt_length", ["got 0;"]),
    ("completion-0", {"max_completion_length": "0"}, 1, "max_completion_length", ["got 0;"]),
    ("lora_r-0", {"lora_r": 0}, 1, "lora_r", ["got 0;", "positive rank"]),
    ("lora_r--1", {"lora_r": -1}, 1, "lora_r", ["got -1;"]),
    ("lora_r-above-max", {"lora_r": 65}, 1, "lora_r",
     ["(lora_r) has rank r=65, above max_lora_rank=64", "Raise max_lora_rank to 65 or lower lora_r"]),
    ("temperature-0", {"temperature": 0}, 1, "temperature", ["got 0;", ">= 1e-05", "rollouts need sampling"]),
    ("temperature-1e-40", {"temperature": 1e-40}, 1, "temperature", ["got 1e-40;", "overflow float32"]),
    ("temperature-below-vllm-eps", {"temperature": 1e-6}, 1, "temperature", ["got 1e-06;", "vLLM samples greedily"]),
    ("gen_temperature-1e-40", {"gen_temperature": 1e-40}, 1, "gen_temperature", ["got 1e-40;", "0 for greedy"]),
    ("temperature-negative", {"temperature": -0.5}, 1, "temperature", ["got -0.5;"]),
    ("temperature-inf", {"temperature": float("inf")}, 1, "temperature", ["got inf; use a finite number"]),
    ("gen_max_tokens-by-1", {"max_completion_length": "256", "gen_max_tokens": 257}, 1, "gen_max_tokens",
     ["gen_max_tokens (257) exceeds the trained max_completion_length (256)", "allow_longer_generation: true"]),
    ("beta-negative", {"beta": -0.1}, 1, "beta", ["got -0.1;", "0 is no KL"]),
    ("adaptive-beta-0", {"adaptive_beta": True, "beta": 0.0}, 1, "adaptive_beta",
     ["`adaptive_beta`: needs beta > 0", "beta: 0.04"]),
    ("beta_min-negative", {"adaptive_beta": True, "beta": 0.04, "beta_min": -0.001}, 1, "beta_min",
     ["got -0.001; it must be >= 0"]),
    ("beta_min-above-max", {"adaptive_beta": True, "beta": 0.04, "beta_min": 0.6, "beta_max": 0.5}, 1, "beta_min",
     ["beta_min (0.6) <= beta_max (0.5)"]),
    ("sampling-not-json", {"vllm_sampling_params": "min_p=0.1"}, 1, "vllm_sampling_params",
     ["got 'min_p=0.1';", "JSON object"]),
    ("sampling-not-a-mapping", {"vllm_sampling_params": "[0.1]"}, 1, "vllm_sampling_params", ["must be a mapping"]),
    ("reward-unknown", {"reward_funcs": ["int", "nope"]}, 1, "reward_funcs", ["'nope'"]),
    ("reward-empty", {"reward_funcs": []}, 1, "reward_funcs", ["the list is empty"]),
    ("reward-twice", {"reward_funcs": ["int", "int"]}, 1, "reward_funcs", ["'int' and 'int' are the same reward"]),
    ("weights-count", {"reward_weights": [1.0]}, 1, "reward_weights", ["1 weights for 5 reward functions"]),
    ("weights-nan", {"reward_weights": [1.0, 1.0, 1.0, 1.0, float("nan")]}, 1, "reward_weights",
     ["use a finite number"]),
] + [
    (f"sampling-{key}", {"vllm_sampling_params": {key: 1}}, 1, "vllm_sampling_params",
     [f"`{key}` is ignored there", f"set `{where}` instead"])
    for key, where in UNSLOTH_OVERRIDDEN_SAMPLING_FIELDS.items()
]


@pytest.mark.parametrize("overrides, n_processes, field, facts", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_validate_refuses_naming_the_field_and_the_numbers(overrides, n_processes, field, facts):
    assert_names(refusal(validate, config(**overrides), n_processes=n_processes), field, *facts)


# (id, overrides, n_processes): each just inside a rule's boundary, and nothing to warn about.
ACCEPTED = [
    ("num_generations-2", {"num_generations": 2, "per_device_train_batch_size": 2}, 1),
    ("batch-1x2-of-2", {"num_generations": 2, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 2}, 1),
    ("batch-1x1x2-of-2", {"num_generations": 2, "per_device_train_batch_size": 1}, 2),
    ("batch-2x2x2-of-8",
     {"num_generations": 8, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}, 2),
    ("batch-16-of-8", {"num_generations": 8, "per_device_train_batch_size": 16}, 1),
    ("prompt+completion-fill-seq",
     {"max_seq_length": 256, "max_prompt_length": "128", "max_completion_length": "128"}, 1),
    ("prompt-one-less", {"max_seq_length": 256, "max_prompt_length": "255"}, 1),
    ("completion-one-less", {"max_seq_length": 256, "max_completion_length": "255"}, 1),
    ("prompt-1", {"max_prompt_length": "1"}, 1),
    ("completion-1", {"max_completion_length": "1"}, 1),
    ("limits-auto", {"max_prompt_length": "auto", "max_completion_length": "AUTO"}, 1),
    ("lora_r-1", {"lora_r": 1}, 1),
    ("lora_r-at-max", {"lora_r": 64, "max_lora_rank": 64}, 1),
    ("lora_r-raised-max", {"lora_r": 128, "max_lora_rank": 128}, 1),
    ("temperature-at-vllm-eps", {"temperature": 1e-5}, 1),
    ("gen_temperature-greedy", {"gen_temperature": 0.0}, 1),
    ("gen_temperature-at-vllm-eps", {"gen_temperature": 1e-5}, 1),
    ("gen_max_tokens-at-limit", {"max_completion_length": "256", "gen_max_tokens": 256}, 1),
    ("gen_max_tokens-allowed-longer", {"max_completion_length": "256", "gen_max_tokens": 257,
                                       "allow_longer_generation": True}, 1),
    ("gen_max_tokens-auto-limit", {"gen_max_tokens": 5000}, 1),
    ("learning_rate-1e-7", {"learning_rate": 1e-7}, 1),
    ("learning_rate-1e-3", {"learning_rate": 1e-3}, 1),
    ("beta-0", {"beta": 0.0}, 1),
    ("beta-positive", {"beta": 0.04}, 1),
    ("adaptive-beta", {"adaptive_beta": True, "beta": 0.04}, 1),
    ("adaptive-beta-above-1", {"adaptive_beta": True, "beta": 2.0, "beta_max": 5.0}, 1),
    ("adaptive-beta-tiny", {"adaptive_beta": True, "beta": 1e-6}, 1),
    ("beta_min-0", {"adaptive_beta": True, "beta": 0.04, "beta_min": 0.0}, 1),
    ("beta_min-equals-max", {"adaptive_beta": True, "beta": 0.04, "beta_min": 0.1, "beta_max": 0.1}, 1),
    ("beta_min-between-0-and-1", {"adaptive_beta": True, "beta": 0.04, "beta_min": 0.5, "beta_max": 2.0}, 1),
    ("beta-band-unused", {"adaptive_beta": False, "beta_min": 0.9, "beta_max": 0.1}, 1),
    ("sampling-json", {"vllm_sampling_params": '{"min_p": 0.1}'}, 1),
    ("sampling-mapping", {"vllm_sampling_params": {"min_p": 0.1, "stop": ["</answer>"]}}, 1),
    ("sampling-empty-text", {"vllm_sampling_params": ""}, 1),
    ("server-with-url", {"vllm_mode": "server", "vllm_server_base_url": "http://host:8000"}, 1),
    ("colocate", {"vllm_mode": "colocate"}, 1),
    ("weights", {"reward_weights": [1.0, 0.5, 0.5, 1, "2"]}, 1),
    ("one-reward", {"reward_funcs": ["int"], "reward_weights": [2.0]}, 1),
]


@pytest.mark.parametrize("overrides, n_processes", [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_validate_accepts_values_just_inside_each_rule(overrides, n_processes):
    assert passes(config(**overrides), n_processes=n_processes) == []


@pytest.mark.parametrize("learning_rate", [math.nextafter(1e-7, 0), 5e-8, math.nextafter(1e-3, 1), 1e-2])
def test_a_learning_rate_just_outside_1e_7_to_1e_3_warns_once_and_passes(learning_rate):
    with pytest.warns(UserWarning) as caught:
        notes = validate(config(learning_rate=learning_rate), n_processes=1)
    assert len(notes) == 1 and notes[0].startswith(f"learning_rate {learning_rate:g} is outside 1e-7..1e-3")
    assert "1e-6..5e-5" in notes[0] and "5e-6" in notes[0]  # the usual range, as the fix
    assert [str(w.message) for w in caught] == notes


def test_vllm_server_mode_without_a_base_url_warns_about_the_default_host():
    with pytest.warns(UserWarning) as caught:
        notes = validate(config(vllm_mode="server"), n_processes=1)
    assert len(notes) == 1
    assert "vllm_mode=server without vllm_server_base_url" in notes[0] and "0.0.0.0:8000" in notes[0]
    assert [str(w.message) for w in caught] == notes
    assert passes(config(vllm_mode="server", vllm_server_base_url="http://h:1")) == []


def test_both_notes_are_returned_in_order():
    with pytest.warns(UserWarning):
        notes = validate(config(vllm_mode="server", learning_rate=1e-2), n_processes=1)
    assert len(notes) == 2 and notes[0].startswith("learning_rate 0.01") and notes[1].startswith("vllm_mode=server")


# ------------------------------------------------------------------------------- vllm_sampling_params


@pytest.mark.parametrize("value", [None, "", {}])
def test_no_sampling_params_is_an_empty_mapping(value):
    assert sampling_params_mapping(value) == {}


def test_a_sampling_params_mapping_is_copied():
    given = {"min_p": 0.1}
    got = sampling_params_mapping(given)
    assert got == given and got is not given
    got["stop"] = ["x"]
    assert given == {"min_p": 0.1}


@pytest.mark.parametrize("text, expected", [('{"min_p": 0.1}', {"min_p": 0.1}),
                                            ('{"stop": ["</answer>"], "top_k": 5}',
                                             {"stop": ["</answer>"], "top_k": 5}),
                                            ("{}", {})])
def test_a_sampling_params_json_object_is_parsed(text, expected):
    assert sampling_params_mapping(text) == expected


@pytest.mark.parametrize("value", ["min_p: 0.1", "{min_p: 0.1}", "{", 5, 1.5, ["min_p"]])
def test_sampling_params_that_are_not_json_are_refused_asking_for_a_json_object(value):
    err = refusal(sampling_params_mapping, value)
    assert_names(err, "vllm_sampling_params", f"got {value!r}; give a YAML mapping or a JSON object",
                 "'{\"min_p\": 0.1}'")


@pytest.mark.parametrize("text", ["[1, 2]", '"min_p"', "0.1", "null", "true"])
def test_sampling_params_json_that_is_not_an_object_is_refused_as_not_a_mapping(text):
    err = refusal(sampling_params_mapping, text)
    assert_names(err, "vllm_sampling_params")
    assert str(err) == "config error in `vllm_sampling_params`: must be a mapping such as {min_p: 0.1}."


# ------------------------------------------------------------------------------------ validate_unsloth


# (id, overrides, field, facts)
UNSLOTH_REFUSED = [
    ("save-q_proj", {"lora_modules_to_save": ["q_proj"], "fast_inference": False}, "lora_modules_to_save",
     ["got ['q_proj'];", "lm_head, embed_tokens and normalization layers",
      "lora_target_modules, or use backend: plain"]),
    ("save-mixed", {"lora_modules_to_save": ["norm", "model.layers.0.mlp", "embed_tokens", "o_proj"],
                    "fast_inference": False}, "lora_modules_to_save", ["got ['model.layers.0.mlp', 'o_proj'];"]),
    ("save-norm-prefix-only", {"lora_modules_to_save": ["norm.q_proj"], "fast_inference": False},
     "lora_modules_to_save", ["got ['norm.q_proj'];"]),
    ("save-embedding-prefix-only", {"lora_modules_to_save": ["embed_tokens.q_proj", "lm_head.v_proj"],
                                    "fast_inference": False},
     "lora_modules_to_save", ["got ['embed_tokens.q_proj', 'lm_head.v_proj'];"]),
    ("save-embedding-like", {"lora_modules_to_save": ["embed_tokens_2"], "fast_inference": False},
     "lora_modules_to_save", ["got ['embed_tokens_2'];"]),
    ("save-deep-norm-prefix-only", {"lora_modules_to_save": ["model.final_norm.q_proj", "base.model.lm_head.proj"],
                                    "fast_inference": False},
     "lora_modules_to_save", ["got ['model.final_norm.q_proj', 'base.model.lm_head.proj'];"]),
    ("save-with-vllm", {"lora_modules_to_save": ["norm"], "fast_inference": True}, "lora_modules_to_save",
     ["got ['norm'], but", "(fast_inference: true)", "set fast_inference: false", "or use backend: plain"]),
    ("save-embeddings-with-vllm", {"lora_modules_to_save": ["embed_tokens", "lm_head"]}, "lora_modules_to_save",
     ["got ['embed_tokens', 'lm_head'], but"]),
    ("target-embed_tokens-with-vllm", {"lora_target_modules": ["q_proj", "embed_tokens"]}, "lora_target_modules",
     ["contains ['embed_tokens']:", "(fast_inference: true)", "embed_tokens is refused, lm_head would stay untrained",
      "set fast_inference: false"]),
    ("target-lm_head-with-vllm", {"lora_target_modules": ["model.lm_head", "v_proj", "model.embed_tokens"]},
     "lora_target_modules", ["contains ['model.lm_head', 'model.embed_tokens']:"]),
    ("target-deep-embeddings-with-vllm", {"lora_target_modules": ["base_model.model.lm_head", "model.layers.0.q_proj",
                                                                   "base_model.model.embed_tokens"]},
     "lora_target_modules", ["contains ['base_model.model.lm_head', 'base_model.model.embed_tokens']:"]),
    ("sampling-without-vllm", {"fast_inference": False, "vllm_sampling_params": {"min_p": 0.1}},
     "vllm_sampling_params", ["`vllm_sampling_params`: is for vLLM", "fast_inference: false", "fast_inference: true"]),
    ("sampling-json-without-vllm", {"fast_inference": False, "vllm_sampling_params": '{"stop": ["x"]}'},
     "vllm_sampling_params", ["is for vLLM"]),
    ("standby-without-vllm", {"fast_inference": False, "vllm_standby": "true"}, "vllm_standby",
     ["fast_inference: false", "vllm_standby: auto or false"]),
    ("standby-yaml-true-without-vllm", {"fast_inference": False, "vllm_standby": True}, "vllm_standby", []),
]

UNSLOTH_ACCEPTED = [
    ("defaults", {}),
    ("save-embeddings-and-norms", {"lora_modules_to_save": ["embed_tokens", "lm_head", "norm", "input_layernorm",
                                                            "model.layers.0.post_attention_layernorm",
                                                            "model.embed_tokens", "model.norm",
                                                            "base_model.model.embed_tokens",
                                                            "base_model.model.lm_head",
                                                            "base_model.model.norm"],
                                   "fast_inference": False}),
    ("save-nothing-with-vllm", {"lora_modules_to_save": [], "fast_inference": True}),
    ("target-embeddings-without-vllm", {"lora_target_modules": ["q_proj", "embed_tokens", "lm_head"],
                                        "fast_inference": False}),
    ("target-embedding-like-names-with-vllm", {"lora_target_modules": ["embed_tokens_proj", "lm_head_2", "q_proj",
                                                                       "lm_head.q_proj"]}),
    ("sampling-with-vllm", {"fast_inference": True, "vllm_sampling_params": {"min_p": 0.1}}),
    ("no-sampling-without-vllm", {"fast_inference": False, "vllm_sampling_params": None}),
    ("empty-sampling-without-vllm", {"fast_inference": False, "vllm_sampling_params": {}}),
    ("standby-true-with-vllm", {"fast_inference": True, "vllm_standby": "true"}),
    ("standby-auto-without-vllm", {"fast_inference": False, "vllm_standby": "auto"}),
    ("standby-false-without-vllm", {"fast_inference": False, "vllm_standby": "false"}),
]


@pytest.mark.parametrize("overrides, field, facts", [c[1:] for c in UNSLOTH_REFUSED],
                         ids=[c[0] for c in UNSLOTH_REFUSED])
def test_validate_unsloth_refuses_what_unsloth_would_refuse_after_loading(overrides, field, facts):
    cfg = config(**overrides)
    assert_names(refusal(validate_unsloth, cfg.lora.lora_modules_to_save, cfg.lora.lora_target_modules,
                         cfg.model.fast_inference, cfg.grpo.vllm_sampling_params, cfg.model.vllm_standby), field, *facts)


@pytest.mark.parametrize("overrides, field, facts", [c[1:] for c in UNSLOTH_REFUSED],
                         ids=[c[0] for c in UNSLOTH_REFUSED])
def test_validate_runs_the_unsloth_rules_for_the_resolved_unsloth_backend(overrides, field, facts):
    cfg = config(**overrides)  # backend: auto in the config, resolved to unsloth by the caller
    assert_names(refusal(validate, cfg, n_processes=1, backend="unsloth"), field, *facts)
    assert_names(refusal(validate, cfg.replace(backend="unsloth"), n_processes=1), field, *facts)


@pytest.mark.parametrize("overrides, field, facts", [c[1:] for c in UNSLOTH_REFUSED],
                         ids=[c[0] for c in UNSLOTH_REFUSED])
def test_validate_skips_the_unsloth_rules_for_the_plain_backend(overrides, field, facts):
    cfg = config(**overrides)
    assert passes(cfg) == []  # auto, unresolved
    assert passes(cfg, backend="plain") == []
    assert passes(cfg.replace(backend="plain")) == []
    assert passes(cfg.replace(backend="unsloth"), backend="plain") == []  # the resolved backend wins


@pytest.mark.parametrize("overrides", [c[1] for c in UNSLOTH_ACCEPTED], ids=[c[0] for c in UNSLOTH_ACCEPTED])
def test_validate_unsloth_accepts_what_unsloth_trains(overrides):
    cfg = config(**overrides)
    assert validate_unsloth(cfg.lora.lora_modules_to_save, cfg.lora.lora_target_modules, cfg.model.fast_inference,
                            cfg.grpo.vllm_sampling_params, cfg.model.vllm_standby) is None
    assert passes(cfg, backend="unsloth") == []
    assert passes(cfg.replace(backend="unsloth")) == []


TRUNCATING = [{"min_p": 0.1}, {"top_p": 0.9}, {"top_k": 20}, {"min_p": 0.05, "top_k": 5}]


@pytest.mark.parametrize("sampler", TRUNCATING, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("vllm_mode", ["colocate", "server"])
def test_a_truncating_sampler_under_trls_vllm_importance_correction_is_refused_naming_both_fixes(sampler, vllm_mode):
    with pytest.raises(ConfigError) as refused:
        validate(config(vllm_mode=vllm_mode, vllm_server_base_url="http://h:8000", **sampler), backend="plain")
    assert refused.value.field == next(iter(sampler)) and "vllm_importance_sampling_correction: false" in str(
        refused.value) and "min_p: null, top_p: 1.0, top_k: 0" in str(refused.value)


@pytest.mark.parametrize("case", [
    dict(vllm_mode="none", min_p=0.1),  # transformers generates: the trainer scores what it sampled from
    dict(vllm_mode="colocate", min_p=0.1, vllm_importance_sampling_correction=False),
    dict(vllm_mode="colocate", top_p=1.0, top_k=0, min_p=None),
    dict(vllm_mode="colocate", min_p=0.0),
])
def test_a_sampler_that_keeps_the_whole_distribution_or_no_correction_passes(case):
    validate(config(**case), backend="plain")
