"""Writing task suites: ``tldr``, ``arxiv`` (CoMLRL-style writing rewards) and ``coop_story``."""

from __future__ import annotations

from comlrl.envs.writing.rewards import (
    ARXIV_SPEC,
    TLDR_SPEC,
    WritingRewardSpec,
    band_score,
    content_jaccard,
    transition_categories,
    writing_reward,
)
from comlrl.envs.writing.story import CoopStoryTask, story_reward, story_seeds
from comlrl.envs.writing.tasks import ArxivTask, TldrTask, WritingTask

__all__ = [
    "ARXIV_SPEC",
    "TLDR_SPEC",
    "ArxivTask",
    "CoopStoryTask",
    "TldrTask",
    "WritingRewardSpec",
    "WritingTask",
    "band_score",
    "content_jaccard",
    "story_reward",
    "story_seeds",
    "transition_categories",
    "writing_reward",
]
