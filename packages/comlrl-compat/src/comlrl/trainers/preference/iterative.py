"""CoMLRL 1.4.3's ``MADPOIterConfig/Trainer``, ``MARLHFIterConfig/Trainer`` (module path
``comlrl.trainers.preference.iterative``) and module attribute ``wandb`` (None without it)."""

from __future__ import annotations

import os  # noqa: F401  (1.4.3's module attribute: its tests patch ``iterative.os.makedirs``)
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comlrl.trainers._base import (
    CompatTrainer,
)
from comlrl.trainers.preference._iter_checkpoints import (
    MADPOIterCheckpoints,
    MARLHFIterCheckpoints,
)
from comlrl.trainers.preference._iter_fields import _IterativeFields
from comlrl.trainers.preference._iter_hooks143 import IterativeHooks143
from comlrl.trainers.preference.madpo import MADPOConfig, MADPOTrainer
from comlrl.trainers.preference.marlhf import MARLHFConfig, MARLHFTrainer

__all__ = ["MADPOIterConfig", "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer"]


def __getattr__(name: str) -> Any:
    from comlrl.trainers._wandb import optional_wandb

    return optional_wandb(name, __name__)


# --- iterative preference refresh (CoMLRL 1.4.3's MADPOIter / MARLHFIter) -------------
@dataclass
class MADPOIterConfig(_IterativeFields, MADPOConfig):
    """CoMLRL 1.4.3's ``MADPOIterConfig``: :class:`MADPOConfig`'s fields (with 1.4.3's
    iterative defaults: ``num_train_epochs=1`` pass over each round's training pairs,
    ``preference_num_candidates=20``, ``preference_pairs_per_sample=4``,
    ``pair_selection="comparator_reward"``) plus :class:`_IterativeFields`.

    ``pair_selection`` orders a prompt's current-vs-comparator pairs:
    ``comparator_reward`` (highest comparator reward first), ``reward_gap``, ``random``
    or ``all`` (see :func:`comlrl.trainers._iterative.select_comparison_pairs`).

    Raises:
        ValueError: as :class:`MADPOConfig`, or a bad iterative field (named; see
            :func:`comlrl.trainers._iterative.validate_iterative_fields`).
    """

    num_train_epochs: int = 1
    preference_num_candidates: int = 20
    preference_pairs_per_sample: int | None = 4
    pair_selection: str = "comparator_reward"

    def __post_init__(self) -> None:
        from comlrl.trainers._iterative import validate_iterative_fields

        super().__post_init__()
        validate_iterative_fields(self)

    def _pair_selections(self) -> tuple[str, ...]:
        from comlrl.trainers._iterative import PAIR_SELECTIONS

        return PAIR_SELECTIONS


@dataclass
class MARLHFIterConfig(_IterativeFields, MARLHFConfig):
    """CoMLRL 1.4.3's ``MARLHFIterConfig``: :class:`MARLHFConfig`'s fields (1.4.3's
    iterative defaults: ``num_train_epochs=2`` RL passes over the prompts per round,
    ``preference_num_candidates=20``, ``preference_pairs_per_sample=4``,
    ``pair_selection="comparator_reward"``, ``reward_num_train_epochs=2``) plus
    :class:`_IterativeFields` and ``preference_scoring_reward``: ``task`` (pairs ordered
    by the task reward) or ``reward_model`` (by the previous round's reward model; round
    0, which has none, uses the task reward, as 1.4.3 does).

    Raises:
        ValueError: as :class:`MARLHFConfig` and :class:`MADPOIterConfig`, or an unknown
            ``preference_scoring_reward``.
    """

    num_train_epochs: int = 2
    preference_num_candidates: int = 20
    preference_pairs_per_sample: int | None = 4
    pair_selection: str = "comparator_reward"
    reward_num_train_epochs: int = 2
    preference_scoring_reward: str = "task"

    def __post_init__(self) -> None:
        from comlrl.trainers._iterative import (
            SCORING_REWARDS,
            _canonical,
            validate_iterative_fields,
        )

        super().__post_init__()
        validate_iterative_fields(self)
        self.preference_scoring_reward = _canonical(
            SCORING_REWARDS, "preference_scoring_reward", self.preference_scoring_reward, "task"
        )

    def _pair_selections(self) -> tuple[str, ...]:
        from comlrl.trainers._iterative import PAIR_SELECTIONS

        return PAIR_SELECTIONS


