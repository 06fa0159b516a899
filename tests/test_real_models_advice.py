"""docs/real-models.md's training commands follow the page's own advice (they are marked
``no-test``: they need a download or a GGUF file, so nothing else checks them). Each
command's config is resolved as ``comlrl train`` would, without loading a model."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from comlrl.algos.cli import main as cli

PAGE = Path(__file__).resolve().parents[1] / "docs" / "real-models.md"
CODE_TASKS = {"coop_humaneval", "coop_humaneval_che", "mbpp", "classeval"}


def _train_commands() -> list[list[str]]:
    text = PAGE.read_text(encoding="utf-8")
    blocks = re.findall(r"```bash[^\n]*\n(.*?)```", text, flags=re.S)
    out = []
    for block in blocks:
        for line in block.splitlines():
            argv = shlex.split(line)
            if argv[:2] == ["comlrl", "train"] and "--print-config" not in argv:
                out.append(argv[1:])
    return out


COMMANDS = _train_commands()


def test_the_page_has_training_commands_on_code() -> None:
    tasks = {cli._fresh_config(cli.parse_args(a))[1].task.name for a in COMMANDS}
    assert tasks & CODE_TASKS, "the page lost its code-training commands"


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a)[:80])
def test_a_training_command_follows_the_pages_advice(argv: list[str]) -> None:
    _, config = cli._fresh_config(cli.parse_args(argv))
    # "optimizer=adamw for short runs: the default radam ... nothing at a pretrained rate"
    assert config.optimizer == "adamw", argv
    # "pretrained LLMs want about 1e-6 to 2e-5"
    assert 1e-6 <= config.learning_rate <= 2e-5, argv
    if config.task.name in CODE_TASKS:
        # "a function with its fences and a sentence of prose needs a few hundred tokens"
        assert config.max_new_tokens >= 256, argv
        # "For a small model on code, sample cooler (temperature=0.7, or top_p=0.9)"
        assert config.temperature <= 0.7 or config.top_p <= 0.9, argv
