"""CoMLRL 1.4.3's ``MADPOIterConfig`` / ``MADPOIterTrainer`` and ``MARLHFIterConfig`` /
``MARLHFIterTrainer`` (module path ``comlrl.trainers.preference.iterative``).

:class:`MADPOIterTrainer` runs ``comlrl.algos``' MADPO-Iter recipe
(:func:`comlrl.algos.train_madpo_iter`, as ``comlrl train algo=madpo_iter``): each of
``num_iterations`` rounds samples every training prompt's candidates from the current
policy and the comparator (``comparator_policy``), pairs current joint action ``k`` with
comparator joint action ``k`` (``pair_selection``, ``preference_pairs_per_sample``), keeps
them in the replay (``preference_replay_*``) and trains the round's pairs in
``num_train_epochs * ceil(N / train_batch_size)`` steps, each on its share of them.

:class:`MARLHFIterTrainer` is not implemented here (it raises
:class:`~comlrl.trainers.config_fields.UnsupportedTrainerError`); ``comlrl train
algo=marlhf_iter`` runs MARLHF-Iter.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

from comlrl.trainers.config_fields import UnsupportedFieldError, UnsupportedTrainerError
from comlrl.trainers.preference.madpo import MADPOConfig, MADPOTrainer, madpo_fields
from comlrl.trainers.preference.marlhf import MARLHFConfig
from comlrl.trainers.preference.recipe_run import PreferenceRecipeRun, loop_outputs

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
    """CoMLRL 1.4.3's ``MARLHFIterConfig`` (its fields and defaults, checked as
    :class:`MADPOIterConfig`); :class:`MARLHFIterTrainer` is not implemented here."""

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
            steps_per_round=steps,
            round_prompts=num_examples,
            comparator=a.comparator_policy,
            comparator_models=[a.comparator_model_name] if a.comparator_policy == "model" else None,
            comparator_num_candidates=a.comparator_num_candidates,
            comparator_history_k=int(a.comparator_history_k or 1),
            pair_selection=a.pair_selection,
            replay_mode=a.preference_replay_mode,
            replay_k=a.preference_replay_k if a.preference_replay_mode == "nearest_k" else None,
            replay_lambda=(
                a.preference_replay_lambda if a.preference_replay_mode == "lambda_decay" else None
            ),
            replay_sample_size=(
                a.preference_replay_sample_size if a.preference_replay_mode != "current" else None
            ),
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

    def build_recipe_trainer(
        self, config: dict[str, Any], data: list[dict[str, Any]], eval_rows: list[Any] | None
    ) -> Any:
        from comlrl.algos import (
            IterativeMADPOConfig,
            MADPOIterRun,
            build_rounds,
            madpo_iter_resume,
            train_madpo_iter,
        )
        from comlrl.algos import MADPOTrainer as Recipe
        from comlrl.core import SamplingParams
        from comlrl.trainers.base import recipe_agents

        outputs = loop_outputs(config)
        cfg = IterativeMADPOConfig.build(**config)
        trainer = Recipe(
            recipe_agents(self.agents, self.tokenizers),
            cfg,
            dataset=data,
            formatters=list(self.env.compat_formatters),
            reward_func=self.env.reward,
            eval_dataset=eval_rows if cfg.eval_every else None,
        )
        run = MADPOIterRun(
            trainer.run,
            build_rounds(
                cfg,
                trainer.run.agents,
                SamplingParams.from_config(cfg, cfg.num_candidates),
                pairs_per_prompt=cfg.pairs_per_prompt,
                num_rounds=int(self.args.num_iterations),
                seed=cfg.seed,
                load=_load_model,
            ),
        )
        return PreferenceRecipeRun(
            trainer,
            train=lambda: train_madpo_iter(run, **outputs),
            resume=lambda path: madpo_iter_resume(run, path, outputs["output_dir"]),
            output_dir=outputs["output_dir"],
        )


def _load_model(name: str) -> Any:
    """A comparator model by name (``comparator_model_name``)."""
    from comlrl.algos import load_model_and_tokenizer

    return load_model_and_tokenizer(name)[0]


def _refuse_untranslated(a: Any) -> None:
    """Raise :class:`UnsupportedFieldError` for an iterative setting left untranslated."""
    if a.collaboration_mode != "decentralized":
        raise UnsupportedFieldError(
            "MADPOIterConfig.collaboration_mode='centralized' is not supported here; use "
            "comlrl train algo=centralized_madpo_iter."
        )
    defaults = MADPOIterConfig.__dataclass_fields__
    for name in (
        "log_reward_distribution", "policy_checkpoint_dir", "comparator_agents",
        "comparator_devices", "comparator_api_max_n_per_request", "comparator_api_timeout",
        "comparator_api_headers", "comparator_api_key", "comparator_api_key_header",
        "comparator_api_key_prefix", "comparator_api_response_field",
        "comparator_api_extra_body", "comparator_generation_mode",
    ):  # fmt: skip
        if getattr(a, name) != defaults[name].default:
            raise UnsupportedFieldError(
                f"MADPOIterConfig.{name}={getattr(a, name)!r} is not supported by "
                f"comlrl.trainers; leave it at {defaults[name].default!r} (docs/compat.md)."
            )


class MARLHFIterTrainer:
    """CoMLRL 1.4.3's ``MARLHFIterTrainer``: not implemented by this package.

    Raises:
        UnsupportedTrainerError: always; ``comlrl train algo=marlhf_iter`` runs MARLHF-Iter.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise UnsupportedTrainerError(
            "MARLHFIterTrainer is not provided by comlrl.trainers; run MARLHF-Iter with "
            "`comlrl train algo=marlhf_iter` (see docs/compat.md)."
        )
