"""CoMLRL 1.4.3's actor-critic trainers (``comlrl.trainers.actor_critic``) on
:mod:`comlrl.algos.recipes.actor_critic.recipe`.

:class:`IACTrainer`: independent actor-critic, one critic per agent (a separate model, or
a value head on the agent's model with ``use_separate_critic=False``).
:class:`MAACTrainer`: one centralised critic for all agents (Lowe et al. 2017; Foerster et
al. 2018). Both as in CoMLRL 1.4.3: policy gradient ``-A * sum_t log pi`` without a PPO
clip, advantage = one-step TD error ``r_t + gamma V(h_{t+1}) - V(h_t)`` (GAE with
``lambda = 0``, Schulman et al. 2016), whitened per step with ``advantage_normalization``,
value loss weighted by ``value_loss_coef`` and clipped with ``value_clip_range``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from comlrl.algos.recipes.actor_critic.recipe import Method
from comlrl.trainers._base import (
    CompatTrainer,
    UnsupportedFieldError,
    common_train_config,
    critic_device_names,
    load_agents,
)
from comlrl.trainers._epochs143 import ActorCriticEpochs143
from comlrl.trainers._kl_hooks143 import ReferenceKLHooks143
from comlrl.trainers.actor_critic._config import IACConfig, MAACConfig
from comlrl.trainers.actor_critic._hooks143 import (
    ActorCriticHooks143,
    MAACRolloutHooks143,
    RolloutSample,
)
from comlrl.trainers.actor_critic._loop143 import ActorCriticLoop143

# 1.4.3's tests replace this module's reference_kl_for_sequence (see _kl_hooks143)
from comlrl.utils.reference_kl import reference_kl_for_sequence  # noqa: F401

__all__ = [
    "ActorCriticTrainerBase",
    "IACConfig",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
    "RolloutSample",
]


class ActorCriticTrainerBase(
    ActorCriticEpochs143,
    ActorCriticLoop143,
    ActorCriticHooks143,
    ReferenceKLHooks143,
    CompatTrainer,
):
    """The shared base of :class:`IACTrainer` and :class:`MAACTrainer` (CoMLRL 1.4.3's
    ``comlrl.trainers.ActorCriticTrainerBase``): the constructor arguments, critic loading,
    ``train()``/``evaluate()``/``save_model()``. Use a subclass; ``method`` picks the recipe.
    Built with no arguments, it is a bare object whose fields the caller sets (1.4.3's base
    has no constructor of its own).
    """

    method: Method = "iac"
    _checkpoint_kind = "actor_critic"  # train(checkpoint_dir=...) writes resumable checkpoints
    #: CoMLRL 1.4.3: a reward function may return one value per agent (agent a trains on
    #: the a-th); see CompatReward(per_agent=True)
    per_agent_rewards = True

    def __init__(
        self,
        agent_model: Any = None,
        critic_model: Any = None,
        tokenizer: Any = None,
        reward_func: Callable[..., Any] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Any = None,
        args: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        model_config: dict[str, Any] | None = None,
        wandb_config: dict[str, Any] | None = None,
        metrics_callback: Callable[..., Any] | None = None,
        external_transition: Callable[..., Sequence[str]] | None = None,
        agents: Sequence[Any] | None = None,
        critics: Sequence[Any] | None = None,
    ) -> None:
        from comlrl.algos.recipes.actor_critic import recipe as actor_critic
        from comlrl.algos.recipes.actor_critic.recipe import ActorCriticConfig
        from comlrl.algos.recipes.group_baseline import recipe as group_baseline

        given = [agent_model, critic_model, tokenizer, reward_func, reward_processor,
                 formatters, args, train_dataset, eval_dataset, model_config, wandb_config,
                 metrics_callback, external_transition, agents, critics]  # fmt: skip
        if type(self) is ActorCriticTrainerBase and all(v is None for v in given):
            return  # 1.4.3's bare base class: no constructor of its own
        if metrics_callback is not None:
            raise UnsupportedFieldError(
                "metrics_callback is not supported by comlrl.trainers (it receives CoMLRL "
                "1.4.3's internal RolloutSample objects); read the metric rows train() returns, "
                "or eval_dataset metrics from evaluate()."
            )
        cfg = args if args is not None else self.config_cls()
        shared = not getattr(cfg, "use_separate_critic", True)
        if shared and (critic_model is not None or critics is not None):
            raise ValueError(
                "critic_model/critics need use_separate_critic=True (a critic model per agent)."
            )
        self._init_common(
            args=cfg,
            agent_model=agent_model,
            agents=agents,
            num_agents=getattr(cfg, "num_agents", 2),
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
        if self.num_agents != self.args.num_agents:
            raise ValueError(
                f"{self.num_agents} agents were given but args.num_agents={self.args.num_agents}; "
                "make them agree."
            )
        if not shared and critic_model is None and critics is None:
            raise ValueError(
                "critics must be provided: pass critic_model= (a name/path or model) or "
                "critics= (a list), or set use_separate_critic=False for a value head on each "
                "agent's model."
            )
        count = self.num_agents if self.method == "iac" else 1
        if critics is not None and len(critics) != count:
            raise ValueError(
                f"critics length ({len(critics)}) must be {count} for {self.algorithm_name} "
                f"({'one per agent' if self.method == 'iac' else 'one centralised critic'})."
            )
        self._critic_models = (
            [] if shared else self._load_critic_models(critic_model, critics, count)
        )
        fields = common_train_config(
            self.args, self.num_agents, len(self._train_rows), self._eval_rows is not None
        )
        fields.update(
            num_generations=int(self.args.num_generations),
            critic_learning_rate=float(self.args.critic_learning_rate),
            value_loss_coef=float(self.args.value_loss_coef),
            value_clip_range=getattr(self.args, "value_clip_range", None),
            gae_lambda=0.0,
            critic_type=self.args.critic_type,
            critic_mode="shared" if shared else "separate",
            critic_devices=critic_device_names(self.args, self.num_agents),
            advantage_normalization=bool(self.args.advantage_normalization),
            clip_ratio=None,
            loss_reduction="seq_sum",
        )
        config = self._our_config(ActorCriticConfig, fields)

        def build() -> Any:
            base = group_baseline.setup(
                self._hf_agents(),
                config,
                self.env,
                self._train_rows,
                self._eval_rows,
                group_baseline=False,
            )
            built = self._critics(base.agents, shared)
            self._ac_run = actor_critic.attach(base, config, self.method, built)
            return base

        self._defer_run(build)
        # CoMLRL 1.4.3 builds each separate critic's optimizer at construction; without
        # train_dataset our run (which owns them) is not built, so they are built here
        self._unbuilt_critic_optimizers = (
            [] if shared or self._run_state is not None else self._critic_optimizers_now(config)
        )
        self._init_wandb()  # 1.4.3 starts the W&B run when the trainer is built

    def _critic_optimizers_now(self, config: Any) -> list[Any]:
        """1.4.3's construction-time critic optimizers: one per separate critic (its trunk
        and value head), as :func:`~comlrl.algos.recipes.actor_critic.setup.attach` builds
        them (``config.optimizer``, ``critic_lr``, ``weight_decay``)."""
        from comlrl.algos.training.agents import build_optimizer

        return [
            build_optimizer(
                list(critic.parameters()),
                config.optimizer,
                lr=config.critic_lr,
                weight_decay=config.weight_decay,
            )
            for critic in self._critics([], shared=False)
        ]

    def _load_critic_models(
        self, critic_model: Any, critics: Any, count: int
    ) -> list[tuple[Any, Any]]:
        """The separate critics' ``(model, tokenizer)`` pairs, loaded or taken as given."""
        given = critics if critics is not None else None
        # a critic model object of the agents' tokenizer family reads the agent's tokenizer
        models, tokenizers, _ = load_agents(
            critic_model,
            given,
            count,
            None
            if all(isinstance(c, str) for c in (given or [critic_model]))
            else self.tokenizers[:count],
            self.model_config,
            section="critic_model_kwargs",
            label="critic_model",
        )
        if len(models) != count:
            raise ValueError(
                f"critics length ({len(models)}) must be {count} for {self.algorithm_name}."
            )
        return list(zip(models, tokenizers, strict=True))

    def _critics(self, agents: list[Any], shared: bool) -> list[Any]:
        from comlrl.algos.models.value import Critic, ValueHead, hidden_size_of

        kind = self.args.critic_type
        if shared:
            dim = self.args.value_head_hidden_dim
            return [
                Critic(
                    a.model,
                    a.tokenizer,
                    ValueHead(hidden_size_of(a.model), dim),
                    kind=kind,
                    shared=True,
                )
                for a in agents
            ]
        if self.method == "iac":
            dim = self.args.critic_value_head_hidden_dim
        else:
            dim = self.model_config.get("critic_value_head_hidden_dim")
        return [
            Critic(m, t, ValueHead(hidden_size_of(m), dim), kind=kind)
            for m, t in self._critic_models
        ]

    @property
    def critics(self) -> list[Any]:
        """The separate critic models (``transformers`` models, as in CoMLRL 1.4.3): one
        per agent (IAC) or one (MAAC); empty with value heads on the agents
        (``use_separate_critic=False``). Assignable before the recipe run is built."""
        return [m for m, _ in self._critic_models]

    @critics.setter
    def critics(self, models: Sequence[Any]) -> None:
        self._refuse_after_run("critics")
        self._critic_models = [(m, None) for m in models]

    @property
    def agent_optimizers(self) -> list[Any]:
        """1.4.3's name of :attr:`optimizers` (one per agent)."""
        return self.optimizers

    @agent_optimizers.setter
    def agent_optimizers(self, optimizers: Sequence[Any]) -> None:
        self.optimizers = optimizers

    @property
    def critic_optimizer(self) -> Any:
        """MAAC's centralised critic's optimizer (1.4.3's name; assignable before the run);
        None when there is no separate critic (value heads on the agents)."""
        given = self.__dict__.get("_critic_optimizer_given")
        if given is not None:
            return given
        optimizers = self.critic_optimizers
        return optimizers[0] if optimizers else None

    @critic_optimizer.setter
    def critic_optimizer(self, optimizer: Any) -> None:
        self._refuse_after_run("critic_optimizer")
        self.__dict__["_critic_optimizer_given"] = optimizer

    @property
    def value_critics(self) -> list[Any]:
        """The recipe's critics (:class:`comlrl.algos.models.value.Critic`: trunk and value
        head), value heads on the agents included."""
        self._run  # noqa: B018 (builds the run on first use)
        return list(self._ac_run.critics)

    @property
    def critic_optimizers(self) -> list[Any]:
        """The critics' optimizers (one per separate critic), built at construction as in
        CoMLRL 1.4.3, also for a trainer without ``train_dataset``; assignable before the
        recipe run is built."""
        given = self.__dict__.get("_critic_optimizers_given")
        if given is not None:
            return list(given)
        if self._run_state is None and not self._train_rows:
            return list(self._unbuilt_critic_optimizers)
        self._run  # noqa: B018 (builds the run on first use)
        return [o for o in self._ac_run.critic_optimizers if o is not None]

    @critic_optimizers.setter
    def critic_optimizers(self, optimizers: Sequence[Any]) -> None:
        self._refuse_after_run("critic_optimizers")
        self.__dict__["_critic_optimizers_given"] = list(optimizers)

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """As :meth:`CompatTrainer.evaluate`; a subclass that defines 1.4.3's
        ``_collect_rollouts(item)`` (or is given one) is evaluated through it, as 1.4.3 does
        (:meth:`~comlrl.trainers.actor_critic._loop143.ActorCriticLoop143._evaluate_rollouts143`);
        MAAC's own adapter (:class:`MAACRolloutHooks143`) alone does not count."""
        own = getattr(type(self), "_collect_rollouts", None)
        given = "_collect_rollouts" in self.__dict__
        if given or (callable(own) and own is not MAACRolloutHooks143._collect_rollouts):
            return self._evaluate_rollouts143(num_eval_samples)
        return super().evaluate(num_eval_samples)

    def _checkpoint_write(self, path: Path, section: dict[str, Any]) -> Path:
        """The actor-critic run (actors, critics, their optimizers) and ``section``."""
        from comlrl.algos.recipes.actor_critic import state
        from comlrl.utils.checkpoint import SECTION

        self._run  # noqa: B018 (builds the run on first use)
        return state.checkpoint(self._ac_run, path, recipe_state={SECTION: section})

    def _checkpoint_restore(self, path: Path, saved: dict[str, Any]) -> None:
        from comlrl.algos.recipes.actor_critic import state

        self._run  # noqa: B018
        state.resume(self._ac_run, path, state=saved)

    def _train_step(self) -> dict[str, float]:
        from comlrl.algos.recipes.actor_critic import recipe as actor_critic

        self._run  # noqa: B018 (builds the run on first use)
        return actor_critic.train_step(self._ac_run)

    def save_model(self, output_dir: str | Path) -> list[Path]:
        """Agents to ``output_dir/agent_<i>`` (Hugging Face format); a shared value head
        as ``agent_<i>/value_head.pt``; separate critics (trunk, tokenizer, value head) to
        ``agent_<i>/critic`` (IAC) or ``output_dir/critic`` (MAAC). Returns the folders."""
        paths = super().save_model(output_dir)
        root = Path(output_dir)
        from comlrl.algos.models.value import save_value_head

        for i, critic in enumerate(self.value_critics):
            if critic.shared:
                save_value_head(critic.head, root / f"agent_{i}", kind=critic.kind)
            else:
                target = root / f"agent_{i}" / "critic" if self.method == "iac" else root / "critic"
                paths.append(critic.save(target))
        return paths


