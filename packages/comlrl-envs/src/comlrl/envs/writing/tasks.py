"""Two-agent writing suites in CoMLRL's style: ``tldr`` and ``arxiv``.

- ``tldr`` (Reddit TL;DR, the Hugging Face dataset ``trl-lib/tldr``: field ``prompt``,
  the post): agent 1 writes a concise summary, agent 2 a longer, more detailed one.
- ``arxiv`` (arXiv abstracts, ``OpenMLRL/arXiv_abstract``: field ``abstract_text``):
  abstract expansion into an introduction; agent 1 writes the background and motivation,
  agent 2 the method and implications.

Both are scored by :func:`comlrl.envs.writing.rewards.writing_reward` (reward in
``[0, 1]``; thresholds :data:`~comlrl.envs.writing.rewards.TLDR_SPEC` /
:data:`~comlrl.envs.writing.rewards.ARXIV_SPEC`, after CoMLRL's writing rewards).
Data: ``path=`` (a file or a per-split directory, see :mod:`comlrl.envs.writing._files`),
else the Hub through the optional ``datasets`` package.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.core import ChatPrompt, Feedback, Prompt, RewardBatch, Task
from comlrl.envs.writing._files import hub_rows, rows_for_split
from comlrl.envs.writing.rewards import (
    ARXIV_SPEC,
    TLDR_SPEC,
    WritingRewardSpec,
    writing_reward,
)

__all__ = ["TldrTask", "ArxivTask", "WritingTask"]


class WritingTask(Task):
    """Shared machinery of the two-agent writing suites (subclasses set the details).

    Args:
        path: a local ``.jsonl``/``.json`` file or a directory with one file per split;
            ``None`` loads the Hub dataset (needs ``datasets``).
        limit: keep at most this many rows per split.

    Raises:
        ValueError: for a negative ``limit``.
    """

    num_agents = 2
    max_turns = 1
    field: str = ""
    hub_dataset: str = ""
    hub_splits: dict[str, str] = {}
    file_names: dict[str, tuple[str, ...]] = {}
    spec: WritingRewardSpec = TLDR_SPEC
    templates: tuple[str, str] = ("", "")
    chat_roles: tuple[str, str] = ("", "")
    chat_requests: tuple[str, str] = ("{text}", "{text}")

    def __init__(self, path: str | Path | None = None, *, limit: int | None = None) -> None:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit}")
        self.path = path
        self.limit = limit

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        """Rows of ``split`` (``"train"`` or ``"test"``; disjoint).

        Raises:
            ValueError: for an unknown split or rows without the text field.
            FileNotFoundError: when the data cannot be found (the message names ``path=``).
        """
        if split not in self.file_names:
            raise ValueError(f"unknown split {split!r}; {self.name} has 'train' and 'test'")
        if self.path is not None:
            rows = rows_for_split(self.path, split, self.file_names, what=self.name)
        else:
            rows = hub_rows(self.hub_dataset, self.hub_splits[split])
        for i, row in enumerate(rows):
            if not str(row.get(self.field, "")).strip():
                raise ValueError(
                    f"{self.name}: row {i} of split {split!r} has no text in field "
                    f"{self.field!r}; rows need that field"
                )
        rows = [dict(r) for r in rows]
        return rows[: self.limit] if self.limit is not None else rows

    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Prompt]:
        """The two agents' prompts (single-turn: ``history`` unused).

        Chat form: a system message with the agent's part (:attr:`chat_roles`) and a user
        message with the text and what to write (:attr:`chat_requests`); ``raw``: the
        completion-style :attr:`templates` text for base models.
        """
        text = str(example[self.field]).strip()
        return [
            ChatPrompt(
                (
                    {"role": "system", "content": role},
                    {"role": "user", "content": request.format(text=text)},
                ),
                raw=template.format(text=text),
            )
            for role, request, template in zip(
                self.chat_roles, self.chat_requests, self.templates, strict=True
            )
        ]

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions with :func:`~comlrl.envs.writing.rewards.writing_reward`.

        Returns:
            ``K`` rewards in ``[0, 1]``; infos with the measured ratios, the level reached
            and ``reward_parts``.

        Raises:
            ValueError: when the shapes disagree.
        """
        k = self.check_joint_batch(completions, examples)
        rewards, infos = [], []
        for i in range(k):
            value, info = writing_reward(completions[0][i], completions[1][i], self.spec)
            rewards.append(value)
            infos.append(info)
        return RewardBatch(rewards, infos)


