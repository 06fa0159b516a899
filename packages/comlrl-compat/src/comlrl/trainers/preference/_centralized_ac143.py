"""The actor-critic RL stage of CoMLRL 1.4.3's centralized MARLHF / MARLHFIter
(``collaboration_mode="centralized"`` with ``rl_algorithm="iac"`` or ``"maac"``).

The one joint actor trains with our actor-critic recipe
(:mod:`comlrl.algos.recipes.actor_critic.recipe`, through the compat
:class:`~comlrl.trainers.actor_critic.IACTrainer` / ``MAACTrainer`` built for *one*
agent): its prompt is the adapter's joint prompt of the roles' prompts, its completion the
joint response, its reward the learned reward model's score of that joint response (the
preference stage sets it when training starts), shaped by the reference KL as the other
MARLHF RL stages are (``reference_kl_enabled`` / ``reference_kl_coef``). Evaluation
scores the joint response with the roles' task reward and splits it into the roles'
outputs for ``eval_logger``.

As in 1.4.3 the stage is built when training starts, from the critics assigned to
``trainer.critic_sources`` by then (or the ``critics=`` given to the constructor): a
critic source is a model name/path or a ``transformers`` model; with none, the critic is
loaded from ``critic_model=``, ``critic_model_name`` or the agents' model name, as 1.4.3
resolves it. Until then a *front* built with the trainer (the same actor-critic trainer
with value heads on the actor, no reference model, never stepped) serves pair sampling,
evaluation and ``save_model``; it shares the actor model with the stage. The stage is
built once and kept across MARLHFIter's rounds (1.4.3 builds a new one per round, with
fresh value heads and critic optimizer; its critic models carry over, as ours do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comlrl.trainers._centralized import JointRoleEvaluation
from comlrl.trainers.actor_critic import IACTrainer, MAACTrainer

__all__ = [
    "CentralizedActorCriticStage143",
    "CentralizedIACTrainer",
    "CentralizedMAACTrainer",
    "check_critic_sources",
]

#: the actor-critic ``rl_algorithm`` names
ACTOR_CRITIC = ("iac", "maac")


def check_critic_sources(
    sources: Any, algorithm: str, use_separate_critic: bool
) -> list[Any] | None:
    """Validate the critics of a centralized MARLHF actor-critic stage.

    Args:
        sources: None (resolve the critic as 1.4.3 does) or a list/tuple of exactly one
            critic source: a model name/path (``str``) or a ``torch.nn.Module``. One,
            because the centralized stage has one agent, the joint actor: IAC gives each
            agent a critic, MAAC has one centralised critic.
        algorithm: ``"iac"`` or ``"maac"``.
        use_separate_critic: IAC's field; without it the critic is a value head on the
            actor and no critic source may be given.

    Returns:
        ``sources`` as a list, or None.

    Raises:
        TypeError: ``sources`` is not a list/tuple, or holds something other than a name
            or a model (the message names the entry and its type).
        ValueError: other than one source, an empty name, or sources with
            ``use_separate_critic=False`` (IAC).
    """
    import torch

    if sources is None:
        return None
    if isinstance(sources, (str, bytes)) or not isinstance(sources, (list, tuple)):
        raise TypeError(
            f"critic_sources must be a list of critic sources (model names/paths or "
            f"transformers models), got {type(sources).__name__}: {_short(sources)}; e.g. "
            "trainer.critic_sources = [critic_model]."
        )
    if algorithm == "iac" and not use_separate_critic:
        raise ValueError(
            "critic_sources need use_separate_critic=True: with use_separate_critic=False "
            "the IAC critic is a value head on the actor; drop critic_sources or set "
            "use_separate_critic=True."
        )
    if len(sources) != 1:
        role = "one per agent" if algorithm == "iac" else "one centralised critic"
        raise ValueError(
            f"critic_sources has {len(sources)} entries; centralized MARLHF with "
            f"rl_algorithm={algorithm!r} trains one joint actor, so it takes exactly 1 critic "
            f"({role})."
        )
    for i, source in enumerate(sources):
        if isinstance(source, str):
            if not source.strip():
                raise ValueError(f"critic_sources[{i}] is an empty model name; give a name/path.")
        elif not isinstance(source, torch.nn.Module):
            raise TypeError(
                f"critic_sources[{i}] is a {type(source).__name__} ({_short(source)}); a critic "
                "source is a model name/path (str) or a transformers model (torch.nn.Module)."
            )
    return list(sources)


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a model's repr runs to pages)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class CentralizedIACTrainer(JointRoleEvaluation, IACTrainer):
    """:class:`~comlrl.trainers.actor_critic.IACTrainer` on one joint actor whose
    evaluation splits the joint response into the roles' outputs."""


