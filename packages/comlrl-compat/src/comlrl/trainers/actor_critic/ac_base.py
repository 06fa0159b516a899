"""CoMLRL 1.4.3's ``ActorCriticTrainerBase``: the constructor, critics and saving shared by
:class:`~comlrl.trainers.actor_critic.iac.IACTrainer` and
:class:`~comlrl.trainers.actor_critic.maac.MAACTrainer`, run by ``comlrl.algos``'
:class:`~comlrl.algos.IACTrainer` / :class:`~comlrl.algos.MAACTrainer`.

As in 1.4.3: policy gradient ``-A * sum_t log pi`` without a PPO clip; advantage the
one-step TD error ``r_t + gamma V(h_{t+1}) - V(h_t)`` (GAE with ``lambda = 0``; Schulman
et al. 2016), whitened per step with ``advantage_normalization``; value loss weighted by
``value_loss_coef`` and clipped by ``value_clip_range``; a reward function that returns
``A`` values for a joint action gives agent ``a`` the ``a``-th.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from comlrl.trainers.base import CompatTrainer, recipe_agents
from comlrl.trainers.config_fields import (
    UnsupportedFieldError,
    check_minimums,
    check_parallel_training,
    common_train_config,
    device_list,
)
from comlrl.trainers.loading import load_agents

__all__ = ["ActorCriticTrainerBase", "check_actor_critic_config"]


def check_actor_critic_config(cfg: Any) -> None:
    """1.4.3's checks of ``IACConfig`` / ``MAACConfig`` (from their ``__post_init__``).

    Raises:
        ValueError: a count below its minimum, ``num_turns > 1`` with
            ``num_generations != 1``, an unknown ``critic_type`` or ``parallel_training``,
            ``'mp'`` without ``agent_devices`` / ``critic_devices``; naming the field.
    """
    if cfg.train_batch_size is None:
        cfg.train_batch_size = cfg.rollout_buffer_size
    check_minimums(
        cfg,
        {
            "rollout_buffer_size": 1,
            "train_batch_size": 1,
            "num_agents": 1,
            "num_turns": 1,
            "num_generations": 1,
            "eval_batch_size": 1,
            "logging_steps": 1,
            "eval_interval": 0,
            "eval_num_samples": 0,
        },
    )
    if cfg.num_turns > 1 and cfg.num_generations != 1:
        raise ValueError(
            f"num_turns={cfg.num_turns} needs num_generations=1 (as in CoMLRL 1.4.3), got "
            f"{cfg.num_generations}"
        )
    cfg.critic_type = (cfg.critic_type or "v").lower()
    if cfg.critic_type not in ("v", "q"):
        raise ValueError(f"critic_type={cfg.critic_type!r}; use 'v' (V(h)) or 'q' (Q(h, a))")
    if cfg.critic_learning_rate is None:
        cfg.critic_learning_rate = cfg.agent_learning_rate
    separate = getattr(cfg, "use_separate_critic", True)
    check_parallel_training(
        cfg, ("agent_devices", "critic_devices") if separate else ("agent_devices",)
    )


class ActorCriticTrainerBase(CompatTrainer):
    """The shared base of 1.4.3's actor-critic trainers (use a subclass; ``method`` picks
    the recipe). Arguments: see :class:`~comlrl.trainers.actor_critic.iac.IACTrainer`.

    Attributes:
        critics: the separate critic models (``transformers`` models): one per agent (IAC)
            or one (MAAC); empty with value heads on the agents.
    """

    method: str = "iac"
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
        cfg = args if args is not None else self.config_cls()
        shared = not getattr(cfg, "use_separate_critic", True)
        count = int(getattr(cfg, "num_agents", 2)) if self.method == "iac" else 1

        def check_critics() -> None:
            if metrics_callback is not None:
                raise UnsupportedFieldError(
                    "metrics_callback is not supported (it receives 1.4.3's internal rollout "
                    "records); read the metric rows train() returns instead."
                )
            if shared and (critic_model is not None or critics is not None):
                raise ValueError(
                    "critic_model/critics need use_separate_critic=True (a critic model per "
                    "agent); with use_separate_critic=False each agent gets a value head."
                )

        self._init_front(
            args=cfg,
            agent_model=agent_model,
            agents=agents,
            num_agents=int(getattr(cfg, "num_agents", 2)),
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_func=reward_func,
            reward_processor=reward_processor,
            formatters=formatters,
            external_transition=external_transition,
            wandb_config=wandb_config,
            before_loading=check_critics,
        )
        if self.num_agents != self.args.num_agents:
            raise ValueError(
                f"{self.num_agents} agents were given but args.num_agents="
                f"{self.args.num_agents}; make them agree."
            )
        if not shared and critic_model is None and critics is None:
            raise ValueError(
                "critics must be provided: pass critic_model= (a name/path or model) or "
                "critics= (a list), or set use_separate_critic=False for a value head on "
                "each agent's model."
            )
        if critics is not None and len(critics) != count:
            raise ValueError(
                f"critics length ({len(critics)}) must be {count} for {self.algorithm_name} "
                f"({'one per agent' if self.method == 'iac' else 'one centralised critic'})."
            )
        self.critics: list[Any] = []
        self._critic_tokenizers: list[Any] = []
        if not shared:
            names = critics if critics is not None else [critic_model] * count
            by_name = all(isinstance(c, str) for c in names)
            models, toks, _ = load_agents(
                None,
                list(names),
                count,
                None if by_name else self.tokenizers[:count],
                self.model_config,
                section="critic_model_kwargs",
                label="critic_model",
            )
            agent_ids = {id(m) for m in self.agents}
            # a critic given as an agent's own model object gets its own copy (a separate
            # critic is trained by its own optimizer)
            self.critics = [copy.deepcopy(m) if id(m) in agent_ids else m for m in models]
            self._critic_tokenizers = toks

    def recipe_config(self, num_examples: int, has_eval: bool) -> dict[str, Any]:
        args = self.args
        shared = not getattr(args, "use_separate_critic", True)
        fields = common_train_config(args, self.num_agents, num_examples, has_eval)
        count = self.num_agents if self.method == "iac" else 1
        critic_devices = None
        if not shared and args.critic_devices is not None:
            critic_devices = device_list(args.critic_devices, count, "critic_devices")
        fields.update(
            num_generations=int(args.num_generations),
            critic_learning_rate=float(args.critic_learning_rate),
            value_loss_coef=float(args.value_loss_coef),
            value_clip_range=getattr(args, "value_clip_range", None),
            gae_lambda=0.0,
            critic_type=args.critic_type,
            critic_mode="shared" if shared else "separate",
            critic_devices=critic_devices,
            value_head_hidden_dim=getattr(args, "value_head_hidden_dim", None),
            advantage_normalization=bool(args.advantage_normalization),
            clip_ratio=None,
            loss_reduction="seq_sum",
        )
        return fields

    def _critic_head_dim(self) -> int | None:
        return getattr(self.args, "critic_value_head_hidden_dim", None)

    def build_recipe_trainer(
        self, config: dict[str, Any], data: list[dict[str, Any]], eval_rows: list[Any] | None
    ) -> Any:
        import comlrl.algos as algos

        cfg = algos.ActorCriticConfig(**config)
        critics = None
        if self.critics:
            critics = []
            for model, tok in zip(self.critics, self._critic_tokenizers, strict=True):
                critic = algos.Critic(model, tok, kind=cfg.critic_type)
                dim = self._critic_head_dim()
                if dim is not None:
                    head = algos.ValueHead(critic.head.hidden_size, dim)
                    critic = algos.Critic(model, tok, head, kind=cfg.critic_type)
                critics.append(critic)
        trainer_cls = algos.IACTrainer if self.method == "iac" else algos.MAACTrainer
        return trainer_cls(
            recipe_agents(self.agents, self.tokenizers),
            cfg,
            critics=critics,
            environment=self.env,
            dataset=data,
            reward_func=self.reward_func,
            eval_dataset=eval_rows,
        )

    @property
    def critic_optimizers(self) -> list[Any]:
        """The separate critics' optimizers (the recipe's; none for value heads on the
        agents, which their agent's optimizer trains)."""
        if not self.critics:
            return []
        return [o for o in self.recipe_trainer.critic_optimizers if o is not None]

    def save_model(self, output_dir: str | Path) -> list[Path]:
        """Agents to ``output_dir/agent_<i>`` (Hugging Face format); a value head on an
        agent as ``agent_<i>/value_head.safetensors`` (+ ``.json``); separate critics
        (trunk, tokenizer, value head) to ``agent_<i>/critic`` (IAC) or
        ``output_dir/critic`` (MAAC). Returns the folders."""
        from comlrl.algos import save_value_head

        paths = super().save_model(output_dir)
        root = Path(output_dir)
        for i, critic in enumerate(self.recipe_trainer.critics):
            if critic.shared:
                save_value_head(critic.head, root / f"agent_{i}", kind=critic.kind)
            else:
                target = root / f"agent_{i}" / "critic" if self.method == "iac" else root / "critic"
                paths.append(critic.save(target))
        return paths
