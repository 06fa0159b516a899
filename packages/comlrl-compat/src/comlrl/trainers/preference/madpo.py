"""CoMLRL 1.4.3's ``MADPOConfig`` / ``MADPOTrainer`` (module path
``comlrl.trainers.preference.madpo``), run by :class:`comlrl.algos.MADPOTrainer`.

1.4.3's MADPO is the ``comlrl.algos`` MADPO recipe with options of
:class:`comlrl.algos.MADPOConfig` (``comlrl train algo=madpo pair_source=initial
num_epochs=N reference_free=true`` runs the same): every training prompt's pairs built
once from the initial policy, ``num_train_epochs`` passes over them, ``train_batch_size``
pairs per step, the joint DPO loss (Rafailov et al. 2023, eq. 7, summed over agents) with
``log pi_ref = 0`` (``reference_kl_enabled=True``: against the frozen initial policy).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from comlrl.trainers.base import CompatTrainer, recipe_agents
from comlrl.trainers.config_fields import (
    UnsupportedFieldError,
    check_minimums,
    check_parallel_training,
    one_device,
)
from comlrl.trainers.preference.recipe_run import PreferenceRecipeRun
from comlrl.trainers.reinforce.magrpo import JOINT_MODES

__all__ = ["MADPOConfig", "MADPOTrainer", "madpo_fields"]


@dataclass
class MADPOConfig:
    """CoMLRL 1.4.3's ``MADPOConfig``: the same fields and defaults.

    Units as :class:`comlrl.trainers.MAGRPOConfig`. ``pair_selection``: ``reward_gap``
    (the ``preference_pairs_per_sample`` largest gaps of a prompt; None: every untied
    pair), ``random`` (a uniform draw of as many) or ``all`` (every untied pair).
    ``collaboration_mode="centralized"`` trains one joint actor on every role's output.
    Fields MADPO does not read (``advantage_*``, ``discount``, ``rollout_buffer_size``
    beyond the default ``train_batch_size``, ``use_environment_step``,
    ``environment_steps_per_pair``, ...) are accepted, as in 1.4.3.

    Raises:
        ValueError: a count below its minimum, ``num_turns != 1``, ``dpo_beta <= 0``, an
            unknown ``pair_selection``, ``joint_mode`` or ``collaboration_mode``.
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

    #: the ``pair_selection`` values this config takes
    pair_selections: ClassVar[tuple[str, ...]] = ("reward_gap", "random", "all")

    def __post_init__(self) -> None:
        check_minimums(
            self,
            {
                "num_train_epochs": 1, "num_agents": 1, "rollout_buffer_size": 1,
                "eval_batch_size": 1, "num_turns": 1, "logging_steps": 1,
                "preference_num_candidates": 2, "environment_steps_per_pair": 1,
                "preference_pairs_per_sample": 1, "train_batch_size": 1,
            },
        )  # fmt: skip
        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        if self.dpo_beta <= 0:
            raise ValueError(f"dpo_beta must be > 0, got {self.dpo_beta!r}")
        self.pair_selection = str(self.pair_selection or "reward_gap").strip().lower()
        if self.pair_selection not in self.pair_selections:
            raise ValueError(
                f"pair_selection={self.pair_selection!r}; use one of {self.pair_selections}"
            )
        if str(self.joint_mode).lower() not in JOINT_MODES:
            raise ValueError(f"joint_mode={self.joint_mode!r}; use 'aligned' or 'cross'")
        mode = str(self.collaboration_mode).strip().lower()
        if mode not in ("decentralized", "centralized"):
            raise ValueError(
                f"collaboration_mode={self.collaboration_mode!r}; use 'decentralized' or "
                "'centralized'"
            )
        self.collaboration_mode = mode
        check_parallel_training(self)
        self._check_turns()

    def _check_turns(self) -> None:
        if self.num_turns != 1:
            raise ValueError(
                f"num_turns={self.num_turns!r}: MADPO is single-turn, as in CoMLRL 1.4.3; "
                "set num_turns=1."
            )


def madpo_fields(args: Any, num_agents: int, has_eval: bool, trainer: str) -> dict[str, Any]:
    """The :class:`comlrl.algos.MADPOConfig` fields of a 1.4.3 preference config's
    sampling, pairing and DPO settings: 1.4.3's AdamW (weight decay 0.01, no clipping),
    ``eval_interval`` (examples) as ``eval_every`` (steps)."""
    k = int(args.preference_num_candidates)
    limit = args.preference_pairs_per_sample
    batch = int(args.train_batch_size or args.rollout_buffer_size)
    eval_on = has_eval and int(args.eval_interval) > 0 and int(args.eval_num_samples) > 0
    return {
        "num_agents": num_agents,
        "num_candidates": k,
        "max_new_tokens": int(args.max_new_tokens),
        "temperature": float(args.temperature),
        "top_p": float(args.top_p),
        "top_k": int(args.top_k or 0),
        "joint_mode": JOINT_MODES[str(args.joint_mode).lower()],
        "pairs_per_prompt": int(
            k * (k - 1) // 2 if limit is None or args.pair_selection == "all" else limit
        ),
        "beta": float(args.dpo_beta),
        "learning_rate": float(args.agent_learning_rate),
        "optimizer": "adamw",
        "weight_decay": 0.01,
        "max_grad_norm": None,
        "batch_size": batch,
        "eval_every": max(1, math.ceil(int(args.eval_interval) / batch)) if eval_on else 0,
        "eval_num_samples": 1,
        "eval_limit": int(args.eval_num_samples) if eval_on else None,
        "reference_free": not bool(args.reference_kl_enabled),
        "device": one_device(args, num_agents, trainer),
    }


