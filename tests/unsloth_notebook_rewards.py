"""The Unsloth Qwen2.5 GRPO notebook's data preparation and its five reward functions, as the notebook writes
them (not ours; its correctness reward with the print it makes on every call): tests/test_data_trl.py trains on
them unchanged. Not a test module; importable as a reward plug-in (`unsloth_notebook_rewards:...`)."""

# The notebook's other four rewards and its answer reader, as bench/reward_cases.py keeps them (its `nb_` names, so that
# the bench tells them from ours): one copy of the notebook's code.
from bench.reward_cases import (  # noqa: F401 - re-exported as plug-ins
    nb_extract_xml_answer as extract_xml_answer,
    nb_int_reward_func,
    nb_soft_format_reward_func,
    nb_strict_format_reward_func,
    nb_xmlcount_reward_func,
)

SYSTEM_PROMPT = """
Respond in the following format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>
"""


def extract_hash_answer(text: str) -> str | None:
    if "####" not in text:
        return None
    return text.split("####")[1].strip()


def get_gsm8k_questions(rows: list[dict]) -> list[dict]:
    """The notebook's `data.map(lambda x: {...})` over GSM8K rows: `question` kept, `answer` replaced."""
    return [{**x, "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": x["question"]}],
             "answer": extract_hash_answer(x["answer"])} for x in rows]


def correctness_reward_func(prompts, completions, answer, **kwargs) -> list[float]:
    responses = [completion[0]["content"] for completion in completions]
    q = prompts[0][-1]["content"]
    extracted_responses = [extract_xml_answer(r) for r in responses]
    print("-" * 20, f"Question:\n{q}", f"\nAnswer:\n{answer[0]}", f"\nResponse:\n{responses[0]}",
          f"\nExtracted:\n{extracted_responses[0]}")
    return [2.0 if r == a else 0.0 for r, a in zip(extracted_responses, answer)]
