"""A user's reward plug-in, loaded by tests/test_rewards_registry.py as
'test_rewards_plugin_helper:answer_length_reward'.

It holds no tests itself; it stands in for a module a user would put on PYTHONPATH.
"""

from grpo_pipeline.rewards import completion_texts, extract_xml_answer

NOT_A_FUNCTION = 3


def answer_length_reward(completions, **kwargs) -> list[float]:
    """0.1 per character of the answer block, at most 1.0."""
    return [min(len(extract_xml_answer(text)) * 0.1, 1.0) for text in completion_texts(completions)]
