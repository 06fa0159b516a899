"""CoMLRL 1.4.3's ``MADPOConfig`` / ``MADPOTrainer`` (module path ``comlrl.trainers.preference.madpo``).

MADPO here is CoMLRL 1.4.3's MADPO: before training, per training prompt,
``preference_num_candidates`` joint actions are sampled from the initial policy and scored
by the reward, and pairs are formed within the prompt (``pair_selection``,
``preference_pairs_per_sample`` kept; :mod:`comlrl.trainers._madpo_pairs`); then
``num_train_epochs`` epochs over those pairs, ``train_batch_size`` pairs per step, every
agent on its own term of the joint DPO loss (Rafailov et al. 2023, eq. 7, joint log-ratio
summed over agents) without a reference model (``log pi_ref = 0``), as 1.4.3
(:func:`comlrl.algos.recipes.preference.madpo.recipe.madpo_update`).

``reference_kl_enabled=True`` makes the loss standard DPO against a frozen copy of each
initial agent (on the agents' device; ``dpo_beta`` sets the strength, ``reference_kl_coef``
is not read). 1.4.3 loads those copies too but its loss never reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comlrl.trainers._base import (
    JOINT_MODES,
    CompatTrainer,
    UnsupportedFieldError,
    _reject,
    check_config_fields,
)
from comlrl.trainers.preference._centralized143 import CentralizedPreference143
from comlrl.trainers.preference._checkpoints import MADPOCheckpoints
from comlrl.trainers.preference._hooks143 import PreferenceHooks143
from comlrl.trainers.preference._records143 import AgentPreferenceTensors, PreferencePair

__all__ = ["AgentPreferenceTensors", "MADPOConfig", "MADPOTrainer", "PreferencePair"]


@dataclass
class MADPOConfig:
    """CoMLRL 1.4.3's ``MADPOConfig``: the same fields and defaults.

    Units as :class:`comlrl.trainers.reinforce.MAGRPOConfig`. Supported here:
    ``collaboration_mode`` ``"decentralized"`` and ``"centralized"`` (one joint actor; not
    for the iterative configs), ``num_turns=1``; other values raise :class:`UnsupportedFieldError` when the trainer is
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
        self._check_collaboration_mode()
        check_config_fields(self)
        self._check_turns()

    def _check_collaboration_mode(self) -> None:
        """1.4.3's ``collaboration_mode`` check: ``decentralized`` or ``centralized``
        (stored lower-case); ``centralized`` has one actor, index 0, and sets an iterative
        config's ``comparator_generation_mode`` to ``centralized`` (MADPO and MARLHF train
        one joint actor then; the iterative trainers refuse it)."""
        mode = str(self.collaboration_mode).strip().lower()
        if mode not in ("decentralized", "centralized"):
            raise ValueError(
                f"collaboration_mode={self.collaboration_mode!r}: use 'decentralized' or "
                "'centralized'."
            )
        self.collaboration_mode = mode
        if mode == "centralized":
            index = getattr(self, "comparator_centralized_agent_index", 0)
            if index != 0:
                raise ValueError(
                    "collaboration_mode='centralized' trains one joint actor, actor index 0; "
                    f"got comparator_centralized_agent_index={index!r}."
                )
            if hasattr(self, "comparator_generation_mode"):
                self.comparator_generation_mode = "centralized"

    def _check_turns(self) -> None:
        if self.num_turns != 1:
            raise UnsupportedFieldError(
                f"{type(self).__name__}.num_turns={self.num_turns!r}: MADPO is single-turn "
                "(num_turns=1), as in CoMLRL 1.4.3."
            )

    def _pair_selections(self) -> tuple[str, ...]:
        return ("reward_gap", "all", "random")


