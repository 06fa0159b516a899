"""MARLHF's joint reward model: an LM backbone and a linear head on the last token of
the joint response (:class:`JointRewardModel`), trained with the Bradley-Terry loss on
preference pairs (:func:`train_reward_model`), then used as the reward function of any RL
recipe (:class:`RewardModelReward`). ``H``: hidden size."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.recipes.preference.encoding import clipped_optimizer_step
from comlrl.algos.recipes.preference.marlhf.config import RewardModelConfig
from comlrl.algos.recipes.preference.pairs import JointPreferencePairs
from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.update.agents import build_optimizer
from comlrl.core import RewardBatch
from comlrl.estimators.preference_losses import (
    bradley_terry_loss,
)
from torch import nn

__all__ = [
    "format_joint_text",
    "JointRewardModel",
    "evaluate_reward_model",
    "train_reward_model",
    "RewardModelReward",
    "REWARD_MODEL_DIR",
    "save_reward_model",
    "load_reward_model",
]


def format_joint_text(prompts: Sequence[str], completions: Sequence[str]) -> str:
    """The joint response the reward model reads: each agent's prompt and completion, in
    agent order, under ``[agent i]`` headers."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    return "\n".join(
        f"[agent {i + 1} prompt] {p}\n[agent {i + 1} response] {c}"
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    )


class JointRewardModel(nn.Module):
    """A scalar reward of a joint response: an LM backbone plus a linear head reading the
    hidden state of the last real token. The head starts at zero (every score 0, so the
    Bradley-Terry loss starts at ln 2).

    Args:
        backbone: a ``transformers`` causal LM or base model; its decoder (``base_model``)
            gives ``last_hidden_state [B, S, H]`` (the LM head is not run).
        freeze_backbone: train the head only.

    Raises:
        ValueError: the backbone's config has no ``hidden_size``.
    """

    def __init__(self, backbone: Any, *, freeze_backbone: bool = False) -> None:
        super().__init__()
        hidden = getattr(getattr(backbone, "config", None), "hidden_size", None)
        if hidden is None:
            raise ValueError(
                f"cannot read hidden_size from {type(backbone).__name__}.config; pass a transformers model"
            )
        self.backbone = getattr(backbone, "base_model", backbone)
        self.head = nn.Linear(int(hidden), 1)
        # A zero head scores every text 0: the Bradley-Terry loss starts at exactly ln 2
        # (chance) instead of at a random preference (a held-out loss of 0.91-0.97 with
        # std 1/sqrt(H) on stories260k); the first step's gradient reaches the head only.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        param = next(self.backbone.parameters())
        self.head.to(device=param.device, dtype=torch.float32)
        if freeze_backbone:
            self.backbone.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Scores ``[B]`` float32 of ``input_ids [B, S]`` (left or right padded;
        ``attention_mask [B, S]`` 1 on real tokens, at least one per row)."""
        hidden = self._hidden(input_ids, attention_mask)  # [B, S, H]
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        last = (positions * attention_mask).argmax(dim=-1)  # index of the last real token
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        return self.head(pooled.float()).squeeze(-1)

    def _hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The decoder's last hidden states ``[B, S, H]`` (positions count real tokens
        only, so left padding does not shift them)."""
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        return self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).last_hidden_state


