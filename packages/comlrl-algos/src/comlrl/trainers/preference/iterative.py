"""CoMLRL 1.4.3's iterative preference trainers ``MADPOIterConfig/Trainer`` and
``MARLHFIterConfig/Trainer`` (module path ``comlrl.trainers.preference.iterative``)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comlrl.trainers._base import (
    CompatTrainer,
    _reject,
)
from comlrl.trainers.preference.madpo import MADPOConfig, MADPOTrainer
from comlrl.trainers.preference.marlhf import MARLHFConfig, MARLHFTrainer

__all__ = ["MADPOIterConfig", "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer"]


# --- iterative preference refresh (CoMLRL 1.4.3's MADPOIter / MARLHFIter) -------------
@dataclass
class _IterativeFields:
    """The iterative fields of CoMLRL 1.4.3's ``MADPOIterConfig`` / ``MARLHFIterConfig``,
    with its defaults (what a round does: :mod:`comlrl.trainers._iterative`).

    Implemented: ``num_iterations``; ``preference_replay_mode`` (``current`` |
    ``nearest_k`` | ``all_history`` | ``lambda_decay``) with ``preference_replay_k``,
    ``preference_replay_lambda``, ``preference_replay_sample_size``;
    ``policy_checkpoint_dir`` (the policy before round 0 and after each round, as
    ``initial/agent_<i>`` and ``iteration_XXXX/agent_<i>``); ``comparator_policy``
    (``current`` | ``current_copy`` | ``model`` | ``history``), ``comparator_model_name``,
    ``comparator_agents``, ``comparator_num_candidates``, ``comparator_history_k``;
    ``comparator_generation_mode="decentralized"``. The ``comparator_api_*`` fields are
    read only by ``comparator_policy="api"``, which raises
    :class:`UnsupportedFieldError`, as do ``comparator_generation_mode="centralized"``,
    ``comparator_devices``, ``preference_replay_dir`` and ``log_reward_distribution=True``.
    """

    num_iterations: int = 6
    preference_replay_mode: str = "current"
    preference_replay_k: int | None = None
    preference_replay_lambda: float | None = None
    preference_replay_sample_size: int | None = None
    preference_replay_dir: str | None = None
    log_reward_distribution: bool = False
    policy_checkpoint_dir: str | None = None
    comparator_policy: str = "current"
    comparator_generation_mode: str = "decentralized"
    comparator_centralized_agent_index: int = 0
    comparator_model_name: str | None = None
    comparator_agents: Sequence[Any] | None = None
    comparator_devices: str | Sequence[str] | None = None
    comparator_num_candidates: int | None = None
    comparator_history_k: int | None = None
    comparator_api_url: str | None = None
    comparator_api_format: str = "generic"
    comparator_api_model: str | None = None
    comparator_api_max_n_per_request: int | None = None
    comparator_api_timeout: float = 120.0
    comparator_api_headers: dict[str, str] | None = None
    comparator_api_key: str | None = None
    comparator_api_key_env: str | None = None
    comparator_api_key_header: str = "Authorization"
    comparator_api_key_prefix: str = "Bearer"
    comparator_api_response_field: str = "completions"
    comparator_api_extra_body: dict[str, Any] | None = None


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
    """The round loop shared by :class:`MADPOIterTrainer` and :class:`MARLHFIterTrainer`
    (see :mod:`comlrl.trainers._iterative`); a subclass gives :meth:`_policy_agents`,
    :meth:`_scoring_env` and :meth:`_train_round`."""

    args: Any
    env_step: int
    round_history: list[dict[str, float]]
    _train_rows: list[dict[str, Any]]

    def _setup_rounds(self, agents: Sequence[Any], seed: int) -> None:
        import random

        from comlrl.trainers._base import _model_kwargs
        from comlrl.trainers._iterative import Comparator, PreferenceReplay

        a = self.args
        self._comparator = Comparator(a, agents, _model_kwargs(self._model_config()), seed + 7919)
        self._replay = PreferenceReplay(
            a.preference_replay_mode,
            a.preference_replay_k,
            a.preference_replay_lambda,
            a.preference_replay_sample_size,
            random.Random(seed + 1),
        )
        self._pair_rng = random.Random(seed + 2)
        self._order_rng = random.Random(seed + 3)
        self.round_history = []

    def _model_config(self) -> dict[str, Any]:
        return dict(getattr(self, "model_config", {}) or {})

    def _policy_agents(self) -> list[Any]:
        raise NotImplementedError

    def _scoring_env(self, round_index: int) -> Any:
        raise NotImplementedError

    def _train_round(self, pairs: list[Any], round_index: int) -> list[dict[str, float]]:
        raise NotImplementedError

    def _rows(self) -> list[dict[str, Any]]:
        return list(self._train_rows)

    def _collect_round(self, round_index: int) -> tuple[list[Any], dict[str, float]]:
        from comlrl.algos.rollout.tree import TreeSettings, rollout
        from comlrl.core import SamplingParams
        from comlrl.trainers._iterative import round_pairs

        a = self.args
        k = int(a.preference_num_candidates)
        params = [
            SamplingParams(
                num_generations=n,
                max_new_tokens=int(a.max_new_tokens),
                temperature=float(a.temperature),
                top_p=float(a.top_p),
                top_k=int(a.top_k or 0),
            )
            for n in (k, int(a.comparator_num_candidates or k))
        ]
        tree = TreeSettings(num_turns=1, joint_mode="align")
        agents = self._policy_agents()
        comparator = self._comparator.agents_for(round_index)
        env = self._scoring_env(round_index)
        rows, batch = self._rows(), int(a.train_batch_size or a.rollout_buffer_size)
        pairs: list[Any] = []
        sums = {"current_reward_mean": 0.0, "comparator_reward_mean": 0.0}
        for start in range(0, len(rows), batch):
            chunk = rows[start : start + batch]
            ro_cur = rollout(agents, chunk, env, params[0], tree)
            ro_cmp = rollout(comparator, chunk, env, params[1], tree)
            found, stats = round_pairs(
                ro_cur,
                ro_cmp,
                round_index=round_index,
                mode=a.pair_selection,
                limit=a.preference_pairs_per_sample,
                rng=self._pair_rng,
            )
            pairs.extend(found)
            for key in sums:
                sums[key] += stats[key] * len(chunk)
        return pairs, {key: v / len(rows) for key, v in sums.items()}

    def _save_policy(self, label: str) -> None:
        if self.args.policy_checkpoint_dir:
            from comlrl.algos.training.steps import save_agent_checkpoint

            root = Path(self.args.policy_checkpoint_dir) / label
            for i, agent in enumerate(self._policy_agents()):
                save_agent_checkpoint(agent, root / f"agent_{i}")

    def _log(self, row: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _run_rounds(self) -> list[dict[str, float]]:
        """``num_iterations`` rounds: pairs against the comparator, replay, training."""
        from tqdm.auto import tqdm

        history: list[dict[str, float]] = []
        self._comparator.start()
        self._save_policy("initial")
        total = 0
        for r in tqdm(range(int(self.args.num_iterations)), desc=type(self).__name__, disable=True):
            pairs, stats = self._collect_round(r)
            train_pairs = self._replay.add_and_select(pairs)
            total += len(pairs)
            row = {
                "iter/current_iteration": float(r + 1),
                "iter/current_preference_pairs": float(len(pairs)),
                "iter/total_preference_pairs": float(total),
                "iter/train_preference_pairs": float(len(train_pairs)),
                **{f"iter/{k}": v for k, v in stats.items()},
            }
            self.round_history.append(row)
            self._log(row)
            if train_pairs:
                history.extend(self._train_round(train_pairs, r))
            self._comparator.finish_round(r)
            self._save_policy(f"iteration_{r:04d}")
        if total == 0:
            warnings.warn(
                f"{type(self).__name__}: every current/comparator joint action tied under the "
                "reward in every round; no pairs, no training (raise preference_num_candidates "
                "or the temperature).",
                stacklevel=3,
            )
        return history

    def _pair_batches(self, pairs: list[Any], epochs: int, batch: int) -> list[list[Any]]:
        out: list[list[Any]] = []
        for _ in range(epochs):
            order = list(pairs)
            self._order_rng.shuffle(order)
            out.extend(order[i : i + batch] for i in range(0, len(order), batch))
        return out


class MADPOIterTrainer(_IterativeRounds, MADPOTrainer):
    """CoMLRL 1.4.3's ``MADPOIterTrainer``: ``num_iterations`` rounds of fresh preference
    pairs against a comparator policy (:mod:`comlrl.trainers._iterative`), each followed
    by ``num_train_epochs`` shuffled passes of joint DPO steps (Rafailov et al. 2023, eq. 7,
    joint log-ratio summed over agents; :func:`comlrl.algos.recipes.preference.recipe.madpo_update`)
    on the round's training pairs, ``train_batch_size`` pairs per step, against the
    frozen initial policy as reference.

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
        for field, ok, what in (
            ("collaboration_mode", cfg.collaboration_mode == "decentralized",
             "only decentralized MADPOIter is implemented; set collaboration_mode='decentralized'."),
            ("reference_kl_enabled", not cfg.reference_kl_enabled,
             "DPO already regularises towards the reference; set reference_kl_enabled=False."),
        ):  # fmt: skip
            _reject(cfg, field, ok, what)

    def _policy_agents(self) -> list[Any]:
        return list(self._run.agents)

    def _scoring_env(self, round_index: int) -> Any:
        return self._run.env

    def _log(self, row: Mapping[str, Any]) -> None:
        self._wandb_log(row)

    def _train_round(self, pairs: list[Any], round_index: int) -> list[dict[str, float]]:
        from comlrl.algos.recipes.preference.recipe import madpo_update
        from comlrl.trainers._iterative import joint_pairs

        a = self.args
        pad = [int(t.pad_token_id) for t in self.tokenizers]
        history = []
        eval_every = int(a.eval_interval) if self._eval_rows and a.eval_num_samples > 0 else 0
        batches = self._pair_batches(pairs, int(a.num_train_epochs), int(a.train_batch_size))
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

    def train(self, **kwargs: Any) -> list[dict[str, float]]:
        """Run the ``num_iterations`` rounds.

        Returns:
            One row per DPO step (``iteration``, ``step``, ``num_pairs``, ``loss``,
            ``margin``, ``accuracy``, per-agent terms); the per-round rows (pair counts,
            mean current/comparator reward) are in :attr:`round_history`.

        Raises:
            UnsupportedFieldError: CoMLRL's checkpoint arguments (see
                :meth:`CompatTrainer.train`).
        """
        if kwargs:
            return super().train(**kwargs)  # raises, naming the arguments
        return self._run_rounds()


