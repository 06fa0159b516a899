"""CoMLRL 1.4.3's ``MAGRPOConfig`` and ``MAGRPOTrainer`` on the group-baseline recipe of
``comlrl.algos`` (:class:`comlrl.algos.MAGRPOTrainer` and its estimator variants).

The estimator is 1.4.3's ``advantage_mode``: ``mean`` (GRPO's group-mean baseline; Shao et
al. 2024), ``rloo`` (leave-one-out; Kool et al. 2019, Ahmadian et al. 2024), ``max`` (the
group's best return, after Li et al. 2023 ReMax) or ``raw`` (no baseline; Williams 1992);
``advantage_normalization`` divides by the group's std of returns. The loss is
``-A_g * sum_t log pi(a_gt | h)`` per completion averaged over completions (``seq_sum``),
``log pi`` the untempered log-probs. As in 1.4.3 the return is the undiscounted sum of the
rewards down the tree (``discount`` is not used), and ``reference_kl_coef`` times each
completion's summed ``k3`` KL to the reference is subtracted from its return before the
advantage (``kl_mode="reward"``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from comlrl.trainers.base import CompatTrainer, recipe_agents
from comlrl.trainers.config_fields import (
    check_minimums,
    check_parallel_training,
    common_train_config,
)

__all__ = ["MAGRPOConfig", "MAGRPOTrainer", "group_baseline_config"]

#: 1.4.3's ``advantage_mode`` -> the ``comlrl.algos`` estimator
ADVANTAGE_MODES = {"mean": "grpo", "raw": "reinforce", "max": "remax", "rloo": "rloo"}
#: 1.4.3's ``joint_mode`` spellings -> ``comlrl.algos``'
JOINT_MODES = {"aligned": "align", "align": "align", "cross": "cross", "crossed": "cross"}
#: the PPO clip of the later (off-policy) optimizer steps of a multi-turn step
MULTI_TURN_CLIP_RATIO = 0.2


@dataclass
class MAGRPOConfig:
    """CoMLRL 1.4.3's ``MAGRPOConfig``: its fields, defaults and checks.

    Units: ``agent_learning_rate`` per optimizer step; ``num_train_epochs`` passes over the
    training set; ``max_new_tokens`` tokens; ``eval_interval`` / ``eval_num_samples``
    examples; ``train_batch_size`` (default ``rollout_buffer_size``) examples per step.
    With 1.4.3's defaults ``num_turns=2`` and ``early_termination_threshold=-0.2`` a reward
    that is never below -0.2 ends every episode after turn 1 (as in 1.4.3).

    Raises:
        ValueError: a count below its minimum (``num_generations >= 2``), an unknown
            ``advantage_mode`` / ``joint_mode`` or ``parallel_training``, naming the field.
    """

    num_train_epochs: int = 20
    agent_learning_rate: float = 5.0e-6
    logging_steps: int = 50
    num_agents: int = 2
    parallel_training: str = "none"
    agent_devices: str | Sequence[str] | None = None
    num_generations: int = 4
    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.6
    top_k: int | None = 50
    num_turns: int = 2
    discount: float = 1.0
    joint_mode: str = "aligned"
    early_termination_threshold: float | None = -0.2
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

    def __post_init__(self) -> None:
        check_minimums(
            self,
            {
                "num_train_epochs": 1,
                "num_agents": 1,
                "num_generations": 2,
                "rollout_buffer_size": 1,
                "eval_interval": 0,
                "eval_num_samples": 0,
                "eval_batch_size": 1,
                "num_turns": 1,
                "logging_steps": 1,
                "train_batch_size": 1,
            },
        )
        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        if str(self.advantage_mode).lower() not in ADVANTAGE_MODES:
            raise ValueError(
                f"advantage_mode={self.advantage_mode!r}; use one of {sorted(ADVANTAGE_MODES)}"
            )
        if str(self.joint_mode).lower() not in JOINT_MODES:
            raise ValueError(f"joint_mode={self.joint_mode!r}; use 'aligned' or 'cross'")
        check_parallel_training(self)


def group_baseline_config(
    args: MAGRPOConfig, num_agents: int, num_examples: int, has_eval: bool
) -> dict[str, Any]:
    """The :class:`comlrl.algos.TrainConfig` fields of a 1.4.3 REINFORCE-family config.

    ``advantage_normalization`` is ``advantage_scale="group"`` (the group's population std
    plus 1e-6, no re-centring), except for ``raw`` (no baseline), whose advantage stays the
    return (1.4.3 z-scores it, which turns MAREINFORCE into MAGRPO). Multi-turn steps
    follow 1.4.3's update schedule: one optimizer step per turn of each
    ``rollout_buffer_size`` tree nodes (``update_chunk_nodes``), the later, off-policy ones
    PPO-clipped at :data:`MULTI_TURN_CLIP_RATIO`. 1.4.3 trains on the undiscounted return
    whatever ``discount`` says (``gamma=1``; a ``discount`` other than 1 warns), and puts
    the reference KL in the reward (``kl_mode="reward"``).
    """
    fields = common_train_config(args, num_agents, num_examples, has_eval)
    discount = float(getattr(args, "discount", 1.0))
    if discount != 1.0 and int(args.num_turns) > 1:
        warnings.warn(
            f"{type(args).__name__}(discount={discount}): CoMLRL 1.4.3's REINFORCE-family "
            "trainers do not use discount (their return is the undiscounted sum), so it is "
            "ignored here too; comlrl.algos' gamma discounts (comlrl train gamma=...).",
            UserWarning,
            stacklevel=4,
        )
    fields.update(gamma=1.0, kl_mode="reward")
    estimator = ADVANTAGE_MODES[str(args.advantage_mode).lower()]
    scale = "group" if args.advantage_normalization and estimator != "reinforce" else "none"
    fields.update(
        num_generations=int(args.num_generations),
        joint_mode=JOINT_MODES[str(args.joint_mode).lower()],
        estimator=estimator,
        advantage_scale=scale,
        loss_reduction="seq_sum",
        clip_ratio=None,
    )
    if int(args.num_turns) > 1:
        fields.update(
            update_chunk_nodes=int(args.rollout_buffer_size),
            update_chunk_split_turns=True,
            clip_ratio=MULTI_TURN_CLIP_RATIO,
        )
    return fields


class MAGRPOTrainer(CompatTrainer):
    """CoMLRL 1.4.3's ``MAGRPOTrainer`` (its arguments), trained by the ``comlrl.algos``
    trainer of ``args.advantage_mode``'s estimator: :class:`comlrl.algos.MAGRPOTrainer` for
    1.4.3's default ``"mean"`` (any REINFORCE-family config works, as in 1.4.3).

    Args: 1.4.3's (``agent_model`` or ``agents``, ``num_agents``, ``tokenizer``,
    ``model_config``, ``train_dataset``, ``eval_dataset``, ``reward_func`` in any 1.4.3 form,
    ``reward_processor``, ``formatters``, ``external_transition`` (required when
    ``num_turns > 1``), ``wandb_config`` (its ``project``), ``eval_logger`` /
    ``eval_aggregator`` (accepted, not called), ``args``: a :class:`MAGRPOConfig`); see
    :class:`comlrl.trainers.base.CompatTrainer` and docs/compat.md. ``dataset_type``
    (CoMLRL 1.4.0-1.4.2's, removed in 1.4.3; a label for W&B) is accepted by keyword with a
    ``DeprecationWarning`` and not used.

    Raises:
        ValueError: missing or malformed arguments (named in the message).
        comlrl.algos.ConfigError: the translated config does not validate.
    """

    config_cls: type = MAGRPOConfig
    accepted_config = MAGRPOConfig
    algorithm_name = "MAGRPO"

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
        dataset_type: str | None = None,
    ) -> None:
        if dataset_type is not None:
            warnings.warn(
                f"{type(self).__name__}(dataset_type={dataset_type!r}) is an argument of "
                "CoMLRL 1.4.0-1.4.2 that 1.4.3 removed; it is not used here: drop it.",
                DeprecationWarning,
                stacklevel=2,
            )
        self._init_front(
            args=args,
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
            eval_logger=eval_logger,
            eval_aggregator=eval_aggregator,
        )

    def recipe_config(self, num_examples: int, has_eval: bool) -> dict[str, Any]:
        return group_baseline_config(self.args, self.num_agents, num_examples, has_eval)

    def build_recipe_trainer(
        self, config: dict[str, Any], data: list[dict[str, Any]], eval_rows: list[Any] | None
    ) -> Any:
        import comlrl.algos as algos

        # the comlrl.algos trainer of the same estimator (and name, for the defaults)
        trainer_cls = {
            "grpo": algos.MAGRPOTrainer,
            "rloo": algos.MARLOOTrainer,
            "remax": algos.MAReMaxTrainer,
            "reinforce": algos.MAREINFORCETrainer,
        }[config["estimator"]]
        return trainer_cls(
            recipe_agents(self.agents, self.tokenizers),
            algos.TrainConfig(**config),
            environment=self.env,
            dataset=data,
            reward_func=self.reward_func,
            eval_dataset=eval_rows,
        )
