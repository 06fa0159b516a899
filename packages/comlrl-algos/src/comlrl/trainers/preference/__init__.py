"""CoMLRL 1.4.3's preference trainers (``comlrl.trainers.preference``).

:class:`MADPOTrainer` is CoMLRL 1.4.3's MADPO: before training, per training prompt,
``preference_num_candidates`` joint actions are sampled from the initial policy and scored
by the reward, and pairs are formed within the prompt (``pair_selection``,
``preference_pairs_per_sample`` kept; :mod:`comlrl.trainers._madpo_pairs`); then
``num_train_epochs`` epochs over those pairs, ``train_batch_size`` pairs per step, every
agent on its own term of the joint DPO loss (Rafailov et al. 2023, eq. 7, joint log-ratio
summed over agents) without a reference model (``log pi_ref = 0``), as 1.4.3
(:func:`comlrl.algos.recipes.preference.recipe.madpo_update`).

:class:`MARLHFTrainer` fits a joint reward model on pairs labelled by the task reward
(Bradley-Terry), then trains the agents with the MAGRPO family or IAC/MAAC on that model's
scores (:class:`comlrl.algos.MARLHFTrainer` for the pairs and the reward model, the
trainers of :mod:`comlrl.trainers.reinforce` / :mod:`comlrl.trainers.actor_critic` for
the RL stage).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comlrl.algos.recipes.preference.recipe import JointRewardModel  # ours (docs/compat.md)
from comlrl.trainers._base import (
    JOINT_MODES,
    CompatTrainer,
    UnsupportedFieldError,
    _reject,
    check_config_fields,
)
from comlrl.trainers._centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)

__all__ = [
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "JointRewardModel",
    "MADPOConfig",
    "MADPOIterConfig",
    "MADPOIterTrainer",
    "MADPOTrainer",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFTrainer",
    "TaggedCentralizedComparatorAdapter",
]


@dataclass
class MADPOConfig:
    """CoMLRL 1.4.3's ``MADPOConfig``: the same fields and defaults.

    Units as :class:`comlrl.trainers.reinforce.MAGRPOConfig`. Supported here:
    ``collaboration_mode="decentralized"``, ``pair_selection="reward_gap"``,
    ``num_turns=1``; other values raise :class:`UnsupportedFieldError` when the trainer is
    built. ``use_environment_step`` / ``environment_steps_per_pair`` only count logging
    steps in CoMLRL and are accepted. Fields shared with the MAGRPO config that MADPO does
    not use (``advantage_*``, ``discount``, ``early_termination_threshold``, ...) are
    accepted and ignored, as in CoMLRL 1.4.3.

    Raises:
        ValueError: a count below its minimum or an unknown ``pair_selection``.
    """

    num_train_epochs: int = 20
    agent_learning_rate: float = 5.0e-6
    logging_steps: int = 50
    num_agents: int = 2
    collaboration_mode: str = "decentralized"
    parallel_training: str = "none"
    agent_devices: str | Sequence[str] | None = None
    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.6
    top_k: int | None = 50
    num_turns: int = 1
    discount: float = 1.0
    joint_mode: str = "aligned"
    early_termination_threshold: float | None = None
    external_prompt_passthrough: bool = False
    eval_interval: int = 16
    eval_num_samples: int = 4
    eval_batch_size: int = 1
    rollout_buffer_size: int = 2
    train_batch_size: int | None = None
    advantage_normalization: bool = True
    advantage_mode: str = "mean"
    reference_kl_enabled: bool = False
    reference_kl_coef: float = 0.1
    reference_devices: str | Sequence[str] | None = None
    preference_num_candidates: int = 80
    preference_pairs_per_sample: int | None = 16
    pair_selection: str = "reward_gap"
    dpo_beta: float = 0.1
    use_environment_step: bool = True
    environment_steps_per_pair: int = 2

    def __post_init__(self) -> None:
        for name, low in (
            ("num_train_epochs", 1),
            ("num_agents", 1),
            ("rollout_buffer_size", 1),
            ("eval_batch_size", 1),
            ("num_turns", 1),
            ("logging_steps", 1),
            ("preference_num_candidates", 2),
            ("environment_steps_per_pair", 1),
        ):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)!r}")
        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        if self.preference_pairs_per_sample is not None and self.preference_pairs_per_sample < 1:
            raise ValueError(
                f"preference_pairs_per_sample must be >= 1 or None, got {self.preference_pairs_per_sample!r}"
            )
        if self.dpo_beta <= 0:
            raise ValueError(f"dpo_beta must be > 0, got {self.dpo_beta!r}")
        self.pair_selection = str(self.pair_selection or "reward_gap").strip().lower()
        if self.pair_selection not in self._pair_selections():
            raise ValueError(
                f"pair_selection={self.pair_selection!r}; use one of {self._pair_selections()}"
            )
        check_config_fields(self)
        self._check_turns()

    def _check_turns(self) -> None:
        if self.num_turns != 1:
            raise UnsupportedFieldError(
                f"{type(self).__name__}.num_turns={self.num_turns!r}: MADPO is single-turn "
                "(num_turns=1), as in CoMLRL 1.4.3."
            )

    def _pair_selections(self) -> tuple[str, ...]:
        return ("reward_gap", "all", "random")


#: CoMLRL 1.4.3's ``rl_algorithm`` names (and its one alias) -> the MAGRPO family's
#: ``advantage_mode``; ``iac`` / ``maac`` run the actor-critic trainers.
RL_ALGORITHMS = {"magrpo": "mean", "mareinforce": "raw", "maremax": "max", "marloo": "rloo"}
_RL_ALIASES = {"mareforce": "mareinforce"}
_ACTOR_CRITIC = ("iac", "maac")


@dataclass
class MARLHFConfig(MADPOConfig):
    """CoMLRL 1.4.3's ``MARLHFConfig``: :class:`MADPOConfig`'s fields plus the reward-model
    and RL-stage fields, with its defaults.

    ``rl_algorithm``: ``magrpo`` | ``mareinforce`` (alias ``mareforce``) | ``maremax`` |
    ``marloo`` (the MAGRPO family: sets ``advantage_mode``, as 1.4.3 does) | ``iac`` |
    ``maac``. Reward model: ``reward_model_name`` (None: the agents' model),
    ``reward_model_device`` (None: the agents' device), ``reward_learning_rate`` (per
    AdamW step), ``reward_num_train_epochs`` (passes over the pairs),
    ``reward_train_batch_size`` (pairs per step), ``reward_max_length`` (tokens of each
    joint text; None: no limit), ``reward_freeze_backbone`` (train the head only). The
    critic fields are read by ``iac`` / ``maac`` as in
    :class:`comlrl.trainers.actor_critic.IACConfig`.

    Raises:
        ValueError: as :class:`MADPOConfig`, an unknown ``rl_algorithm`` or
            ``critic_type``, ``num_generations < 2`` for the MAGRPO family, or a
            non-positive learning rate, count or coefficient.
    """

    rl_algorithm: str = "magrpo"
    num_generations: int = 4
    reward_model_name: str | None = None
    reward_model_device: str | None = "cuda:0"
    reward_learning_rate: float = 1.0e-5
    reward_num_train_epochs: int = 1
    reward_train_batch_size: int = 1
    reward_max_length: int | None = None
    reward_freeze_backbone: bool = False
    critic_model_name: str | None = None
    critic_learning_rate: float | None = None
    critic_devices: str | Sequence[str] | None = None
    use_separate_critic: bool = True
    critic_type: str = "v"
    value_loss_coef: float = 0.6
    value_clip_range: float | None = 0.2
    critic_value_head_hidden_dim: int | None = None
    value_head_hidden_dim: int | None = None

    def _check_turns(self) -> None:
        """CoMLRL 1.4.3 builds a multi-turn MARLHFConfig and refuses it at ``train()``;
        MARLHFTrainer refuses it when built (before any model loads)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        algorithm = str(self.rl_algorithm or "magrpo").strip().lower()
        algorithm = _RL_ALIASES.get(algorithm, algorithm)
        if algorithm not in RL_ALGORITHMS and algorithm not in _ACTOR_CRITIC:
            raise ValueError(
                f"rl_algorithm={self.rl_algorithm!r}; use one of "
                f"{sorted([*RL_ALGORITHMS, *_ACTOR_CRITIC])}"
            )
        self.rl_algorithm = algorithm
        if algorithm in RL_ALGORITHMS:
            if self.num_generations < 2:
                raise ValueError(
                    f"num_generations must be >= 2 for rl_algorithm={algorithm!r} (a group "
                    f"baseline needs several samples), got {self.num_generations!r}"
                )
            self.advantage_mode = RL_ALGORITHMS[algorithm]
        elif self.num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {self.num_generations!r}")
        for name in ("reward_learning_rate", "value_loss_coef"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("reward_num_train_epochs", "reward_train_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("reward_max_length", "critic_learning_rate", "value_clip_range"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or None, got {value!r}")
        if self.reward_model_device is not None:
            self.reward_model_device = str(self.reward_model_device)
        self.critic_type = str(self.critic_type or "v").strip().lower()
        if self.critic_type not in ("v", "q"):
            raise ValueError(f"critic_type={self.critic_type!r}; use 'v' or 'q'")


class MADPOTrainer(CompatTrainer):
    """CoMLRL 1.4.3's ``MADPOTrainer``: pairs built once from the initial policy, then
    reference-free MADPO steps on them (see the module docstring and :meth:`train`).

    Args:
        agent_model, agents, num_agents, tokenizer, model_config, train_dataset,
            eval_dataset, reward_func, reward_processor, formatters, wandb_config,
            eval_logger, eval_aggregator: as :class:`comlrl.trainers.reinforce.MAGRPOTrainer`.
        external_transition: must be None (single-turn only here).
        args: a :class:`MADPOConfig`.
        centralized_comparator_adapter: not supported (raises when given).

    Raises:
        UnsupportedFieldError: a config value or argument this package does not implement.
        ValueError, TypeError: missing or malformed arguments (named in the message).
    """

    single_device = True

    config_cls: type = MADPOConfig
    algorithm_name = "MADPO"

    def __init__(
        self,
        agent_model: Any = None,
        agents: Sequence[Any] | None = None,
        num_agents: int = 2,
        tokenizer: Any = None,
        model_config: dict[str, Any] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        reward_func: Callable[..., Any] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Any = None,
        external_transition: Callable[..., Sequence[str]] | None = None,
        wandb_config: dict[str, Any] | None = None,
        eval_logger: Callable[..., Any] | None = None,
        eval_aggregator: Callable[..., Any] | None = None,
        args: Any = None,
        *,
        centralized_comparator_adapter: Any = None,
    ) -> None:
        import math

        from comlrl.algos.recipes.preference import recipe as preference
        from comlrl.trainers._base import one_device

        cfg = args if args is not None else self.config_cls()
        if isinstance(cfg, MADPOConfig):
            self._check_args(cfg)
        if centralized_comparator_adapter is not None:
            raise UnsupportedFieldError(
                "centralized_comparator_adapter is not supported by comlrl.trainers (no "
                "centralized collaboration mode)."
            )
        self._init_common(
            args=cfg,
            agent_model=agent_model,
            agents=agents,
            num_agents=num_agents,
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_func=reward_func,
            reward_processor=reward_processor,
            formatters=formatters,
            external_transition=external_transition,
            wandb_config=wandb_config,
        )
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        a = self.args
        k = int(a.preference_num_candidates)
        batch = int(a.train_batch_size or a.rollout_buffer_size)
        fields = {
            "num_agents": self.num_agents,
            "num_candidates": k,
            "max_new_tokens": int(a.max_new_tokens),
            "temperature": float(a.temperature),
            "top_p": float(a.top_p),
            "top_k": int(a.top_k or 0),
            "joint_mode": JOINT_MODES[str(a.joint_mode).lower()],
            "pairs_per_prompt": int(a.preference_pairs_per_sample or k * (k - 1) // 2),
            "beta": float(a.dpo_beta),
            "learning_rate": float(a.agent_learning_rate),
            "optimizer": "adamw",
            "weight_decay": 0.01,
            "max_grad_norm": None,
            "batch_size": batch,
            "num_steps": max(1, math.ceil(int(a.num_train_epochs) * len(self._train_rows) / batch)),
            "device": one_device(a, self.num_agents, type(self).__name__),
        }
        from comlrl.algos.training.config import ConfigError
        from pydantic import ValidationError

        try:
            config = preference.MADPOConfig(**fields)
        except ValidationError as exc:
            raise ConfigError(f"MADPOConfig does not translate:\n{exc}") from None
        # reference-free, as CoMLRL 1.4.3's MADPO: no frozen copies (log pi_ref = 0)
        self._defer_run(
            lambda: preference.madpo_setup(
                self._hf_agents(),
                config,
                self.env,
                self._train_rows,
                None,
                ref_models=[None] * self.num_agents,
            )
        )
        self.preference_pairs: list[Any] = []
        self._eval_every = (
            max(1, math.ceil(int(a.eval_interval) / batch))
            if self._eval_rows is not None and a.eval_interval > 0 and a.eval_num_samples > 0
            else 0
        )

    def _build_pairs(self) -> list[Any]:
        """Every preference pair, from the current (at the start: initial) policy: one
        rollout per ``rollout_buffer_size`` training examples, in dataset order, and
        :func:`~comlrl.trainers._madpo_pairs.rollout_pairs` within each prompt."""
        import random

        from comlrl.algos.rollout.tree import TreeSettings, rollout
        from comlrl.core import SamplingParams
        from comlrl.trainers._madpo_pairs import rollout_pairs

        a, run = self.args, self._run
        params = SamplingParams(
            num_generations=int(a.preference_num_candidates),
            max_new_tokens=int(a.max_new_tokens),
            temperature=float(a.temperature),
            top_p=float(a.top_p),
            top_k=int(a.top_k or 0),
        )
        tree = TreeSettings(num_turns=1, joint_mode="align")
        rng = random.Random(int(run.config.seed) + 2)
        size = int(a.rollout_buffer_size)
        pairs: list[Any] = []
        for start in range(0, len(self._train_rows), size):
            ro = rollout(run.agents, self._train_rows[start : start + size], run.env, params, tree)
            pairs.extend(
                rollout_pairs(
                    ro, mode=a.pair_selection, limit=a.preference_pairs_per_sample, rng=rng
                )
            )
        return pairs

    def train(self, **kwargs: Any) -> list[dict[str, float]]:
        """CoMLRL 1.4.3's MADPO: build every preference pair once from the initial policy
        (:meth:`_build_pairs`, kept in :attr:`preference_pairs`), then
        ``num_train_epochs`` epochs over them, shuffled each epoch, ``train_batch_size``
        pairs per optimizer step of the reference-free MADPO loss
        (:func:`~comlrl.algos.recipes.preference.recipe.madpo_update`); evaluation every
        ``eval_interval`` steps (from step 0) with an ``eval_dataset``.

        Returns:
            One row per step: ``epoch``, ``step``, ``num_pairs``, ``loss``, ``margin``,
            ``accuracy``, ``reward_gap_mean`` and per-agent terms; ``[]`` when every
            candidate tied (no pair).

        Raises:
            UnsupportedFieldError: CoMLRL's checkpoint arguments (see
                :meth:`CompatTrainer.train`).
            ValueError: no ``train_dataset``.
        """
        import random

        from comlrl.algos.recipes.preference.recipe import madpo_update
        from comlrl.trainers._iterative import joint_pairs

        if kwargs:
            return super().train(**kwargs)  # raises, naming the arguments
        a, run = self.args, self._run
        self.preference_pairs = self._build_pairs()
        if not self.preference_pairs:
            warnings.warn(
                "MADPO: every candidate of every prompt tied; no preference pair to train on.",
                stacklevel=2,
            )
            return []
        pad = [int(t.pad_token_id) for t in self.tokenizers]
        eval_every = int(a.eval_interval) if self._eval_rows and a.eval_num_samples > 0 else 0
        order_rng = random.Random(int(run.config.seed) + 3)
        batch = int(a.train_batch_size)
        history: list[dict[str, float]] = []
        for epoch in range(int(a.num_train_epochs)):
            order = list(self.preference_pairs)
            order_rng.shuffle(order)
            for start in range(0, len(order), batch):
                part = order[start : start + batch]
                if eval_every > 0 and run.step % eval_every == 0:
                    self.evaluate()
                row: dict[str, float] = {"epoch": float(epoch + 1), "num_pairs": len(part)}
                row.update(madpo_update(run, joint_pairs(part, pad)))
                run.step += 1
                row["step"] = float(run.step)
                self.env_step += (
                    int(a.environment_steps_per_pair) * len(part) if a.use_environment_step else 1
                )
                history.append(row)
                self._wandb_log(row)
        return history

    def _check_args(self, cfg: MADPOConfig) -> None:
        """Raise :class:`UnsupportedFieldError` for settings MADPO does not implement."""
        _reject(
            cfg,
            "collaboration_mode",
            cfg.collaboration_mode == "decentralized",
            "only decentralized MADPO is implemented; set collaboration_mode='decentralized'.",
        )
        _reject(cfg, "num_turns", cfg.num_turns == 1, "MADPO is single-turn here; set num_turns=1.")
        _reject(
            cfg,
            "reference_kl_enabled",
            not cfg.reference_kl_enabled,
            "MADPO here, as CoMLRL 1.4.3's, has no reference model; set "
            "reference_kl_enabled=False.",
        )


class MARLHFTrainer(CompatTrainer):
    """CoMLRL 1.4.3's ``MARLHFTrainer``: fit a joint reward model on preference pairs
    labelled by the task reward, then train the agents with an RL algorithm whose reward is
    that model (evaluation keeps scoring with the task reward).

    :meth:`train` runs three stages on :mod:`comlrl.algos`' preference machinery
    (:class:`comlrl.algos.MARLHFTrainer`):

    1. **Pairs.** One pass over ``train_dataset`` (``ceil(N / train_batch_size)`` batches):
       each agent samples ``preference_num_candidates`` completions per prompt, the
       ``k``-th completions form joint action ``k`` (``joint_mode="aligned"``), the task
       ``reward_func`` (through ``reward_processor``) scores them and the
       ``preference_pairs_per_sample`` pairs with the largest positive reward gap are kept
       per prompt (None: every untied pair).
    2. **Reward model.** :class:`~comlrl.algos.JointRewardModel` (``reward_model_name``, or
       the agents' model, plus a linear head on the last token's hidden state) is fitted
       with the Bradley-Terry loss ``-log sigmoid(r(chosen) - r(rejected))`` (Bradley &
       Terry 1952; Ouyang et al. 2022, eq. 1) over the joint texts (every agent's prompt
       and completion): ``reward_num_train_epochs`` shuffled passes, batches of
       ``reward_train_batch_size`` pairs, AdamW at ``reward_learning_rate``.
    3. **RL.** ``rl_algorithm``: ``magrpo`` / ``mareinforce`` / ``maremax`` / ``marloo``
       run :class:`comlrl.trainers.reinforce.MAGRPOTrainer` with the matching
       ``advantage_mode``; ``iac`` / ``maac`` run
       :class:`comlrl.trainers.actor_critic.IACTrainer` / ``MAACTrainer``. The config
       fields they share with :class:`MARLHFConfig` are passed on, as in 1.4.3. Each joint
       action's reward is the reward model's score (no ``reward_processor``).

    Args:
        agent_model, agents, num_agents, tokenizer, model_config, train_dataset,
            eval_dataset, reward_func, reward_processor, formatters, wandb_config,
            eval_logger, eval_aggregator: as :class:`comlrl.trainers.reinforce.MAGRPOTrainer`;
            ``reward_func`` labels the pairs and scores evaluation.
        external_transition: must be None (MARLHF is single-turn, as in 1.4.3).
        args: a :class:`MARLHFConfig`.
        critic_model, critics: the critic source(s) for ``iac`` / ``maac`` (default
            ``critic_model_name``, then the agents' model).
        metrics_callback, centralized_comparator_adapter: not supported (raise when given).

    Raises:
        UnsupportedFieldError: a setting this package does not implement (named), checked
            before any model loads.
        ValueError, TypeError: missing or malformed arguments (named in the message).
    """

    single_device = True

    config_cls: type = MARLHFConfig
    algorithm_name = "MARLHF"

    def __init__(
        self,
        agent_model: Any = None,
        agents: Sequence[Any] | None = None,
        num_agents: int = 2,
        tokenizer: Any = None,
        model_config: dict[str, Any] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        reward_func: Callable[..., Any] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Any = None,
        external_transition: Callable[..., Sequence[str]] | None = None,
        wandb_config: dict[str, Any] | None = None,
        eval_logger: Callable[..., Any] | None = None,
        eval_aggregator: Callable[..., Any] | None = None,
        args: Any = None,
        *,
        centralized_comparator_adapter: Any = None,
        metrics_callback: Callable[..., Any] | None = None,
        critic_model: Any = None,
        critics: Sequence[Any] | None = None,
    ) -> None:
        cfg = args if args is not None else MARLHFConfig()
        if not isinstance(cfg, MARLHFConfig):
            raise TypeError(
                f"MARLHFTrainer takes args=MARLHFConfig(...), got {type(cfg).__name__}; build "
                "one with MARLHFConfig(**fields)."
            )
        _check_marlhf(cfg)
        for name, value in (
            ("centralized_comparator_adapter", centralized_comparator_adapter),
            ("metrics_callback", metrics_callback),
        ):
            if value is not None:
                raise UnsupportedFieldError(
                    f"MARLHFTrainer({name}=...) is not supported by comlrl.trainers; "
                    + (
                        "only decentralized MARLHF is implemented."
                        if name.startswith("centralized")
                        else "read the metric rows train() returns."
                    )
                )
        self._init_common(
            args=cfg,
            agent_model=agent_model,
            agents=agents,
            num_agents=num_agents,
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_func=reward_func,
            reward_processor=reward_processor,
            formatters=formatters,
            external_transition=external_transition,
            wandb_config=wandb_config,
        )
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        self.reward_processor = reward_processor
        self.rl_trainer = self._build_rl_trainer(critic_model, critics)
        self._run = self.rl_trainer._run
        self._preference = self._build_preference_stage()
        self.reward_model = self._preference.reward_model
        self.reward_tokenizer = self._preference.reward_tokenizer
        self.preference_pairs: list[Any] = []
        self.reward_model_history: list[dict[str, float]] = []

    # --- construction ------------------------------------------------------------------
    def _build_rl_trainer(self, critic_model: Any, critics: Sequence[Any] | None) -> Any:
        a = self.args
        shared: dict[str, Any] = {
            "agents": self._models,
            "tokenizer": self.tokenizers,
            "model_config": self.model_config,
            "train_dataset": self._train_rows,
            "eval_dataset": self._eval_rows,
            "reward_func": self.reward_func,
            "reward_processor": self.reward_processor,
            "formatters": [getattr(f, "__wrapped__", f) for f in self.formatters],
            "wandb_config": self.wandb_config,
        }
        if a.rl_algorithm in RL_ALGORITHMS:
            from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

            rl_args = MAGRPOConfig(
                **{f.name: getattr(a, f.name) for f in dataclasses.fields(MAGRPOConfig)}
            )
            trainer: Any = MAGRPOTrainer(
                num_agents=self.num_agents,
                eval_logger=self.eval_logger,
                eval_aggregator=self.eval_aggregator,
                args=rl_args,
                **shared,
            )
        else:
            from comlrl.trainers.actor_critic import (
                IACConfig,
                IACTrainer,
                MAACConfig,
                MAACTrainer,
            )

            common = _actor_critic_fields(a, self.num_agents)
            source = None
            if critics is None and (a.rl_algorithm == "maac" or a.use_separate_critic):
                source = critic_model or a.critic_model_name or self.model_name
                if not isinstance(source, str) and critic_model is None:
                    raise ValueError(
                        "MARLHFConfig.critic_model_name is None and the agents are model "
                        "objects; set critic_model_name, or pass critic_model= or critics=."
                    )
            if a.rl_algorithm == "maac":
                trainer = MAACTrainer(
                    args=MAACConfig(**common), critic_model=source, critics=critics, **shared
                )
            else:
                iac = IACConfig(
                    **common,
                    use_separate_critic=a.use_separate_critic,
                    value_clip_range=a.value_clip_range,
                    critic_value_head_hidden_dim=a.critic_value_head_hidden_dim,
                    value_head_hidden_dim=a.value_head_hidden_dim,
                )
                separate = bool(a.use_separate_critic)
                trainer = IACTrainer(
                    args=iac,
                    critic_model=source if separate else None,
                    critics=critics if separate else None,
                    **shared,
                )
        # evaluation keeps the task reward; training switches to the learned one in train()
        trainer.eval_reward = trainer.env.reward
        return trainer

    def _build_preference_stage(self) -> Any:
        import math

        import torch
        from comlrl.algos.recipes.preference import recipe as preference
        from comlrl.algos.recipes.preference.trainers import MARLHFTrainer as PreferenceStage
        from comlrl.trainers._base import _model_kwargs, one_device
        from transformers import AutoModelForCausalLM, AutoTokenizer

        a = self.args
        source = a.reward_model_name or self.model_name
        if not isinstance(source, str) or not source:
            raise ValueError(
                "MARLHFConfig.reward_model_name is None and the agents' model name is unknown "
                "(model objects); set reward_model_name to the reward model's name or path."
            )
        backbone = AutoModelForCausalLM.from_pretrained(source, **_model_kwargs(self.model_config))
        reward_tokenizer = AutoTokenizer.from_pretrained(source)
        if reward_tokenizer.pad_token is None:
            reward_tokenizer.pad_token = reward_tokenizer.eos_token
        device = a.reward_model_device
        if device is None:
            device = str(next(self._models[0].parameters()).device)
        elif torch.device(device).type == "cuda" and not torch.cuda.is_available():
            warnings.warn(
                f"MARLHFConfig.reward_model_device={device!r} but CUDA is not available; the "
                "reward model runs on the CPU (set reward_model_device=None to follow the "
                "agents, or 'cpu').",
                stacklevel=3,
            )
            device = "cpu"
        backbone.to(device)
        k = int(a.preference_num_candidates)
        batch = int(a.train_batch_size or a.rollout_buffer_size)
        sampling = preference.MADPOConfig(
            num_agents=self.num_agents,
            num_candidates=k,
            max_new_tokens=int(a.max_new_tokens),
            temperature=float(a.temperature),
            top_p=float(a.top_p),
            top_k=int(a.top_k or 0),
            joint_mode="align",
            pairs_per_prompt=int(a.preference_pairs_per_sample or k * (k - 1) // 2),
            batch_size=batch,
            device=one_device(a, self.num_agents, type(self).__name__),
        )
        reward_config = preference.RewardModelConfig(
            learning_rate=float(a.reward_learning_rate),
            optimizer="adamw",
            weight_decay=0.01,  # torch.optim.AdamW's default, which 1.4.3 uses
            num_epochs=int(a.reward_num_train_epochs),
            batch_size=int(a.reward_train_batch_size),
            max_length=int(a.reward_max_length or _NO_LIMIT),
            max_grad_norm=None,
            freeze_backbone=bool(a.reward_freeze_backbone),
        )
        return PreferenceStage(
            self.rl_trainer._run.agents,
            sampling,
            reward_backbone=backbone,
            reward_tokenizer=reward_tokenizer,
            reward_config=reward_config,
            dataset=self._train_rows,
            formatters=list(self.rl_trainer.env.formatters),
            reward_func=self.rl_trainer.env.reward,
            num_collect_batches=math.ceil(len(self._train_rows) / batch),
            eval_fraction=0.0,
        )

    # --- the run -----------------------------------------------------------------------
    @property
    def config(self) -> Any:
        """Our validated config of the RL stage."""
        return self.rl_trainer.config

    def train(self, **kwargs: Any) -> list[dict[str, float]]:
        """Collect preference pairs, fit the reward model, then run the RL stage on it
        (see the class docstring).

        Returns:
            The RL stage's per-step metric rows (empty when every sampled group tied: no
            pair, no reward model, as 1.4.3 stops there). The reward model's rows are in
            :attr:`reward_model_history`, the pairs in :attr:`preference_pairs`.

        Raises:
            UnsupportedFieldError: CoMLRL's checkpoint arguments (see
                :meth:`CompatTrainer.train`).
        """
        if kwargs:
            return super().train(**kwargs)  # raises, naming the arguments
        self.preference_pairs = self._preference.collect_pairs()
        if not sum(len(p) for p in self.preference_pairs):
            warnings.warn(
                "MARLHF: every sampled group tied under reward_func; no preference pairs, so "
                "no reward model and no RL stage (raise preference_num_candidates or the "
                "temperature).",
                stacklevel=2,
            )
            return []
        self.reward_model_history = self._preference.train_reward_model()
        self.rl_trainer._wandb_log(
            {f"reward_model/{k}": v for k, v in self.reward_model_history[-1].items()}
        )
        self.rl_trainer.env.reward = self._preference.reward_function()
        history: list[dict[str, float]] = self.rl_trainer.train()
        return history

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """The RL stage's evaluation, scored with the task ``reward_func`` (see
        :meth:`CompatTrainer.evaluate`)."""
        result: dict[str, float] = self.rl_trainer.evaluate(num_eval_samples)
        return result

    def save_model(self, output_dir: str | Path) -> list[Path]:
        """Write every agent to ``output_dir/agent_<i>`` (Hugging Face format), as 1.4.3's
        MARLHF does (the reward model and critics are not written)."""
        return CompatTrainer.save_model(self.rl_trainer, output_dir)


#: ``reward_max_length=None``: keep every token of a joint text
_NO_LIMIT = 1 << 30


def _check_marlhf(cfg: MARLHFConfig) -> None:
    if isinstance(cfg, MARLHFIterConfig):
        from comlrl.trainers._iterative import check_iterative_supported

        check_iterative_supported(cfg)
        _reject(
            cfg,
            "collaboration_mode",
            cfg.collaboration_mode == "decentralized",
            "only decentralized MARLHFIter is implemented; set collaboration_mode='decentralized'.",
        )
        return
    _reject(cfg, "num_turns", cfg.num_turns == 1, "MARLHF is single-turn; set num_turns=1.")
    _reject(
        cfg,
        "collaboration_mode",
        cfg.collaboration_mode == "decentralized",
        "only decentralized MARLHF is implemented; set collaboration_mode='decentralized'.",
    )
    _reject(
        cfg,
        "pair_selection",
        cfg.pair_selection == "reward_gap",
        "pairs are chosen by the largest reward gap; set pair_selection='reward_gap'.",
    )
    _reject(
        cfg,
        "joint_mode",
        JOINT_MODES[str(cfg.joint_mode).lower()] == "align",
        "the reward model scores aligned joint actions (as in 1.4.3); set joint_mode='aligned'.",
    )


def _actor_critic_fields(a: MARLHFConfig, num_agents: int) -> dict[str, Any]:
    """The IAC/MAAC config fields a MARLHF config passes on (1.4.3's mapping)."""
    names = (
        "agent_learning_rate", "rollout_buffer_size", "train_batch_size", "value_loss_coef",
        "advantage_normalization", "max_new_tokens", "temperature", "top_p", "top_k",
        "num_train_epochs", "num_generations", "num_turns", "parallel_training",
        "agent_devices", "critic_devices", "external_prompt_passthrough", "discount",
        "critic_type", "early_termination_threshold", "eval_interval", "eval_num_samples",
        "eval_batch_size", "logging_steps", "reference_kl_enabled", "reference_kl_coef",
        "reference_devices",
    )  # fmt: skip
    fields = {n: getattr(a, n) for n in names}
    fields["critic_learning_rate"] = a.critic_learning_rate or a.agent_learning_rate
    fields["num_agents"] = num_agents
    return fields


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
