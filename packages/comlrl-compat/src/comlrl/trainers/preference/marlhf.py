"""CoMLRL 1.4.3's ``MARLHFConfig`` / ``MARLHFTrainer`` (module path
``comlrl.trainers.preference.marlhf``), composed of ``comlrl.algos``' MARLHF and an RL trainer.

:meth:`MARLHFTrainer.train` runs :class:`comlrl.algos.MARLHFTrainer`'s two stages, then
the RL stage:

1. **Pairs** (:meth:`comlrl.algos.MARLHFTrainer.collect_pairs`): ``ceil(N /
   train_batch_size)`` batches of prompts, ``preference_num_candidates`` aligned joint
   actions each, scored by ``reward_func``, paired by reward gap.
2. **Reward model** (:meth:`~comlrl.algos.MARLHFTrainer.train_reward_model`):
   :class:`comlrl.algos.JointRewardModel` (``reward_model_name`` + a linear head) fitted
   with the Bradley-Terry loss (Bradley & Terry 1952; Ouyang et al. 2022, eq. 1).
3. **RL**: the ``comlrl.trainers`` trainer of ``rl_algorithm`` (the MAGRPO family:
   :class:`comlrl.trainers.MAGRPOTrainer`; ``iac`` / ``maac``) on the same agents, built
   from the fields it shares with :class:`MARLHFConfig`, as in 1.4.3, rewarded by the
   reward model (:class:`comlrl.algos.RewardModelReward`), also in its evaluation.

A resume (``train(resume_from_checkpoint=...)``, a step checkpoint of the RL stage) runs
stages 1 and 2 again from the initial weights (the same seeds give the same pairs and
reward model), then continues the RL stage from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from comlrl.trainers.config_fields import UnsupportedFieldError
from comlrl.trainers.preference.madpo import JOINT_MODES, MADPOConfig, madpo_fields

__all__ = [
    "MARLHFConfig",
    "MARLHFTrainer",
    "RL_ALGORITHMS",
    "load_reward_backbone",
    "refuse_unsupported",
    "reward_model_config",
]

#: 1.4.3's ``rl_algorithm`` names of the MAGRPO family -> ``advantage_mode``
RL_ALGORITHMS = {"magrpo": "mean", "mareinforce": "raw", "maremax": "max", "marloo": "rloo"}
_ALIASES = {"mareforce": "mareinforce"}


@dataclasses.dataclass
class MARLHFConfig(MADPOConfig):
    """CoMLRL 1.4.3's ``MARLHFConfig``: :class:`MADPOConfig`'s fields plus the reward-model
    and RL-stage fields, with its defaults (see the module docstring).

    ``reward_model_device`` None: the agents' device (a CUDA device without CUDA falls back
    to the CPU with a warning); ``reward_max_length`` None: no limit. The critic fields
    are read by ``iac`` / ``maac`` as in :class:`comlrl.trainers.IACConfig`.

    Raises:
        ValueError: as :class:`MADPOConfig` (``num_turns`` is checked by the trainer), an
            unknown ``rl_algorithm`` or ``critic_type``, ``num_generations < 2`` for the
            MAGRPO family, or a non-positive learning rate, count or length.
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
        """1.4.3 builds a multi-turn MARLHFConfig; the trainer refuses it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        name = str(self.rl_algorithm or "magrpo").strip().lower()
        self.rl_algorithm = _ALIASES.get(name, name)
        if self.rl_algorithm not in (*RL_ALGORITHMS, "iac", "maac"):
            raise ValueError(
                f"rl_algorithm={self.rl_algorithm!r}; use one of "
                f"{sorted([*RL_ALGORITHMS, 'iac', 'maac'])}"
            )
        low = 2 if self.rl_algorithm in RL_ALGORITHMS else 1
        if self.num_generations < low:
            raise ValueError(
                f"num_generations must be >= {low} for rl_algorithm={self.rl_algorithm!r}, "
                f"got {self.num_generations!r}"
            )
        self.advantage_mode = RL_ALGORITHMS.get(self.rl_algorithm, self.advantage_mode)
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
        self.critic_type = str(self.critic_type or "v").strip().lower()
        if self.critic_type not in ("v", "q"):
            raise ValueError(f"critic_type={self.critic_type!r}; use 'v' or 'q'")


class MARLHFTrainer:
    """CoMLRL 1.4.3's ``MARLHFTrainer`` (its arguments): :class:`comlrl.algos.MARLHFTrainer`
    for the pairs and the reward model, then the RL stage's ``comlrl.trainers`` trainer
    (:attr:`rl_trainer`) on that model's reward (see the module docstring).

    Args:
        agent_model, agents, num_agents, tokenizer, model_config, train_dataset,
            eval_dataset, reward_func, reward_processor, formatters, wandb_config,
            eval_logger, eval_aggregator: as :class:`comlrl.trainers.MAGRPOTrainer`;
            ``reward_func`` labels the pairs.
        external_transition: accepted only as None (MARLHF is single-turn, as in 1.4.3).
        args: a :class:`MARLHFConfig`.
        critic_model, critics: the critics of ``iac`` / ``maac`` (default
            ``critic_model_name``).
        centralized_comparator_adapter, metrics_callback: accepted only as None.

    Raises:
        UnsupportedFieldError: a setting this package does not implement (named).
        ValueError, TypeError: missing or malformed arguments (1.4.3's messages).
    """

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
        a = args if args is not None else MARLHFConfig()
        if not isinstance(a, MARLHFConfig):
            raise TypeError(f"MARLHFTrainer takes args=MARLHFConfig(...), got {type(a).__name__}")
        if reward_func is None or not callable(reward_func):
            raise ValueError(f"reward_func must be a callable, got {reward_func!r}")
        if agent_model is None and agents is None:
            raise ValueError(
                "Either agent_model or agents must be provided: pass agent_model= (a model "
                "name or path) or agents= (a list of models)."
            )
        refuse_unsupported(a, external_transition, centralized_comparator_adapter, metrics_callback)
        self.args = a
        rl_args: dict[str, Any] = dict(
            agent_model=agent_model, agents=agents, tokenizer=tokenizer,
            model_config=model_config, train_dataset=train_dataset,
            eval_dataset=eval_dataset, reward_func=reward_func,
            reward_processor=reward_processor, formatters=formatters,
            wandb_config=wandb_config,
        )  # fmt: skip
        if a.rl_algorithm in RL_ALGORITHMS:
            from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

            self.rl_trainer: Any = MAGRPOTrainer(
                num_agents=num_agents, eval_logger=eval_logger, eval_aggregator=eval_aggregator,
                args=_subset(MAGRPOConfig, a, num_agents=num_agents), **rl_args,
            )  # fmt: skip
        else:
            from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer

            cls, cfg_cls = (
                (IACTrainer, IACConfig) if a.rl_algorithm == "iac" else (MAACTrainer, MAACConfig)
            )
            self.rl_trainer = cls(
                args=_subset(cfg_cls, a, num_agents=num_agents),
                critic_model=critic_model or a.critic_model_name,
                critics=critics,
                **rl_args,
            )
        self.preference: Any = None
        self.reward_model_history: list[dict[str, float]] = []

    # --- the stages ----------------------------------------------------------------------
    def fit_reward_model(self) -> list[dict[str, float]]:
        """Stages 1 and 2 (pairs, reward model) from the agents as they are now; sets the
        RL stage's reward to the fitted model. Returns the reward model's rows (``[]``,
        and no reward model, when every candidate tied: no pair)."""
        from comlrl.algos import MARLHFConfig as PreferenceConfig
        from comlrl.algos import MARLHFTrainer as Preference
        from comlrl.trainers.base import recipe_agents
        from comlrl.trainers.loading import as_examples

        a, rl = self.args, self.rl_trainer
        data = as_examples(rl.train_dataset, "train_dataset")
        sampling = madpo_fields(a, rl.num_agents, False, "MARLHFTrainer")
        backbone, tokenizer = load_reward_backbone(a, rl.model_name, rl.agents[0])
        fit = reward_model_config(a).model_copy(
            update={
                "num_generations": sampling["num_candidates"],
                "pairs_per_prompt": sampling["pairs_per_prompt"],
                "num_collect_batches": math.ceil(len(data) / sampling["batch_size"]),
                "eval_fraction": 0.0,
            }
        )
        self.preference = Preference(
            recipe_agents(rl.agents, rl.tokenizers),
            PreferenceConfig(
                num_agents=sampling["num_agents"],
                max_new_tokens=sampling["max_new_tokens"],
                temperature=sampling["temperature"],
                top_p=sampling["top_p"],
                top_k=sampling["top_k"],
                joint_mode=sampling["joint_mode"],
                batch_size=sampling["batch_size"],
                device=sampling["device"],
                eval_every=0,
                reward_model=fit,
            ),
            reward_backbone=backbone,
            reward_tokenizer=tokenizer,
            dataset=data,
            formatters=list(rl.env.compat_formatters),
            reward_func=rl.env.joint_reward,
        )
        if not any(len(p) for p in self.preference.collect_pairs()):
            return []
        self.reward_model_history = self.preference.train_reward_model()
        rl.env.use_reward(self.preference.reward_function())
        return self.reward_model_history

    @property
    def reward_model(self) -> Any:
        """The fitted :class:`comlrl.algos.JointRewardModel` (None before :meth:`train`)."""
        return None if self.preference is None else self.preference.reward_model

    @property
    def preference_pairs(self) -> list[Any]:
        """The pair batches stage 1 sampled (``comlrl.algos`` ``JointPreferencePairs``)."""
        return [] if self.preference is None else list(self.preference.pairs)

    def train(
        self,
        resume_from_checkpoint: str | Path | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **kwargs: Any,
    ) -> list[dict[str, float]]:
        """Stages 1 and 2 (:meth:`fit_reward_model`), then the RL stage's ``train`` with
        the same arguments (its rows; ``[]`` without a pair, as 1.4.3 stops there)."""
        if self.preference is None and not self.fit_reward_model():
            return []
        return list(
            self.rl_trainer.train(
                resume_from_checkpoint,
                checkpoint_dir,
                checkpoint_interval,
                checkpoint_total_limit,
                **kwargs,
            )  # fmt: skip
        )

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """The RL stage's evaluation (scored by its reward: the task's before
        :meth:`train`, the reward model's after)."""
        return dict(self.rl_trainer.evaluate(num_eval_samples))

    def save_model(self, output_dir: str | Path) -> list[Path]:
        """Every agent to ``output_dir/agent_<i>`` (the reward model is not written, as in
        1.4.3)."""
        return list(self.rl_trainer.save_model(output_dir))

    def __getattr__(self, name: str) -> Any:
        # 1.4.3's attributes of the agents (agents, tokenizer, num_agents, env, ...)
        if name == "rl_trainer":
            raise AttributeError(name)
        return getattr(self.rl_trainer, name)


def refuse_unsupported(
    a: MARLHFConfig, transition: Any, adapter: Any, callback: Any, iterative: bool = False
) -> None:
    """Raise :class:`UnsupportedFieldError` for what MARLHF (``iterative``: MARLHF-Iter,
    whose ``pair_selection`` orders current-vs-comparator pairs) does not implement here."""
    checks = (
        (a.num_turns == 1, f"num_turns={a.num_turns!r}: MARLHF is single-turn; set num_turns=1"),
        (transition is None, "external_transition: MARLHF is single-turn; drop it"),
        (iterative or a.pair_selection == "reward_gap", f"pair_selection={a.pair_selection!r}: the "
         "reward model's pairs are the largest reward gaps; set pair_selection='reward_gap'"),
        (JOINT_MODES[str(a.joint_mode).lower()] == "align", f"joint_mode={a.joint_mode!r}: "
         "the reward model scores aligned joint actions; set joint_mode='aligned'"),
        (a.collaboration_mode == "decentralized",
         "collaboration_mode='centralized': not supported by MARLHFTrainer here; use "
         "comlrl train algo=centralized_marlhf"),
        (callback is None, "metrics_callback: read the metric rows train() returns"),
    )  # fmt: skip
    for ok, message in checks:
        if not ok:
            raise UnsupportedFieldError(f"MARLHFConfig/MARLHFTrainer: {message}.")


def reward_model_config(a: MARLHFConfig) -> Any:
    """The :class:`comlrl.algos.RewardModelConfig` of a 1.4.3 MARLHF config (1.4.3's
    AdamW: weight decay 0.01, no clipping; ``reward_max_length`` None: no limit)."""
    from comlrl.algos import RewardModelConfig

    return RewardModelConfig.build(
        learning_rate=float(a.reward_learning_rate), optimizer="adamw", weight_decay=0.01,
        num_epochs=int(a.reward_num_train_epochs), batch_size=int(a.reward_train_batch_size),
        max_length=int(a.reward_max_length or 1 << 30), max_grad_norm=None,
        freeze_backbone=bool(a.reward_freeze_backbone),
    )  # fmt: skip


def load_reward_backbone(a: MARLHFConfig, model_name: str | None, agent: Any) -> tuple[Any, Any]:
    """The reward model's LM and tokenizer (``reward_model_name``, else the agents'
    ``model_name``) on ``reward_model_device`` (None: ``agent``'s device; a CUDA device
    without CUDA: the CPU, with a warning).

    Raises:
        ValueError: no name to load it from (the agents are model objects).
    """
    import torch
    from comlrl.algos import load_model_and_tokenizer

    source = a.reward_model_name or model_name
    if not isinstance(source, str) or not source:
        raise ValueError(
            "MARLHFConfig.reward_model_name is None and the agents are model objects; set "
            "reward_model_name to the reward model's name or path."
        )
    model, tokenizer = load_model_and_tokenizer(source)
    device = a.reward_model_device or str(next(agent.parameters()).device)
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        warnings.warn(
            f"reward_model_device={device!r} but CUDA is not available; the reward model runs "
            "on the CPU.",
            stacklevel=3,
        )
        device = "cpu"
    return model.to(device), tokenizer


def _subset(cls: type, args: Any, **overrides: Any) -> Any:
    """``cls`` (a 1.4.3 config dataclass) built from the fields ``args`` shares with it."""
    names = {f.name for f in dataclasses.fields(cls)}
    shared = {n: getattr(args, n) for n in names if hasattr(args, n)}
    return cls(**{**shared, **{k: v for k, v in overrides.items() if k in names}})