class MARLHFIterTrainer(_IterativeRounds, MARLHFTrainer):
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
        self._reward_init = {
            k: v.detach().to("cpu", copy=True) for k, v in self.reward_model.state_dict().items()
        }
        self._task_reward = self.rl_trainer.eval_reward
        self._reward_trained = False
        self._setup_rounds(self.rl_trainer._run.agents, int(self._preference.config.seed))

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
        from comlrl.algos.recipes.preference.recipe import train_reward_model
        from comlrl.trainers._iterative import joint_pairs, steps

        a, rl = self.args, self.rl_trainer
        self.reward_model.load_state_dict(self._reward_init)  # a fresh reward model each round
        pad = [int(t.pad_token_id) for t in self.tokenizers]
        rm_rows = train_reward_model(
            self.reward_model,
            self.reward_tokenizer,
            [joint_pairs(pairs, pad)],
            self._preference.reward_config,
        )
        self._reward_trained = True
        for row in rm_rows:
            row["iteration"] = float(round_index + 1)
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
            rl.env_step += batch
            history.append(row)
            rl._wandb_log(row)
        return history

    def train(self, **kwargs: Any) -> list[dict[str, float]]:
        """Run the ``num_iterations`` rounds.

        Returns:
            The RL stage's per-step rows (with ``iteration``); the reward model's rows are
            in :attr:`reward_model_history`, the per-round rows in :attr:`round_history`.

        Raises:
            UnsupportedFieldError: CoMLRL's checkpoint arguments.
        """
        if kwargs:
            return CompatTrainer.train(self, **kwargs)  # raises, naming the arguments
        try:
            return self._run_rounds()
        finally:
            self.rl_trainer.env.reward = self._task_reward
