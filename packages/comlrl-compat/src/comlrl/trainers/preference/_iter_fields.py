"""The iterative fields of CoMLRL 1.4.3's ``MADPOIterConfig`` / ``MARLHFIterConfig``
(:mod:`comlrl.trainers.preference.iterative` adds them to the MADPO and MARLHF configs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["_IterativeFields"]


@dataclass
class _IterativeFields:
    """The iterative fields of CoMLRL 1.4.3's ``MADPOIterConfig`` / ``MARLHFIterConfig``,
    with its defaults (what a round does: :mod:`comlrl.trainers._iterative`).

    Implemented: ``num_iterations``; ``preference_replay_mode`` (``current`` |
    ``nearest_k`` | ``all_history`` | ``lambda_decay``) with ``preference_replay_k``,
    ``preference_replay_lambda``, ``preference_replay_sample_size``;
    ``preference_replay_dir`` (each round's pairs on disk,
    :mod:`comlrl.algos.recipes.preference.iterative.replay_shards`); ``policy_checkpoint_dir``
    (the policy before round 0 and after each round, as ``initial/agent_<i>`` and
    ``iteration_XXXX/agent_<i>``); ``comparator_policy`` (``current`` | ``current_copy``
    | ``model`` | ``history`` | ``api``), ``comparator_model_name``,
    ``comparator_agents``, ``comparator_num_candidates``, ``comparator_history_k``,
    ``comparator_api_*`` (:mod:`comlrl.algos.recipes.preference.iterative.api_comparator`);
    ``comparator_generation_mode`` (``centralized`` only with
    ``collaboration_mode="centralized"``, where it is the default);
    ``log_reward_distribution`` (:mod:`comlrl.trainers.preference._reward_distribution`).
    ``comparator_devices`` raises :class:`UnsupportedFieldError`.
    """

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
