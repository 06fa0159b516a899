"""CoMLRL 1.4.3's ``collaboration_mode="centralized"`` of MADPO / MARLHF, translated onto
our centralized collaboration (:mod:`comlrl.algos.rollout.joint_policy`): the trainer is
built for *one* agent whose prompt is the adapter's joint prompt of the roles' prompts and
whose reward is the task reward of the parsed role outputs, which is what
``comlrl train algo=centralized_madpo`` trains (:mod:`comlrl.algos.cli.centralized_run`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["CentralizedPreference143"]


class CentralizedPreference143:
    """The centralized front shared by the compat ``MADPOTrainer`` and ``MARLHFTrainer``."""

    #: 1.4.3's attributes: the adapter (default :class:`TaggedRoles`) and, in centralized
    #: mode, the environment boundary (None when decentralized)
    centralized_comparator_adapter: Any = None
    centralized_collaboration: Any = None
    num_roles: int

    def _centralized_inputs(
        self,
        cfg: Any,
        *,
        agents: Any,
        tokenizer: Any,
        num_agents: int,
        formatters: Any,
        reward_func: Any,
        reward_processor: Callable[[float], float] | None,
        adapter: Any,
    ) -> tuple[int, Any, Any]:
        """1.4.3's centralized constructor checks, then ``(num_agents, formatters,
        joint_reward)`` for the one-actor trainer; decentralized: the arguments as given
        and ``None``.

        Raises:
            ValueError: centralized with other than one actor model or tokenizer,
                ``num_agents != args.num_agents`` or no callable ``reward_func``.
            TypeError: an adapter without ``build_prompt`` / ``parse_completion``.
        """
        from comlrl.trainers._callbacks import CompatReward
        from comlrl.trainers._centralized import TaggedRoles, centralized_callbacks, check_adapter
        from comlrl.trainers.preference.collaboration import CentralizedCollaboration

        adapter = adapter if adapter is not None else TaggedRoles()
        check_adapter(adapter)
        self.centralized_comparator_adapter = adapter
        self.num_roles = int(num_agents)
        if getattr(cfg, "collaboration_mode", "decentralized") != "centralized":
            return num_agents, formatters, None
        if agents is not None and not isinstance(agents, str) and len(agents) != 1:
            raise ValueError(
                "collaboration_mode='centralized' trains exactly one actor (the joint "
                f"policy); got {len(agents)} agents (pass agents=[model] or agent_model=)."
            )
        if isinstance(tokenizer, (list, tuple)) and len(tokenizer) != 1:
            raise ValueError(
                f"collaboration_mode='centralized' takes one actor tokenizer, got {len(tokenizer)}"
            )
        if not callable(reward_func):
            raise ValueError(f"reward_func must be a callable, got {reward_func!r}")
        if num_agents != cfg.num_agents:
            raise ValueError(
                f"num_agents={num_agents} but args.num_agents={cfg.num_agents}; in centralized "
                "mode both are the role count and must match."
            )
        collaboration = CentralizedCollaboration(adapter, formatters, reward_func, num_agents)
        self.centralized_collaboration = collaboration
        role_reward = CompatReward(
            reward_func, num_agents, collaboration.formatters[0], reward_processor
        )
        joint_prompt, joint_reward = centralized_callbacks(
            lambda item: [f(item) for f in collaboration.formatters],
            role_reward,
            num_agents,
            adapter,
        )
        return 1, [joint_prompt], joint_reward

    @property
    def _centralized_eval_items(self) -> list[Any]:
        """1.4.3's examples held for the evaluation in progress: ours keeps none between
        evaluations (the roles' outputs are split per evaluation), so always empty."""
        return []

    def _eval_role_completions(
        self, completions: list[list[list[str]]], rows: list[dict[str, Any]]
    ) -> list[list[list[str]]]:
        """1.4.3's ``eval_logger`` input: in centralized mode the joint responses split
        into ``[A][example][turn]`` role outputs."""
        if self.centralized_collaboration is None:
            return completions
        roles: list[list[list[str]]] = self.centralized_collaboration.split_eval(completions, rows)
        return roles


class CentralizedMARLHF143(CentralizedPreference143):
    """1.4.3's centralized MARLHF on ours: the RL stage is a
    :class:`comlrl.trainers.reinforce.CentralizedMAGRPOTrainer` on the same joint actor,
    the reward model is built when training starts (``_init_reward_model``, 1.4.3's hook),
    and 1.4.3's joint-loss hooks score whole joint responses."""

    args: Any
    agents: list[Any]
    tokenizers: list[Any]
    rl_trainer: Any
    advantage_mode: str
    reward_model: Any
    reward_tokenizer: Any
    reward_optimizer: Any
    _load_reward_backbone: Callable[[], tuple[Any, Any]]

    def _centralized_rl_trainer(self, shared: dict[str, Any]) -> Any:
        """1.4.3's centralized online RL: the MAGRPO family on the joint actor, the roles'
        formatters and reward through ``centralized_comparator_adapter``."""
        import dataclasses

        from comlrl.trainers.reinforce import MAGRPOConfig
        from comlrl.trainers.reinforce.centralized_magrpo import (
            CentralizedMAGRPOConfig,
            CentralizedMAGRPOTrainer,
        )

        fields = {f.name: getattr(self.args, f.name) for f in dataclasses.fields(MAGRPOConfig)}
        roles = self.centralized_collaboration.formatters
        trainer = CentralizedMAGRPOTrainer(
            centralized_adapter=self.centralized_comparator_adapter,
            num_agents=self.num_roles,
            args=CentralizedMAGRPOConfig(**fields),
            eval_logger=getattr(self, "eval_logger", None),
            eval_aggregator=getattr(self, "eval_aggregator", None),
            **{**shared, "formatters": [getattr(f, "__wrapped__", f) for f in roles]},
        )
        trainer.eval_reward = trainer.env.reward  # the task reward of the parsed roles
        return trainer

    def _init_reward_model(self) -> None:
        """1.4.3's hook: set :attr:`reward_model` (1.4.3's ``JointRewardModel`` on the
        backbone of ``reward_model_name``, else the agents' model), ``reward_tokenizer``
        and ``reward_optimizer`` (AdamW at ``reward_learning_rate``). Our fit builds its
        own optimizer with the same settings (the one set here is not stepped).

        Raises:
            ValueError: no name to load from (the agents are model objects).
        """
        import torch
        from comlrl.trainers.preference._reward_model143 import JointRewardModel

        backbone, tokenizer = self._load_reward_backbone()
        self.reward_model = JointRewardModel(
            backbone, freeze_backbone=bool(self.args.reward_freeze_backbone)
        )
        self.reward_tokenizer = tokenizer
        self.reward_optimizer = torch.optim.AdamW(
            self.reward_model.parameters(), lr=float(self.args.reward_learning_rate)
        )

    def _sequence_log_prob(self, agent_idx: int, prompt_input_ids: Any, completion_ids: Any) -> Any:
        """1.4.3's joint-actor log-probability of one whole joint response
        (:func:`comlrl.trainers.preference.collaboration.joint_sequence_log_prob`)."""
        from comlrl.trainers.preference.collaboration import joint_sequence_log_prob

        return joint_sequence_log_prob(
            self.agents[agent_idx], self.tokenizers[agent_idx], prompt_input_ids, completion_ids
        )

    def _compute_loss_with_gradients(
        self, agent: Any, data: dict[str, Any], returns: list[float]
    ) -> Any:
        """1.4.3's centralized MARLHF policy loss: the joint-response policy gradient of
        :func:`comlrl.trainers.reinforce._centralized_hooks143.joint_policy_loss` with
        ``_sequence_log_prob(0, ...)``, ``advantage_mode`` and the RL stage's
        reference-KL shaping.

        Raises:
            NotImplementedError: a decentralized trainer (its RL stage owns the loss).
            ValueError: the responses and ``returns`` differ in number.
        """
        from comlrl.trainers.reinforce._centralized_hooks143 import joint_policy_loss

        if self.centralized_collaboration is None:
            raise NotImplementedError(
                "MARLHFTrainer._compute_loss_with_gradients is 1.4.3's centralized joint loss; "
                "decentralized MARLHF trains through its RL stage (trainer.rl_trainer)."
            )
        return joint_policy_loss(
            data,
            returns,
            log_prob=lambda prompt, ids: self._sequence_log_prob(0, prompt, ids),
            advantage_mode=self.advantage_mode,
            normalize=bool(self.args.advantage_normalization),
            shape_returns=self.rl_trainer._apply_reference_kl_to_returns,
        )

    @property
    def env_step(self) -> int:
        """1.4.3's environment steps: the joint actions the RL stage has scored."""
        rl = self.__dict__.get("rl_trainer")
        return int(rl.env_step) if rl is not None else int(self.__dict__.get("_env_step", 0))

    @env_step.setter
    def env_step(self, value: int) -> None:
        rl = self.__dict__.get("rl_trainer")
        if rl is not None:
            rl.env_step = int(value)
        else:
            self.__dict__["_env_step"] = int(value)
