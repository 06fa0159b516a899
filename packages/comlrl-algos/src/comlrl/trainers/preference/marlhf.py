"""CoMLRL 1.4.3's ``MARLHFConfig`` / ``MARLHFTrainer`` (module path ``comlrl.trainers.preference.marlhf``).

MARLHF fits a joint reward model on pairs labelled by the task reward
(Bradley-Terry), then trains the agents with the MAGRPO family or IAC/MAAC on that model's
scores (:class:`comlrl.algos.MARLHFTrainer` for the pairs and the reward model, the
trainers of :mod:`comlrl.trainers.reinforce` / :mod:`comlrl.trainers.actor_critic` for
the RL stage).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comlrl.trainers._base import (
    JOINT_MODES,
    CompatTrainer,
    UnsupportedFieldError,
    _reject,
)
from comlrl.trainers.preference.madpo import MADPOConfig

__all__ = ["MARLHFConfig", "MARLHFTrainer"]


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
    from comlrl.trainers.preference.iterative import MARLHFIterConfig  # defined on top of this one

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