class CentralizedMAACTrainer(JointRoleEvaluation, MAACTrainer):
    """:class:`~comlrl.trainers.actor_critic.MAACTrainer` on one joint actor whose
    evaluation splits the joint response into the roles' outputs."""


class CentralizedActorCriticStage143:
    """The centralized actor-critic RL stage of the compat ``MARLHFTrainer`` (see the
    module docstring): :meth:`_centralized_ac_front` at construction,
    :meth:`_ensure_rl_stage` when training starts, :attr:`critic_sources` checked when
    assigned."""

    args: Any
    rl_trainer: Any
    centralized_collaboration: Any
    centralized_comparator_adapter: Any
    num_roles: int
    model_name: str | None
    tokenizers: list[Any]
    model_config: dict[str, Any]
    reward_func: Any
    reward_processor: Any
    formatters: list[Any]
    _models: list[Any]
    _train_rows: list[dict[str, Any]]
    _eval_rows: list[dict[str, Any]] | None
    #: the joint reward of the roles (set by ``_centralized_inputs``)
    _joint_reward: Any = None
    #: ``critic_model=`` given to the constructor (1.4.3's ``critic_model_source``)
    critic_model_source: Any = None
    _critic_sources: list[Any] | None = None
    _rl_stage_built: bool = True

    @property
    def _centralized_ac(self) -> bool:
        return self.centralized_collaboration is not None and self.args.rl_algorithm in ACTOR_CRITIC

    @property
    def critic_sources(self) -> list[Any] | None:
        """The critics of the actor-critic RL stage (1.4.3's attribute): None, or a list of
        model names/paths or models. Centralized: assignable until training starts, and
        checked when assigned (:func:`check_critic_sources`)."""
        return self._critic_sources

    @critic_sources.setter
    def critic_sources(self, sources: Sequence[Any] | None) -> None:
        if self.__dict__.get("centralized_collaboration") is None:
            if sources is not None and self.__dict__.get("rl_trainer") is not None:
                raise AttributeError(
                    "decentralized MARLHF builds its RL stage (and critics) with the trainer, "
                    "so critic_sources assigned afterwards would not be used; pass critics= "
                    "to MARLHFTrainer(...) instead."
                )
        elif self._centralized_ac:
            if self.__dict__.get("_rl_stage_built"):
                raise AttributeError(
                    "critic_sources cannot be replaced once the actor-critic RL stage is built "
                    "(it starts with the first train()); build a new trainer instead."
                )
            sources = check_critic_sources(
                sources, self.args.rl_algorithm, bool(self.args.use_separate_critic)
            )
        self._critic_sources = list(sources) if sources is not None else None

    def _ac_config(self, *, front: bool) -> Any:
        from comlrl.trainers.actor_critic import IACConfig, MAACConfig
        from comlrl.trainers.preference._marlhf_config import _actor_critic_fields

        a = self.args
        fields = _actor_critic_fields(a, 1)
        if front:  # never stepped: no reference copy, no separate critic
            fields.update(reference_kl_enabled=False, reference_devices=None)
            return IACConfig(**fields, use_separate_critic=False)
        if a.rl_algorithm == "maac":
            return MAACConfig(**fields)
        return IACConfig(
            **fields,
            use_separate_critic=a.use_separate_critic,
            value_clip_range=a.value_clip_range,
            critic_value_head_hidden_dim=a.critic_value_head_hidden_dim,
            value_head_hidden_dim=a.value_head_hidden_dim,
        )

    def _joint_stage(self, cls: type, config: Any, critic_model: Any, critics: Any) -> Any:
        """One compat actor-critic trainer on the joint actor (joint prompt, joint reward
        of the roles for evaluation; the learned reward is set when training starts)."""
        trainer = cls(
            agents=self._models,
            tokenizer=self.tokenizers,
            model_config=self.model_config,
            train_dataset=self._train_rows,
            eval_dataset=self._eval_rows,
            reward_func=self.reward_func,
            reward_processor=self.reward_processor,
            formatters=[getattr(f, "__wrapped__", f) for f in self.formatters],
            wandb_config=None,  # the front's W&B run is handed on (see _ensure_rl_stage)
            args=config,
            critic_model=critic_model,
            critics=critics,
        )
        trainer._joint_reward = self._joint_reward
        trainer.num_roles = self.num_roles
        trainer.env.reward = self._joint_reward
        trainer.eval_reward = self._joint_reward  # evaluation keeps the task reward
        return trainer

    def _centralized_ac_front(self, wandb_config: Any) -> Any:
        """The stand-in RL trainer until training starts: pairs are sampled and
        evaluation runs through it."""
        front = self._joint_stage(CentralizedIACTrainer, self._ac_config(front=True), None, None)
        front.wandb_config = wandb_config
        front._init_wandb()  # 1.4.3 starts the W&B run when the trainer is built
        self._rl_stage_built = False
        return front

    def _critic_source(self) -> Any:
        """1.4.3's default critic: ``critic_model=``, else ``critic_model_name``, else the
        agents' model name.

        Raises:
            ValueError: none of them is usable (model objects and no critic name).
        """
        a = self.args
        source = self.critic_model_source or a.critic_model_name or self.model_name
        if self.critic_model_source is None and not (isinstance(source, str) and source):
            raise ValueError(
                f"MARLHF with rl_algorithm={a.rl_algorithm!r} needs a critic: the agents are "
                "model objects and MARLHFConfig.critic_model_name is None; set "
                "critic_model_name, pass critic_model= / critics=, or assign "
                "trainer.critic_sources = [model] before train()."
            )
        return source

    def _ensure_rl_stage(self) -> None:
        """Build the centralized actor-critic stage (once, when training starts) and make
        it :attr:`rl_trainer`; a no-op otherwise. The critics are checked first, so bad
        ``critic_sources`` fail before any pair is sampled.

        Raises:
            ValueError, TypeError: bad ``critic_sources`` (see :func:`check_critic_sources`)
                or no critic source to load.
        """
        if self._rl_stage_built or not self._centralized_ac:
            return
        a = self.args
        critics = check_critic_sources(
            self._critic_sources, a.rl_algorithm, bool(a.use_separate_critic)
        )
        separate = a.rl_algorithm == "maac" or bool(a.use_separate_critic)
        source = self._critic_source() if separate and critics is None else None
        cls = CentralizedMAACTrainer if a.rl_algorithm == "maac" else CentralizedIACTrainer
        stage = self._joint_stage(cls, self._ac_config(front=False), source, critics)
        front = self.rl_trainer
        stage.env_step = int(front.env_step)
        stage.wandb_config = front.wandb_config
        stage._wandb_run = front._wandb_run
        stage.eval_logger = getattr(front, "eval_logger", None)
        stage.eval_aggregator = getattr(front, "eval_aggregator", None)
        self.rl_trainer = stage
        self._run = stage._run  # type: ignore[attr-defined]  # CompatTrainer's run setter
        self._rl_stage_built = True