class IACTrainer(ActorCriticTrainerBase):
    """CoMLRL 1.4.3's ``IACTrainer`` arguments, trained by
    :mod:`comlrl.algos.recipes.actor_critic.recipe` (``method="iac"``).

    Args:
        agent_model: a name/path (``args.num_agents`` copies) or, for one agent, a model.
        critic_model: with ``use_separate_critic``: a name/path loaded once per agent
            (or a model object for one agent).
        critics: instead, ``A`` critic models (names/paths or objects).
        agents, tokenizer, model_config, train_dataset, eval_dataset, reward_func,
            reward_processor, formatters, external_transition, wandb_config: as
            :class:`comlrl.trainers.reinforce.MAGRPOTrainer`.
        metrics_callback: not supported (raises).
        args: an :class:`IACConfig`.

    Raises:
        UnsupportedFieldError: a config value or argument this package does not implement.
        ValueError, TypeError: missing or malformed arguments (named in the message).
    """

    config_cls: type = IACConfig
    algorithm_name = "IAC"
    method = "iac"


class MAACTrainer(MAACRolloutHooks143, ActorCriticTrainerBase):
    """CoMLRL 1.4.3's ``MAACTrainer`` arguments: one centralised critic
    (``critic_model`` or ``critics=[one]``) reading every agent's prompt (``"v"``) or the
    joint action (``"q"``), trained by :mod:`comlrl.algos.recipes.actor_critic.recipe`
    (``method="maac"``). Arguments and errors as :class:`IACTrainer`; the critic head's
    hidden width is ``model_config["critic_value_head_hidden_dim"]`` as in CoMLRL 1.4.3.
    1.4.3's single-turn ``_collect_rollouts(item)`` is an adapter over its generation and
    critic hooks (:class:`~comlrl.trainers.actor_critic._hooks143.MAACRolloutHooks143`)."""

    config_cls: type = MAACConfig
    algorithm_name = "MAAC"
    method = "maac"
