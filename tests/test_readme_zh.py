"""README.zh-CN.md is the same newcomer page as README.md: every command of README.md's shell blocks is in it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def shell_commands(markdown: str) -> list[str]:
    """The command lines of the ```bash blocks, comments (translated in the other README) left out."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", markdown, flags=re.S | re.M):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def test_every_readme_command_is_in_the_chinese_readme():
    english = shell_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    chinese = set(shell_commands((ROOT / "README.zh-CN.md").read_text(encoding="utf-8")))
    assert len(english) >= 10  # the quick start, the GPU recipe, generate/eval/export, AutoDL
    missing = [command for command in english if command not in chinese]
    assert not missing, f"README.zh-CN.md lacks these README.md commands (add them to its code blocks): {missing}"


def test_the_readmes_link_each_other_and_the_chinese_one_covers_autodl():
    english = (ROOT / "README.md").read_text(encoding="utf-8")
    chinese = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    assert "(README.zh-CN.md)" in english and "(README.md)" in chinese
    for must in ("/root/autodl-tmp", "export HF_ENDPOINT=https://hf-mirror.com", "source /etc/network_turbo",
                 "model_source: modelscope", "pip install 'grpo-pipeline[modelscope]'"):
        assert must in chinese, must


def test_the_comment_stripping_keeps_what_a_shell_would_run():
    block = "```bash\n# a note\npip install -e \".[dev]\"   # trailing\ngrpo env\n```\n"
    assert shell_commands(block) == ['pip install -e ".[dev]"', "grpo env"]


def test_the_readme_stays_a_newcomers_page_and_its_links_resolve():
    for name in ("README.md", "README.zh-CN.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        assert len(text.splitlines()) <= 230, name
        for target in re.findall(r"\]\(((?:docs|notebooks)/[^)#]+)", text):
            if target != "docs/own-data.md":  # written on another branch; the lead merges it
                assert (ROOT / target).is_file(), (name, target)