class _IterativeRounds:
    """1.4.3's round schedule shared by :class:`MADPOIterTrainer` and
    :class:`MARLHFIterTrainer`: every training prompt each round, mapped onto
    :class:`comlrl.algos.recipes.preference.iterative.rounds.IterativeRounds` (with a commit per round:
    :mod:`comlrl.trainers.preference._iter_checkpoints`); a subclass gives
    :meth:`_policy_agents`, :meth:`_scoring_env`, :meth:`_train_round` and :meth:`_log`.

    Attributes:
        rounds: the :class:`~comlrl.algos.recipes.preference.iterative.rounds.IterativeRounds`
            (comparator, replay; its ``history`` is :attr:`round_history`).
    """

    args: Any
    env_step: int
    reward_func: Any
    _train_rows: list[dict[str, Any]]

    def _setup_rounds(self, agents: Sequence[Any], seed: int) -> None:
        from comlrl.trainers._base import _model_kwargs
        from comlrl.trainers._iterative import rounds_from_args
        from comlrl.trainers.preference._reward_distribution import distribution_log

        model_config = dict(getattr(self, "model_config", {}) or {})
        charts = distribution_log(self.args, self.reward_func, getattr(self, "wandb_config", None))
        self.rounds = rounds_from_args(self.args, agents, _model_kwargs(model_config), seed, charts)

    @property
    def round_history(self) -> list[dict[str, float]]:
        """One row per round (pair counts, mean current/comparator reward)."""
        return self.rounds.history

    def _policy_agents(self) -> list[Any]:
        raise NotImplementedError

    def _scoring_env(self, round_index: int) -> Any:
        raise NotImplementedError

    def _train_round(self, pairs: list[Any], round_index: int) -> list[dict[str, float]]:
        raise NotImplementedError

    def _log(self, row: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _save_policy(self, label: str) -> None:
        from comlrl.algos.training.saving import save_agent_checkpoint

        root = Path(self.args.policy_checkpoint_dir) / label
        for i, agent in enumerate(self._policy_agents()):
            save_agent_checkpoint(agent, root / f"agent_{i}")


class MADPOIterTrainer(MADPOIterCheckpoints, IterativeHooks143, _IterativeRounds, MADPOTrainer):
    """CoMLRL 1.4.3's ``MADPOIterTrainer``: ``num_iterations`` rounds of fresh preference
    pairs against a comparator policy (:mod:`comlrl.trainers._iterative`), each followed
    by ``num_train_epochs`` shuffled passes of joint DPO steps (Rafailov et al. 2023, eq. 7,
    joint log-ratio summed over agents; :func:`comlrl.algos.recipes.preference.madpo.recipe.madpo_update`)
    on the round's training pairs, ``train_batch_size`` pairs per step: reference-free
    (``log pi_ref = 0``, as 1.4.3's), or against the frozen initial policy with
    ``reference_kl_enabled`` (see :class:`MADPOTrainer`).

    Args: as :class:`MADPOTrainer` with ``args`` a :class:`MADPOIterConfig`.

    Raises:
        UnsupportedFieldError: a setting this package does not implement (named), before
            any model loads.
        ValueError, TypeError: as :class:`MADPOTrainer`.
    """

    config_cls: type = MADPOIterConfig
    algorithm_name = "MADPOIter"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cfg = kwargs.get("args")
        if cfg is not None and not isinstance(cfg, MADPOIterConfig):
            raise TypeError(
                f"MADPOIterTrainer takes args=MADPOIterConfig(...), got {type(cfg).__name__}."
            )
        super().__init__(*args, **kwargs)
        self._setup_rounds(self._run.agents, int(self._run.config.seed))

    def _check_args(self, cfg: MADPOConfig) -> None:
        from comlrl.trainers._iterative import check_iterative_supported

        check_iterative_supported(cfg)

    def _policy_agents(self) -> list[Any]:
        return list(self._run.agents)

    def _scoring_env(self, round_index: int) -> Any:
        return self._run.env

    def _log(self, row: Mapping[str, Any]) -> None:
        self._wandb_log(row)

    def _train_round(self, pairs: list[Any], round_index: int) -> list[dict[str, float]]:
        from comlrl.algos.recipes.preference.madpo.recipe import madpo_update
        from comlrl.trainers._iterative import joint_pairs

        a = self.args
        pad = [int(t.pad_token_id) for t in self.tokenizers]
        history = []
        eval_every = int(a.eval_interval) if self._eval_rows and a.eval_num_samples > 0 else 0
        batches = self.rounds.pair_batches(pairs, int(a.num_train_epochs), int(a.train_batch_size))
        for part in batches:
            if eval_every > 0 and self._run.step % eval_every == 0:
                self.evaluate()
            row: dict[str, float] = {"iteration": float(round_index + 1), "num_pairs": len(part)}
            row.update(madpo_update(self._run, joint_pairs(part, pad)))
            self._run.step += 1
            row["step"] = float(self._run.step)
            self.env_step += (
                int(a.environment_steps_per_pair) * len(part) if a.use_environment_step else 1
            )
            history.append(row)
            self._wandb_log(row)
        return history

    def train(  # type: ignore[override]
        self,
        resume_from_checkpoint: str | Path | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **kwargs: Any,
    ) -> list[dict[str, float]]:
        """Run the ``num_iterations`` rounds; 1.4.3's checkpoint arguments commit a cursor
        after every round (:mod:`comlrl.trainers.preference._iter_checkpoints`).

        Returns:
            One row per DPO step (``iteration``, ``step``, ``num_pairs``, ``loss``,
            ``margin``, ``accuracy``, per-agent terms); the per-round rows (pair counts,
            mean current/comparator reward) are in :attr:`round_history`.

        Raises:
            UnsupportedFieldError: other keyword arguments.
            ValueError, FileExistsError: as :meth:`MADPOTrainer.train`.
        """
        from comlrl.trainers.preference._checkpoints import start_train

        if kwargs:
            return CompatTrainer.train(self, **kwargs)  # raises, naming the arguments
        start_train(
            self, resume_from_checkpoint, checkpoint_dir, checkpoint_interval,
            checkpoint_total_limit,
        )  # fmt: skip
        return self._run_rounds()


class MARLHFIterTrainer(MARLHFIterCheckpoints, _IterativeRounds, MARLHFTrainer):
    """CoMLRL 1.4.3's ``MARLHFIterTrainer``: ``num_iterations`` rounds; each collects
    pairs against a comparator policy (:mod:`comlrl.trainers._iterative`), refits the
    joint reward model from its initial weights on the round's training pairs
    (Bradley-Terry, ``reward_num_train_epochs`` passes) and then runs the RL stage
    (``rl_algorithm``, as :class:`MARLHFTrainer`) for ``num_train_epochs`` passes over
    the prompts on that model's scores. Evaluation keeps the task reward.

    Args: as :class:`MARLHFTrainer` with ``args`` a :class:`MARLHFIterConfig`.

    Raises:
        UnsupportedFieldError: a setting this package does not implement (named), before
            any model loads.
        ValueError, TypeError: as :class:`MARLHFTrainer`.
    """

    config_cls: type = MARLHFIterConfig
    algorithm_name = "MARLHFIter"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cfg = kwargs.get("args")
        if cfg is None:
            kwargs["args"] = MARLHFIterConfig()
        elif not isinstance(cfg, MARLHFIterConfig):
            raise TypeError(
                f"MARLHFIterTrainer takes args=MARLHFIterConfig(...), got {type(cfg).__name__}."
            )
        super().__init__(*args, **kwargs)
        # centralized: no reward model until training starts (1.4.3's _init_reward_model)
        self._reward_init: dict[str, Any] = (
            self._initial_reward_weights() if self.reward_model is not None else {}
        )
        self._task_reward = self.rl_trainer.eval_reward
        self._reward_trained = False
        seed = int(self._preference.config.seed) if self._preference is not None else 0
        self._setup_rounds(self.rl_trainer._run.agents, seed)

    def _initial_reward_weights(self) -> dict[str, Any]:
        from comlrl.algos.training.checkpoint import cpu_state_dict

        return cpu_state_dict(self.reward_model)

    def _fresh_reward_model(self) -> None:
        """Centralized: a new reward model for this round through 1.4.3's
        ``_init_reward_model`` hook (as 1.4.3 builds one per iteration), and the preference
        stage over it; decentralized rounds restore the initial weights instead."""
        self._init_reward_model()
        self._preference = self._build_preference_stage(self.reward_model, self.reward_tokenizer)
        self._reward_init = self._initial_reward_weights()

    def _policy_agents(self) -> list[Any]:
        return list(self.rl_trainer._run.agents)

    def _scoring_env(self, round_index: int) -> Any:
        env = self.rl_trainer.env
        learned = self.args.preference_scoring_reward == "reward_model" and self._reward_trained
        env.reward = self._preference.reward_function() if learned else self._task_reward
        return env

    def _log(self, row: Mapping[str, Any]) -> None:
        self.rl_trainer._wandb_log(row)

    def _train_round(self, pairs: list[Any], round_index: int) -> list[dict[str, float]]:
        from comlrl.algos.recipes.preference.iterative.recipe import fit_fresh_reward_model
        from comlrl.trainers._iterative import steps

        a, rl = self.args, self.rl_trainer
        if self.centralized_collaboration is not None:
            self._fresh_reward_model()
        rm_rows = fit_fresh_reward_model(  # a fresh reward model each round
            self.reward_model,
            self.reward_tokenizer,
            self._preference.reward_config,
            self._reward_init,
            pairs,
            [int(t.pad_token_id) for t in self.tokenizers],
            round_index,
        )
        self._reward_trained = True
        self.reward_model_history.extend(rm_rows)
        rl._wandb_log({f"reward_model/{k}": v for k, v in rm_rows[-1].items()})
        rl.env.reward = self._preference.reward_function()
        batch = int(rl.config.batch_size)
        eval_every = int(getattr(rl, "_eval_every", 0))
        history = []
        for _ in range(steps(len(self._train_rows), batch, int(a.num_train_epochs))):
            if eval_every and rl._run.step % eval_every == 0:
                rl.evaluate()
            row = rl._train_step()
            row["iteration"] = float(round_index + 1)
            rl.env_step += int(row.get("num_joint_actions", batch))  # as the RL stage counts
            history.append(row)
            rl._wandb_log(row)
        return history

    def train(  # type: ignore[override]
        self,
        resume_from_checkpoint: str | Path | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **kwargs: Any,
    ) -> list[dict[str, float]]:
        """Run the ``num_iterations`` rounds; 1.4.3's checkpoint arguments commit a cursor
        after every round (:mod:`comlrl.trainers.preference._iter_checkpoints`).

        Returns:
            The RL stage's per-step rows (with ``iteration``); the reward model's rows are
            in :attr:`reward_model_history`, the per-round rows in :attr:`round_history`.

        Raises:
            UnsupportedFieldError: other keyword arguments.
            ValueError, FileExistsError: as :meth:`MARLHFTrainer.train`.
        """
        from comlrl.trainers.preference._checkpoints import start_train

        if kwargs:
            return CompatTrainer.train(self, **kwargs)  # raises, naming the arguments
        self._ensure_rl_stage()  # centralized IAC/MAAC: built now, before a resume restores it
        start_train(
            self, resume_from_checkpoint, checkpoint_dir, checkpoint_interval,
            checkpoint_total_limit,
        )  # fmt: skip
        try:
            return self._run_rounds()
        finally:
            self.rl_trainer.env.reward = self._task_reward
