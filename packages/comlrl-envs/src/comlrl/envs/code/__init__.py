"""Code-generation task suites."""

from __future__ import annotations

from comlrl.envs.code.humaneval import (
    CoopHumanEvalTask,
    default_humaneval_path,
    load_humaneval,
    split_prompt,
)

__all__ = ["CoopHumanEvalTask", "default_humaneval_path", "load_humaneval", "split_prompt"]