def _encode_texts(
    tokenizer: Any, texts: Sequence[str], max_length: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = [list(x)[-max_length:] for x in tokenizer(list(texts))["input_ids"]]
    width = max(len(x) for x in ids)
    out = torch.full((len(ids), width), int(pad), dtype=torch.int64)
    mask = torch.zeros((len(ids), width), dtype=torch.int64)
    for i, x in enumerate(ids):
        out[i, : len(x)] = torch.tensor(x, dtype=torch.int64)
        mask[i, : len(x)] = 1
    return out.to(device), mask.to(device)


def _pair_texts(pairs: Sequence[JointPreferencePairs]) -> list[tuple[str, str]]:
    return [
        (format_joint_text(pr, c), format_joint_text(pr, r))
        for ps in pairs
        for pr, c, r in zip(ps.prompts, ps.chosen, ps.rejected, strict=True)
    ]


def _bt_batch(
    model: JointRewardModel, tokenizer: Any, texts: Sequence[tuple[str, str]], max_length: int
) -> tuple[torch.Tensor, dict[str, float]]:
    flat = [t for pair in texts for t in pair]
    ids, mask = _encode_texts(tokenizer, flat, max_length, next(model.parameters()).device)
    scores = model(ids, mask)
    return bradley_terry_loss(scores[0::2], scores[1::2])


@torch.no_grad()
def evaluate_reward_model(
    model: JointRewardModel,
    tokenizer: Any,
    pairs: Sequence[JointPreferencePairs],
    config: RewardModelConfig,
) -> dict[str, float]:
    """Held-out Bradley-Terry ``eval/loss``, ``eval/accuracy`` (chosen scored higher) and
    ``eval/score_gap`` over ``pairs``, pair-weighted."""
    texts = _pair_texts(pairs)
    if not texts:
        raise ConfigError("no held-out pairs to evaluate the reward model on")
    was_training = model.training
    model.eval()
    sums = {"eval/loss": 0.0, "eval/accuracy": 0.0, "eval/score_gap": 0.0}
    try:
        for i in range(0, len(texts), config.batch_size):
            part = texts[i : i + config.batch_size]
            loss, m = _bt_batch(model, tokenizer, part, config.max_length)
            for key, value in (
                ("loss", float(loss)),
                ("accuracy", m["accuracy"]),
                ("score_gap", m["score_gap"]),
            ):
                sums[f"eval/{key}"] += value * len(part)
    finally:
        model.train(was_training)
    return {k: v / len(texts) for k, v in sums.items()}


def train_reward_model(
    model: JointRewardModel,
    tokenizer: Any,
    pairs: Sequence[JointPreferencePairs],
    config: RewardModelConfig,
    eval_pairs: Sequence[JointPreferencePairs] | None = None,
) -> list[dict[str, float]]:
    """Fit MARLHF's joint reward model with the Bradley-Terry loss
    (:func:`~comlrl.estimators.preference_losses.bradley_terry_loss`) on the joint texts
    (:func:`format_joint_text`) of ``pairs``: ``num_epochs`` seeded shuffled passes in
    batches of ``batch_size`` pairs.

    Returns:
        One row per optimizer step (``epoch``, ``loss``, ``accuracy``, ``score_gap``,
        ``grad_norm``); with ``eval_pairs``, :func:`evaluate_reward_model` before training
        (``*_start`` keys on row 1) and after each epoch.

    Raises:
        ConfigError: no training pairs.
    """
    texts = _pair_texts(pairs)
    if not texts:
        raise ConfigError(
            "no preference pairs to train the reward model on (every sampled group tied?)"
        )
    torch.manual_seed(config.seed)
    model.train()
    optimizer = build_optimizer(
        [p for p in model.parameters() if p.requires_grad],
        config.optimizer,
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
    )
    rng = random.Random(config.seed)
    start = evaluate_reward_model(model, tokenizer, eval_pairs, config) if eval_pairs else {}
    history: list[dict[str, float]] = []
    for epoch in range(1, config.num_epochs + 1):
        order = list(range(len(texts)))
        rng.shuffle(order)
        for i in range(0, len(order), config.batch_size):
            part = [texts[j] for j in order[i : i + config.batch_size]]
            optimizer.zero_grad(set_to_none=True)
            loss, m = _bt_batch(model, tokenizer, part, config.max_length)
            loss.backward()
            row: dict[str, float] = {"epoch": epoch, "loss": float(loss.detach()), **m}
            row["grad_norm"] = clipped_optimizer_step(model, optimizer, config.max_grad_norm)
            if not history:
                row.update({f"{k}_start": v for k, v in start.items()})
            history.append(row)
        if eval_pairs:
            history[-1].update(evaluate_reward_model(model, tokenizer, eval_pairs, config))
    model.eval()
    return history


class RewardModelReward:
    """A trained :class:`JointRewardModel` as a batched joint reward
    (:class:`comlrl.core.JointReward`): pass it as ``reward_func=`` to
    :class:`~comlrl.algos.MultiAgentTrainer` (or any recipe's environment).

    The agents' prompts come from ``prompts_of(example) -> A prompts`` (e.g. the task
    environment's ``root(example).prompts``, or the trainer's formatters), so the text the
    model scores is the one it was trained on (:func:`format_joint_text`).

    Args:
        model: the reward model (kept in eval mode; scored without gradients).
        tokenizer: its tokenizer.
        prompts_of: example -> the ``A`` agents' prompts.
        max_length: keep the last this many tokens.
        batch_size: joint texts per forward.
    """

    is_joint_reward = True

    def __init__(
        self,
        model: JointRewardModel,
        tokenizer: Any,
        prompts_of: Callable[[Mapping[str, Any]], Sequence[str]],
        *,
        max_length: int = 512,
        batch_size: int = 32,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.prompts_of = prompts_of
        self.max_length = max_length
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions (``completions``: ``A`` lists of ``K`` texts)."""
        texts = [
            format_joint_text(self.prompts_of(ex), [c[k] for c in completions])
            for k, ex in enumerate(examples)
        ]
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            ids, mask = _encode_texts(
                self.tokenizer, texts[i : i + self.batch_size], self.max_length, device
            )
            scores.extend(float(s) for s in self.model(ids, mask).cpu())
        return RewardBatch(scores)


#: Folder under ``output_dir/checkpoints`` with MARLHF's fitted reward model: a resumed
#: run's RL phase reads its reward from it instead of sampling pairs and fitting again.
REWARD_MODEL_DIR = "reward_model"


def save_reward_model(model: JointRewardModel, tokenizer: Any, path: Path) -> None:
    """The reward model's backbone and tokenizer (Hugging Face format) and its linear head
    (``head.safetensors``: ``weight [1, H]``, ``bias [1]``, float32), written atomically
    (a temporary sibling folder, then renamed)."""
    from comlrl.algos.training.run.saving import atomic_folder
    from safetensors.torch import save_file

    with atomic_folder(path) as tmp:
        model.backbone.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()},
            str(tmp / "head.safetensors"),
        )


def load_reward_model(model: JointRewardModel, path: Path) -> None:
    """Load what :func:`save_reward_model` wrote into ``model`` in place.

    Raises:
        CheckpointError: the folder cannot be read or does not fit the reward model.
    """
    from comlrl.algos.training.run.checkpoint import CheckpointError
    from safetensors.torch import load_file

    backbone = model.backbone
    try:
        saved = type(backbone).from_pretrained(str(path), dtype=next(backbone.parameters()).dtype)
        backbone.load_state_dict(saved.state_dict(), strict=True)
        model.head.load_state_dict(load_file(str(path / "head.safetensors")))
    except (OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"could not load the reward model {str(path)!r}: {exc}") from None
    model.eval()