class MADPOTrainer(CompatTrainer):
    """CoMLRL 1.4.3's ``MADPOTrainer`` (its arguments), run by
    :class:`comlrl.algos.MADPOTrainer` with 1.4.3's options (see the module docstring).

    Args:
        agent_model, agents, num_agents, tokenizer, model_config, train_dataset,
            eval_dataset, reward_func, reward_processor, formatters, wandb_config,
            eval_logger, eval_aggregator: as :class:`comlrl.trainers.MAGRPOTrainer`.
        external_transition: accepted only as None (MADPO is single-turn).
        args: a :class:`MADPOConfig`.
        centralized_comparator_adapter: with ``collaboration_mode="centralized"``, how the
            one joint actor is prompted for every role and how its answer splits into the
            roles' outputs (default :class:`comlrl.algos.TaggedRoles`); the run then has
            one agent, as ``comlrl train algo=centralized_madpo``.

    Raises:
        ValueError: missing or malformed arguments (1.4.3's messages).
        TypeError: ``args`` of another type, or an adapter without its two methods.
        comlrl.algos.ConfigError: the translated config does not validate.
    """

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
        cfg = args if args is not None else self.config_cls()
        if getattr(cfg, "collaboration_mode", None) == "centralized" and callable(reward_func):
            num_agents, formatters, reward_func = self._centralized(
                cfg, agents, tokenizer, num_agents, formatters, reward_func,
                reward_processor, centralized_comparator_adapter,
            )  # fmt: skip
            reward_processor = None  # applied by the roles' reward
        self._init_front(
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
            eval_logger=eval_logger,
            eval_aggregator=eval_aggregator,
            before_loading=self._check_single_turn(external_transition),
        )

    def _check_single_turn(self, transition: Any) -> Callable[[], None]:
        def check() -> None:
            if transition is not None:
                raise UnsupportedFieldError(
                    f"{type(self).__name__}(external_transition=...): MADPO is single-turn "
                    "here, as in CoMLRL 1.4.3; drop external_transition."
                )

        return check

    def _centralized(
        self,
        cfg: Any,
        agents: Any,
        tokenizer: Any,
        num_agents: int,
        formatters: Any,
        reward_func: Callable[..., Any],
        reward_processor: Any,
        adapter: Any,
    ) -> tuple[int, list[Any], Any]:
        """1.4.3's centralized checks, then ``(1, [joint prompt], joint reward)`` for the
        one joint actor (:func:`comlrl.algos.centralized_callbacks`).

        Raises:
            ValueError: other than one actor model or tokenizer, or ``num_agents`` not
                ``args.num_agents``.
        """
        from comlrl.algos import TaggedRoles, centralized_callbacks, check_role_format
        from comlrl.trainers.environment import CompatReward, build_formatters

        if agents is not None and not isinstance(agents, str) and len(agents) != 1:
            raise ValueError(
                "collaboration_mode='centralized' trains exactly one actor (the joint "
                f"policy); got {len(agents)} agents (pass agents=[model] or agent_model=)."
            )
        if isinstance(tokenizer, (list, tuple)) and len(tokenizer) != 1:
            raise ValueError(
                f"collaboration_mode='centralized' takes one actor tokenizer, got {len(tokenizer)}"
            )
        if num_agents != cfg.num_agents:
            raise ValueError(
                f"num_agents={num_agents} but args.num_agents={cfg.num_agents}; in centralized "
                "mode both are the role count and must match."
            )
        adapter = adapter if adapter is not None else TaggedRoles()
        check_role_format(adapter)
        self.centralized_comparator_adapter = adapter
        self.num_roles = num_agents
        roles = build_formatters(formatters, num_agents)
        role_reward = CompatReward(reward_func, num_agents, roles[0], reward_processor)
        prompt, reward = centralized_callbacks(
            lambda item: [f(item) for f in roles], role_reward, num_agents, adapter
        )
        return 1, [prompt], reward

    # --- the recipe --------------------------------------------------------------------
    def recipe_config(self, num_examples: int, has_eval: bool) -> dict[str, Any]:
        a = self.args
        fields = madpo_fields(a, self.num_agents, has_eval, type(self).__name__)
        fields.update(
            pair_selection="random" if a.pair_selection == "random" else "reward_gap",
            pair_source="initial",
            num_epochs=int(a.num_train_epochs),
        )
        return fields

    def build_recipe_trainer(
        self, config: dict[str, Any], data: list[dict[str, Any]], eval_rows: list[Any] | None
    ) -> Any:
        from comlrl.algos import MADPOConfig as RecipeConfig
        from comlrl.algos import MADPOTrainer as Recipe

        trainer = Recipe(
            recipe_agents(self.agents, self.tokenizers),
            RecipeConfig.build(**config),
            dataset=data,
            formatters=list(self.env.compat_formatters),
            reward_func=self.env.joint_reward,
            eval_dataset=eval_rows if config["eval_every"] else None,  # None: no held-out pairs
        )
        return PreferenceRecipeRun(trainer)

    @property
    def preference_pairs(self) -> list[Any]:
        """The pairs built from the initial policy (``IterPair`` records: prompts,
        chosen/rejected texts and token ids, rewards)."""
        return list(self.recipe_trainer.run.pairs or [])