class TldrTask(WritingTask):
    """TL;DR (``tldr``): agent 1 a concise summary, agent 2 a detailed one.

    Prompts (our wording): both show the post; agent 1 is asked for a brief, factual
    summary in one or a few sentences, agent 2 for a more detailed summary with more
    distinct words and transition words. Reward: :data:`~comlrl.envs.writing.rewards.TLDR_SPEC`
    levels (each part 8-256 words; part 2 1.6-3.2x part 1's length; part 2 with >= 2x the
    distinct words; transitions in part 2 and some shared content words), in ``[0, 1]``.

    Splits: ``trl-lib/tldr``'s ``train`` and ``test``. A local directory holds
    ``train.jsonl`` and ``test.jsonl`` (or ``validation.jsonl``); a single file is split
    by its rows' ``split`` field, else by index (last fifth ``test``). Rows need ``prompt``.
    """

    name = "tldr"
    field = "prompt"
    hub_dataset = "trl-lib/tldr"
    #: Where the examples come from (``comlrl tasks`` prints it).
    data_source = (
        "no copy ships: task.kwargs.path=<.jsonl/.json or folder>, else the Hub's "
        "trl-lib/tldr (needs `datasets` and the network)"
    )
    hub_splits = {"train": "train", "test": "test"}
    file_names = {"train": ("train",), "test": ("test", "validation", "val")}
    spec = TLDR_SPEC
    templates = (
        "Write a concise summary of this post.\n\n{text}\n\n"
        "Instructions: one sentence or a few, brief and factual.\nSummary:",
        "Write a detailed summary of this post.\n\n{text}\n\n"
        "Instructions: cover more details in varied words, and use transition words "
        "(however, therefore, for example) so it reads smoothly.\nDetailed summary:",
    )
    chat_roles = (
        "You are agent 1 in a team of two summarizing a post. You write a concise summary; "
        "your teammate writes a longer, detailed one.",
        "You are agent 2 in a team of two summarizing a post. You write a detailed summary; "
        "your teammate writes a short, concise one.",
    )
    chat_requests = (
        "Post:\n{text}\n\nSummarize this post in one sentence or a few: brief and factual. "
        "Write only the summary.",
        "Post:\n{text}\n\nWrite a detailed summary of this post: cover more details in "
        "varied words, and use transition words (however, therefore, for example) so it "
        "reads smoothly. Write only the summary.",
    )


class ArxivTask(WritingTask):
    """arXiv abstract expansion (``arxiv``): agent 1 background, agent 2 method.

    Prompts (our wording): both show the abstract and ask for part of an introduction;
    agent 1 covers background and motivation, agent 2 the method and its implications, each
    told the other covers the rest and not to repeat it. Reward:
    :data:`~comlrl.envs.writing.rewards.ARXIV_SPEC` levels (each part 128-256 words; part 2
    1.3-1.6x part 1's length; similar vocabulary size; transitions in either part and
    shared content words up to a Jaccard of 0.23), in ``[0, 1]``.

    Splits: ``OpenMLRL/arXiv_abstract``'s ``train``, and its ``val`` as our ``test``. A
    local directory holds ``train.jsonl`` and ``test.jsonl`` (or ``val``/``validation``);
    a single file is split by its rows' ``split`` field, else by index (last fifth
    ``test``). Rows need ``abstract_text``.
    """

    name = "arxiv"
    field = "abstract_text"
    hub_dataset = "OpenMLRL/arXiv_abstract"
    #: Where the examples come from (``comlrl tasks`` prints it).
    data_source = (
        "no copy ships: task.kwargs.path=<.jsonl/.json or folder>, else the Hub's "
        "OpenMLRL/arXiv_abstract (needs `datasets` and the network)"
    )
    hub_splits = {"train": "train", "test": "val"}
    file_names = {"train": ("train",), "test": ("test", "val", "validation")}
    spec = ARXIV_SPEC
    templates = (
        "Expand this scientific abstract into the first half of an introduction.\n\n"
        "Abstract:\n{text}\n\nYour part: the background and the motivation. A teammate "
        "writes the method and its implications; do not cover those.\nIntroduction:",
        "Expand this scientific abstract into the second half of an introduction.\n\n"
        "Abstract:\n{text}\n\nYour part: the method and its implications. A teammate "
        "writes the background and motivation; do not cover those.\nIntroduction "
        "(continued):",
    )
    chat_roles = (
        "You are agent 1 in a team of two writing the introduction of a paper from its "
        "abstract. You write the background and the motivation; your teammate writes the "
        "method and its implications.",
        "You are agent 2 in a team of two writing the introduction of a paper from its "
        "abstract. You write the method and its implications; your teammate writes the "
        "background and the motivation.",
    )
    chat_requests = (
        "Abstract:\n{text}\n\nWrite the first half of the introduction: the background "
        "and the motivation, in about 150 words. Do not describe the method. Write "
        "only the text.",
        "Abstract:\n{text}\n\nWrite the second half of the introduction: the method and "
        "its implications, in about 200 words. Do not repeat the background. Write "
        "only the text.",
    )
