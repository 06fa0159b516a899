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
from pathlib import Path
from typing import Any

from comlrl.trainers._base import (
    CompatTrainer,
    UnsupportedFieldError,
)
from comlrl.trainers.preference._centralized143 import CentralizedMARLHF143
from comlrl.trainers.preference._centralized_ac143 import CentralizedActorCriticStage143
from comlrl.trainers.preference._checkpoints import MARLHFCheckpoints
from comlrl.trainers.preference._marlhf_config import (
    _NO_LIMIT,
    RL_ALGORITHMS,
    MARLHFConfig,
    _actor_critic_fields,
    _check_marlhf,
)
from comlrl.trainers.preference._reward_model143 import JointRewardModel

__all__ = ["JointRewardModel", "MARLHFConfig", "MARLHFTrainer"]


class MARLHFTrainer(
    CentralizedActorCriticStage143, MARLHFCheckpoints, CentralizedMARLHF143, CompatTrainer
):
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
            ``critic_model_name``, then the agents' model). Centralized: also
            :attr:`critic_sources`, assignable until :meth:`train` starts.
        centralized_comparator_adapter: with ``collaboration_mode="centralized"``, how the
            one joint actor is prompted for and answers with every role's output (default
            ``TaggedCentralizedComparatorAdapter``): pairs, reward model and the MAGRPO-family
            RL stage (:class:`comlrl.trainers.reinforce.CentralizedMAGRPOTrainer`) all work
            on the joint text (:mod:`comlrl.trainers.preference._centralized143`);
            ``iac`` / ``maac`` train the joint actor with our actor-critic recipe on the
            reward model's score, a stage built when :meth:`train` starts
            (:mod:`comlrl.trainers.preference._centralized_ac143`).
        metrics_callback: not supported (raises when given).

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
        if metrics_callback is not None:
            raise UnsupportedFieldError(
                "MARLHFTrainer(metrics_callback=...) is not supported by comlrl.trainers; "
                "read the metric rows train() returns."
            )
        num_agents, formatters, self._joint_reward = self._centralized_inputs(
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
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        self.reward_processor = reward_processor
        self.critic_model_source = critic_model
        self.critic_sources = critics  # centralized IAC/MAAC: checked now, used at train()
        self.rl_trainer = self._build_rl_trainer(critic_model, critics)
        self._run = self.rl_trainer._run
        self.advantage_mode = str(getattr(self.rl_trainer, "advantage_mode", cfg.advantage_mode))
        self.reward_optimizer: Any = None
        self._preference: Any = None
        self.reward_model: Any = None
        self.reward_tokenizer: Any = None
        if self.centralized_collaboration is None:  # centralized: 1.4.3's lazy reward model
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
        if self._centralized_ac:  # the stage itself is built when training starts
            return self._centralized_ac_front(self.wandb_config)
        if self.centralized_collaboration is not None:
            return self._centralized_rl_trainer(shared)
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
                if critic_model is None and not (isinstance(source, str) and source):
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

    def _load_reward_backbone(self) -> tuple[Any, Any]:
        """The reward model's LM and tokenizer (``reward_model_name``, else the agents'
        model name), on ``reward_model_device`` (None: the agents' device).

        Raises:
            ValueError: no name to load from (the agents are model objects).
        """
        import torch
        from comlrl.trainers._base import _model_kwargs
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
                stacklevel=4,
            )
            device = "cpu"
        backbone.to(device)
        return backbone, reward_tokenizer

    def _build_preference_stage(
        self, reward_model: Any = None, reward_tokenizer: Any = None
    ) -> Any:
        """Our preference stage (pairs, reward-model fit) over the RL stage's agents and
        environment; its reward model is ``reward_model`` or one loaded now."""
        import math

        from comlrl.algos.recipes.preference.config import MADPOConfig as AlgosMADPOConfig
        from comlrl.algos.recipes.preference.config import RewardModelConfig
        from comlrl.algos.recipes.preference.marlhf.trainer import MARLHFTrainer as PreferenceStage
        from comlrl.trainers._base import one_device

        a = self.args
        backbone = None
        if reward_model is None:
            backbone, reward_tokenizer = self._load_reward_backbone()
        k = int(a.preference_num_candidates)
        batch = int(a.train_batch_size or a.rollout_buffer_size)
        sampling = AlgosMADPOConfig(
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
        reward_config = RewardModelConfig(
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
            reward_model=reward_model,
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

    def train(  # type: ignore[override]
        self,
        resume_from_checkpoint: str | Path | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **kwargs: Any,
    ) -> list[dict[str, float]]:
        """Collect preference pairs, fit the reward model, then run the RL stage on it
        (see the class docstring).

        Args:
            resume_from_checkpoint, checkpoint_dir, checkpoint_interval,
                checkpoint_total_limit: 1.4.3's checkpoint arguments: a cursor is
                committed once the reward model is fitted (always written with
                ``checkpoint_dir``) and after every RL epoch; a resume neither collects
                pairs nor refits the reward model
                (:mod:`comlrl.trainers.preference._checkpoints`).

        Returns:
            The RL stage's per-step metric rows (empty when every sampled group tied: no
            pair, no reward model, as 1.4.3 stops there). The reward model's rows are in
            :attr:`reward_model_history`, the pairs in :attr:`preference_pairs`.

        Raises:
            UnsupportedFieldError: other keyword arguments.
            ValueError: a bad checkpoint option, or a checkpoint that does not fit this
                trainer (before anything changes).
            FileExistsError: ``checkpoint_dir`` holds checkpoints this run would overwrite.
        """
        from comlrl.trainers.preference._checkpoints import start_train

        if kwargs:
            return super().train(**kwargs)  # raises, naming the arguments
        self._ensure_rl_stage()  # centralized IAC/MAAC: built now, before a resume restores it
        start_train(
            self, resume_from_checkpoint, checkpoint_dir, checkpoint_interval,
            checkpoint_total_limit,
        )  # fmt: skip
        return self._marlhf_stages()

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """The RL stage's evaluation, scored with the task ``reward_func`` (see
        :meth:`CompatTrainer.evaluate`)."""
        # 1.4.3's scripts set eval_logger / eval_aggregator on the trainer after building it
        self.rl_trainer.eval_logger = self.eval_logger
        self.rl_trainer.eval_aggregator = self.eval_aggregator
        result: dict[str, float] = self.rl_trainer.evaluate(num_eval_samples)
        return result

    def save_model(self, output_dir: str | Path) -> list[Path]:
        """Write every agent to ``output_dir/agent_<i>`` (Hugging Face format), as 1.4.3's
        MARLHF does (the reward model and critics are not written)."""
        return CompatTrainer.save_model(self.rl_trainer, output_dir)
