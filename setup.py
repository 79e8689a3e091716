"""The one thing pyproject.toml cannot say: every package found under pipeline/, rewards/ and env/, installed
under the one import name grpo_pipeline (grpo_pipeline.pipeline.data, grpo_pipeline.rewards, ...)."""

from setuptools import find_packages, setup

FOLDERS = ("pipeline", "rewards", "env")

setup(packages=[f"grpo_pipeline.{name}" for name in find_packages(include=[f"{folder}*" for folder in FOLDERS])],
      package_dir={f"grpo_pipeline.{folder}": folder for folder in FOLDERS})