class MADPOTrainer(MADPOCheckpoints, CentralizedPreference143, PreferenceHooks143, CompatTrainer):
    """CoMLRL 1.4.3's ``MADPOTrainer``: pairs built once from the initial policy, then
    reference-free MADPO steps on them, or DPO against the frozen initial policy with
    ``reference_kl_enabled`` (see the module docstring and :meth:`train`).

    Args:
        agent_model, agents, num_agents, tokenizer, model_config, train_dataset,
            eval_dataset, reward_func, reward_processor, formatters, wandb_config,
            eval_logger, eval_aggregator: as :class:`comlrl.trainers.reinforce.MAGRPOTrainer`.
        external_transition: must be None (single-turn only here).
        args: a :class:`MADPOConfig`.
        centralized_comparator_adapter: with ``collaboration_mode="centralized"``, how the
            one joint actor is prompted for and answers with every role's output
            (default :class:`~comlrl.trainers.preference.TaggedCentralizedComparatorAdapter`);
            the trainer then has one agent (``num_agents`` stays the role count in
            ``args``), as ``comlrl train algo=centralized_madpo``
            (:mod:`comlrl.trainers.preference._centralized143`).

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

        from comlrl.algos.recipes.preference.config import MADPOConfig as AlgosMADPOConfig
        from comlrl.algos.recipes.preference.madpo.recipe import madpo_setup
        from comlrl.trainers._base import one_device

        cfg = args if args is not None else self.config_cls()
        if isinstance(cfg, MADPOConfig):
            self._check_args(cfg)
        num_agents, formatters, joint_reward = self._centralized_inputs(
            cfg,
            agents=agents,
            tokenizer=tokenizer,
            num_agents=num_agents,
            formatters=formatters,
            reward_func=reward_func,
            reward_processor=reward_processor,
            adapter=centralized_comparator_adapter,
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
        if joint_reward is not None:  # centralized: one actor, the roles' task reward
            self.env.reward = joint_reward
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
            config = AlgosMADPOConfig(**fields)
        except ValidationError as exc:
            raise ConfigError(f"MADPOConfig does not translate:\n{exc}") from None
        # reference-free, as CoMLRL 1.4.3's MADPO (log pi_ref = 0); with
        # reference_kl_enabled a frozen copy of each initial agent is the DPO reference
        refs = None if a.reference_kl_enabled else [None] * self.num_agents
        self._check_reference_devices(str(fields["device"]))
        self._defer_run(
            lambda: madpo_setup(
                self._hf_agents(), config, self.env, self._train_rows, None, ref_models=refs
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
        params = SamplingParams.from_config(a, a.preference_num_candidates)
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

    def train(  # type: ignore[override]
        self,
        resume_from_checkpoint: str | Path | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **kwargs: Any,
    ) -> list[dict[str, float]]:
        """CoMLRL 1.4.3's MADPO: build every preference pair once from the initial policy
        (:meth:`_build_pairs`, kept in :attr:`preference_pairs`), then
        ``num_train_epochs`` epochs over them, shuffled each epoch, ``train_batch_size``
        pairs per optimizer step of the reference-free MADPO loss
        (:func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_update`); evaluation every
        ``eval_interval`` steps (from step 0) with an ``eval_dataset``.

        Args:
            resume_from_checkpoint, checkpoint_dir, checkpoint_interval,
                checkpoint_total_limit: 1.4.3's checkpoint arguments (see
                :meth:`CompatTrainer.train`): a cursor is committed once the pairs are
                built (always written with ``checkpoint_dir``) and after every epoch;
                a resume does not rebuild the pairs
                (:mod:`comlrl.trainers.preference._checkpoints`).

        Returns:
            One row per step: ``epoch``, ``step``, ``num_pairs``, ``loss``, ``margin``,
            ``accuracy``, ``reward_gap_mean`` and per-agent terms; ``[]`` when every
            candidate tied (no pair).

        Raises:
            UnsupportedFieldError: other keyword arguments.
            ValueError: no ``train_dataset``, a bad checkpoint option, or a checkpoint that
                does not fit this trainer (before anything changes).
            FileExistsError: ``checkpoint_dir`` holds checkpoints this run would overwrite.
        """
        from comlrl.trainers.preference._checkpoints import start_train

        if kwargs:
            return super().train(**kwargs)  # raises, naming the arguments
        start_train(
            self, resume_from_checkpoint, checkpoint_dir, checkpoint_interval,
            checkpoint_total_limit,
        )  # fmt: skip
        return self._madpo_epochs()

    @property
    def reference_models(self) -> list[Any]:
        """The frozen reference copy of each agent the DPO loss compares with when
        ``reference_kl_enabled`` (``[]`` otherwise: reference-free, as 1.4.3's loss)."""
        given = self.__dict__.get("_reference_models_given")
        if given is not None:
            return list(given)
        if not self.args.reference_kl_enabled:
            return []
        return [m for m in self._run.ref_models if m is not None]

    @reference_models.setter
    def reference_models(self, models: Sequence[Any]) -> None:
        """Set the reference models of a trainer assembled by hand, before the recipe run
        is built (1.4.3's tests do; such a trainer trains through 1.4.3's hooks).

        Raises:
            AttributeError: the run is built (its DPO reference is fixed).
        """
        self._refuse_after_run("reference_models")
        self.__dict__["_reference_models_given"] = list(models)

    def _check_reference_devices(self, device: str) -> None:
        """``reference_devices`` must name the agents' one device (the reference copies
        score the same pairs there).

        Raises:
            UnsupportedFieldError: another device.
        """
        import torch
        from comlrl.trainers._fields import device_fields

        wanted = device_fields(self.args, self.num_agents).get("reference_devices") or []
        _reject(
            self.args,
            "reference_devices",
            all(torch.device(d) == torch.device(device) for d in wanted),
            f"MADPO's reference copies share the agents' device {device!r}; set it to None "
            "or to that device.",
        )

    def _check_args(self, cfg: MADPOConfig) -> None:
        """Raise :class:`UnsupportedFieldError` for settings MADPO does not implement."""
        _reject(cfg, "num_turns", cfg.num_turns == 1, "MADPO is single-turn here; set num_turns=1.")
