"""CoMLRL 1.4.3's ``MADPOIterConfig`` / ``MADPOIterTrainer`` and ``MARLHFIterConfig`` /
``MARLHFIterTrainer`` (module path ``comlrl.trainers.preference.iterative``).

:class:`MADPOIterTrainer` runs ``comlrl.algos``' MADPO-Iter recipe
(:class:`comlrl.algos.MADPOIterRecipe`, as ``comlrl train algo=madpo_iter``): each of
``num_iterations`` rounds samples every training prompt's candidates from the current
policy and the comparator (``comparator_policy``), pairs current joint action ``k`` with
comparator joint action ``k`` (``pair_selection``, ``preference_pairs_per_sample``), keeps
them in the replay (``preference_replay_*``) and trains the round's pairs in
``num_train_epochs * ceil(N / train_batch_size)`` steps, each on its share of them.

:class:`MARLHFIterTrainer` runs the MARLHF-Iter recipe
(:class:`comlrl.algos.MARLHFIterRecipe`, as ``comlrl train algo=marlhf_iter``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

from comlrl.trainers.base import CompatTrainer
from comlrl.trainers.config_fields import UnsupportedFieldError
from comlrl.trainers.preference.madpo import MADPOConfig, MADPOTrainer, madpo_fields
from comlrl.trainers.preference.marlhf import MARLHFConfig
from comlrl.trainers.preference.recipe_run import PreferenceRecipeRun

__all__ = ["MADPOIterConfig", "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer"]

#: 1.4.3's ``comparator_policy`` values; ``preference_replay_mode`` values
COMPARATORS = ("current", "current_copy", "model", "history", "api")
REPLAY_MODES = ("current", "nearest_k", "all_history", "lambda_decay")


@dataclasses.dataclass
class _IterativeFields:
    """The iterative fields of 1.4.3's ``MADPOIterConfig`` / ``MARLHFIterConfig`` and
    their defaults. Translated: ``num_iterations``, ``preference_replay_*``,
    ``comparator_policy``, ``comparator_model_name``, ``comparator_num_candidates``,
    ``comparator_history_k``, ``comparator_api_url`` / ``_format`` / ``_model`` /
    ``_key_env``; the others are accepted at their defaults only (see
    :meth:`MADPOIterTrainer.recipe_config`)."""

    num_iterations: int = 6
    preference_replay_mode: str = "current"
    preference_replay_k: int | None = None
    preference_replay_lambda: float | None = None
    preference_replay_sample_size: int | None = None
    preference_replay_dir: str | None = None
    log_reward_distribution: bool = False
    policy_checkpoint_dir: str | None = None
    comparator_policy: str = "current"
    comparator_generation_mode: str = "decentralized"
    comparator_centralized_agent_index: int = 0
    comparator_model_name: str | None = None
    comparator_agents: Sequence[Any] | None = None
    comparator_devices: str | Sequence[str] | None = None
    comparator_num_candidates: int | None = None
    comparator_history_k: int | None = None
    comparator_api_url: str | None = None
    comparator_api_format: str = "generic"
    comparator_api_model: str | None = None
    comparator_api_max_n_per_request: int | None = None
    comparator_api_timeout: float = 120.0
    comparator_api_headers: dict[str, str] | None = None
    comparator_api_key: str | None = None
    comparator_api_key_env: str | None = None
    comparator_api_key_header: str = "Authorization"
    comparator_api_key_prefix: str = "Bearer"
    comparator_api_response_field: str = "completions"
    comparator_api_extra_body: dict[str, Any] | None = None

    pair_selections: ClassVar[tuple[str, ...]] = (
        "comparator_reward",
        "reward_gap",
        "random",
        "all",
    )

    def _check_iterative(self) -> None:
        if self.num_iterations < 1:
            raise ValueError(f"num_iterations must be >= 1, got {self.num_iterations!r}")
        for name, allowed in (
            ("comparator_policy", COMPARATORS),
            ("preference_replay_mode", REPLAY_MODES),
        ):
            value = str(getattr(self, name)).strip().lower()
            if value not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r}; use one of {allowed}")
            setattr(self, name, value)


@dataclasses.dataclass
class MADPOIterConfig(_IterativeFields, MADPOConfig):
    """CoMLRL 1.4.3's ``MADPOIterConfig``: :class:`MADPOConfig`'s fields with 1.4.3's
    iterative defaults plus the iterative fields (see the module docstring).

    Raises:
        ValueError: as :class:`MADPOConfig`, ``num_iterations < 1``, an unknown
            ``comparator_policy`` or ``preference_replay_mode``.
    """

    num_train_epochs: int = 1
    preference_num_candidates: int = 20
    preference_pairs_per_sample: int | None = 4
    pair_selection: str = "comparator_reward"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_iterative()


@dataclasses.dataclass
class MARLHFIterConfig(_IterativeFields, MARLHFConfig):
    """CoMLRL 1.4.3's ``MARLHFIterConfig``: :class:`MARLHFConfig`'s fields with 1.4.3's
    iterative defaults, the iterative fields (checked as :class:`MADPOIterConfig`) and
    ``preference_scoring_reward`` (``task`` or ``reward_model``)."""

    num_train_epochs: int = 2
    preference_num_candidates: int = 20
    preference_pairs_per_sample: int | None = 4
    pair_selection: str = "comparator_reward"
    reward_num_train_epochs: int = 2
    preference_scoring_reward: str = "task"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_iterative()
        if self.preference_scoring_reward not in ("task", "reward_model"):
            raise ValueError(
                f"preference_scoring_reward={self.preference_scoring_reward!r}; use 'task' or "
                "'reward_model'"
            )


class MADPOIterTrainer(MADPOTrainer):
    """CoMLRL 1.4.3's ``MADPOIterTrainer`` (arguments of :class:`MADPOTrainer`, ``args`` a
    :class:`MADPOIterConfig`), run by ``comlrl.algos``' MADPO-Iter recipe (see the module
    docstring).

    Raises:
        UnsupportedFieldError: ``collaboration_mode="centralized"`` or an iterative field
            this package does not translate, set to other than its default.
    """

    config_cls: type = MADPOIterConfig
    algorithm_name = "MADPOIter"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        config = kwargs.get("args")
        if config is not None and not isinstance(config, MADPOIterConfig):
            raise TypeError(f"MADPOIterTrainer takes args=MADPOIterConfig(...), got {config!r}")
        _refuse_untranslated(config if config is not None else MADPOIterConfig())
        super().__init__(*args, **kwargs)

    def recipe_config(self, num_examples: int, has_eval: bool) -> dict[str, Any]:
        a = self.args
        fields = madpo_fields(a, self.num_agents, has_eval, type(self).__name__)
        steps = int(a.num_train_epochs) * math.ceil(num_examples / fields["batch_size"])
        k = a.preference_pairs_per_sample
        fields.update(
            pairs_per_prompt=int(k or a.preference_num_candidates),
            num_steps=steps * int(a.num_iterations),
            **section_fields(a, num_examples, steps),
        )
        return fields

    def build_recipe_trainer(
        self, config: dict[str, Any], data: list[dict[str, Any]], eval_rows: list[Any] | None
    ) -> Any:
        from comlrl.algos import MADPOConfig, MADPOIterRecipe
        from comlrl.trainers.base import recipe_agents

        cfg = MADPOConfig.build(**config)  # the rounds' flat keys go to its iterative section
        recipe = MADPOIterRecipe(
            recipe_agents(self.agents, self.tokenizers),
            cfg,
            dataset=data,
            formatters=list(self.env.compat_formatters),
            reward_func=self.env.joint_reward,
            eval_dataset=eval_rows if cfg.eval_every else None,
        )
        return PreferenceRecipeRun(recipe)


def section_fields(a: Any, num_examples: int, steps_per_round: int) -> dict[str, Any]:
    """The :class:`comlrl.algos.IterativeSection` fields of a 1.4.3 iterative config: a
    round is every one of the ``num_examples`` training prompts, then
    ``steps_per_round`` steps."""
    mode = a.preference_replay_mode
    fields = dict(
        steps_per_round=steps_per_round,
        round_prompts=num_examples,
        comparator=a.comparator_policy,
        comparator_models=[a.comparator_model_name] if a.comparator_policy == "model" else None,
        comparator_num_candidates=a.comparator_num_candidates,
        comparator_history_k=int(a.comparator_history_k or 1),
        pair_selection=a.pair_selection,
        replay_mode=mode,
        replay_k=a.preference_replay_k if mode == "nearest_k" else None,
        replay_lambda=a.preference_replay_lambda if mode == "lambda_decay" else None,
        replay_sample_size=a.preference_replay_sample_size if mode != "current" else None,
        replay_dir=a.preference_replay_dir,
    )
    if a.comparator_policy == "api":
        fields.update(
            comparator_api_url=a.comparator_api_url,
            comparator_api_format=a.comparator_api_format,
            comparator_api_model=a.comparator_api_model,
            comparator_api_key_env=a.comparator_api_key_env,
        )
    return fields


def _refuse_untranslated(a: Any) -> None:
    """Raise :class:`UnsupportedFieldError` for an iterative setting left untranslated."""
    if a.collaboration_mode != "decentralized":
        raise UnsupportedFieldError(
            f"{type(a).__name__}.collaboration_mode='centralized' is not supported here; use "
            "comlrl train algo=centralized_madpo_iter / centralized_marlhf_iter."
        )
    defaults = type(a).__dataclass_fields__
    for name in (
        "log_reward_distribution", "policy_checkpoint_dir", "comparator_agents",
        "comparator_devices", "comparator_api_max_n_per_request", "comparator_api_timeout",
        "comparator_api_headers", "comparator_api_key", "comparator_api_key_header",
        "comparator_api_key_prefix", "comparator_api_response_field",
        "comparator_api_extra_body", "comparator_generation_mode",
    ):  # fmt: skip
        if getattr(a, name) != defaults[name].default:
            raise UnsupportedFieldError(
                f"{type(a).__name__}.{name}={getattr(a, name)!r} is not supported by "
                f"comlrl.trainers; leave it at {defaults[name].default!r} (docs/compat.md)."
            )


class MARLHFIterTrainer(CompatTrainer):
    """CoMLRL 1.4.3's ``MARLHFIterTrainer`` (arguments of
    :class:`~comlrl.trainers.preference.marlhf.MARLHFTrainer`, ``args`` a
    :class:`MARLHFIterConfig`), run by ``comlrl.algos``' MARLHF-Iter recipe
    (:class:`comlrl.algos.MARLHFIterRecipe`, as ``comlrl train algo=marlhf_iter``): each of
    ``num_iterations`` rounds pairs every training prompt's current and comparator joint
    actions (scored by the task reward, or with ``preference_scoring_reward=
    "reward_model"`` by the previous round's reward model), refits the joint reward model
    from its initial weights on the round's pairs (Bradley-Terry), then takes
    ``num_train_epochs * ceil(N / train_batch_size)`` MAGRPO-family steps
    (``rl_algorithm``) on its reward; evaluation scores with the task reward.

    Raises:
        UnsupportedFieldError: ``rl_algorithm`` ``iac`` / ``maac``, critics, or a setting
            :class:`MADPOIterTrainer` or :class:`MARLHFTrainer` refuses.
    """

    config_cls: type = MARLHFIterConfig
    algorithm_name = "MARLHFIter"

    def __init__(
        self,
        agent_model: Any = None,
        agents: Sequence[Any] | None = None,
        num_agents: int = 2,
        *,
        centralized_comparator_adapter: Any = None,
        metrics_callback: Any = None,
        critic_model: Any = None,
        critics: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        from comlrl.trainers.preference.marlhf import RL_ALGORITHMS, refuse_unsupported

        cfg = kwargs.pop("args", None) or MARLHFIterConfig()

        def check() -> None:
            refuse_unsupported(
                cfg, kwargs.get("external_transition"), centralized_comparator_adapter,
                metrics_callback, iterative=True,
            )  # fmt: skip
            _refuse_untranslated(cfg)
            if cfg.rl_algorithm not in RL_ALGORITHMS or critic_model or critics:
                raise UnsupportedFieldError(
                    f"MARLHFIterConfig.rl_algorithm={cfg.rl_algorithm!r}: MARLHF-Iter trains "
                    f"with the MAGRPO family here ({sorted(RL_ALGORITHMS)}), without critics."
                )

        self._init_front(
            args=cfg, agent_model=agent_model, agents=agents, num_agents=num_agents,
            model_config=kwargs.pop("model_config", None), before_loading=check,
            **{k: kwargs.pop(k, None) for k in _FRONT_ARGUMENTS},
        )  # fmt: skip
        if kwargs:
            raise TypeError(f"MARLHFIterTrainer got unexpected arguments {sorted(kwargs)}")

    def recipe_config(self, num_examples: int, has_eval: bool) -> dict[str, Any]:
        from comlrl.trainers.reinforce.magrpo import group_baseline_config

        fields = group_baseline_config(self.args, self.num_agents, num_examples, has_eval)
        fields["num_steps"] *= int(self.args.num_iterations)
        return fields

    def build_recipe_trainer(
        self, config: dict[str, Any], data: list[dict[str, Any]], eval_rows: list[Any] | None
    ) -> Any:
        from comlrl.algos import DataStream, IterativeSection, MARLHFConfig, MARLHFIterRecipe
        from comlrl.trainers.base import recipe_agents
        from comlrl.trainers.preference.marlhf import load_reward_backbone, reward_model_config

        a = self.args
        steps = config["num_steps"] // int(a.num_iterations)
        section = IterativeSection.build(**section_fields(a, len(data), steps))
        backbone, tokenizer = load_reward_backbone(a, self.model_name, self.agents[0])
        k, pairs = int(a.preference_num_candidates), a.preference_pairs_per_sample
        fit = reward_model_config(a).model_copy(
            update={
                "num_generations": k,
                "pairs_per_prompt": int(pairs or k),
                "scoring_reward": a.preference_scoring_reward,
            }
        )
        recipe = MARLHFIterRecipe(
            recipe_agents(self.agents, self.tokenizers),
            MARLHFConfig(**{"eval_on_start": False, **config}, reward_model=fit, iterative=section),
            reward_backbone=backbone,
            reward_tokenizer=tokenizer,
            dataset=data,
            formatters=list(self.env.compat_formatters),
            reward_func=self.env.joint_reward,
            eval_dataset=eval_rows,
            prompts=DataStream(data, seed=int(config.get("seed", 0)) + 1, shuffle=False),
        )
        self.reward_model = recipe.reward_model
        return PreferenceRecipeRun(recipe, front=recipe.rl)


#: the :meth:`CompatTrainer._init_front` arguments MARLHFIterTrainer passes on as given
_FRONT_ARGUMENTS = (
    "tokenizer", "train_dataset", "eval_dataset", "reward_func", "reward_processor",
    "formatters", "external_transition", "wandb_config", "eval_logger", "eval_aggregator",
)  # fmt: skip
