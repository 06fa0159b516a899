"""CoMLRL 1.4.3's iterative preference arguments (``MADPOIter`` / ``MARLHFIter``) mapped
onto our recipe's rounds (:mod:`comlrl.algos.recipes.preference.iterative.replay`,
:mod:`~comlrl.algos.recipes.preference.iterative.comparator`,
:mod:`~comlrl.algos.recipes.preference.iterative.rounds`): 1.4.3's spellings and field rules
(:func:`validate_iterative_fields`), what is not implemented
(:func:`check_iterative_supported`), and :func:`rounds_from_args`. The method lives in
``comlrl.algos``; its names are re-exported here.

What a round does (the method, as 1.4.3 describes it):

One run is ``num_iterations`` rounds. A round:

1. **Candidates.** For every training prompt the current agents sample
   ``preference_num_candidates`` completions each and a *comparator policy* samples
   ``comparator_num_candidates`` (default: the same number); the ``k``-th completions of
   all agents form joint action ``k`` (aligned joint actions), scored by the task reward
   (MARLHFIter with ``preference_scoring_reward="reward_model"``: by the previous round's
   reward model once one exists).
2. **Pairs.** Current joint action ``k`` is compared with comparator joint action ``k``
   (``k < min(K, K')``); a tie makes no pair, otherwise the higher-rewarded one is chosen.
   :func:`select_comparison_pairs` orders the pairs by ``pair_selection`` and keeps
   ``preference_pairs_per_sample`` per prompt.
3. **Replay.** :class:`PreferenceReplay` keeps every round's pairs and picks the round's
   training pairs by ``preference_replay_mode``.
4. **Training** (by the trainer): DPO steps (MADPOIter), or a fresh reward model fitted
   on the pairs and then RL on its scores (MARLHFIter).

Comparator policies (``comparator_policy``): ``current`` and ``current_copy`` sample from
the current agents themselves at the start of the round (their own random streams, so
the two sets of candidates are independent draws); ``model`` samples from frozen models
(``comparator_model_name`` for every agent, or ``comparator_agents``: one name, path or
model per agent); ``history`` samples from the policy as it was ``comparator_history_k``
rounds ago (the initial policy while fewer rounds have passed), kept as CPU copies of
the weights; ``api`` asks a model served over HTTP (``comparator_api_*``,
:func:`api_config`). With ``collaboration_mode="centralized"`` the one joint actor's
comparator writes joint responses to the joint prompt (``comparator_generation_mode``
"centralized").
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.algos.recipes.preference.iterative.api_comparator import ApiComparatorClient
from comlrl.algos.recipes.preference.iterative.comparator import Comparator
from comlrl.algos.recipes.preference.iterative.replay import (
    PAIR_SELECTIONS,
    IterPair,
    PreferenceReplay,
    joint_pairs,
    lambda_decay_weights,
    round_pairs,
    row_tokens,
    select_comparison_pairs,
)
from comlrl.algos.recipes.preference.iterative.replay import pair_steps as steps
from comlrl.algos.recipes.preference.iterative.rounds import IterativeRounds
from comlrl.core import SamplingParams

__all__ = [
    "PAIR_SELECTIONS",
    "SCORING_REWARDS",
    "IterPair",
    "PreferenceReplay",
    "joint_pairs",
    "lambda_decay_weights",
    "round_pairs",
    "select_comparison_pairs",
    "steps",
    "validate_iterative_fields",
    "check_iterative_supported",
    "rounds_from_args",
]

#: 1.4.3's ``_madpo_pairs`` reads prompt/completion ids through this name
_row_tokens = row_tokens

#: accepted spellings (1.4.3's) -> the canonical value
_COMPARATOR_POLICIES = {
    **dict.fromkeys(("current", "self", "online"), "current"),
    **dict.fromkeys(
        ("current_copy", "copy", "online_copy", "current-offload", "current_offload"),
        "current_copy",
    ),
    **dict.fromkeys(("model", "external", "comparator", "reference", "ref"), "model"),
    **dict.fromkeys(("history", "checkpoint", "previous", "previous_iteration"), "history"),
    **dict.fromkeys(("api", "http", "endpoint"), "api"),
}
_GENERATION_MODES = {
    **dict.fromkeys(("decentralized", "decentralised", "multi_agent", "multi-agent"), "decentralized"),
    **dict.fromkeys(("centralized", "centralised", "single_agent", "single-agent"), "centralized"),
}  # fmt: skip
_REPLAY_MODES = {
    **dict.fromkeys(("current", "latest", "new"), "current"),
    **dict.fromkeys(("nearest_k", "recent_k", "last_k", "k"), "nearest_k"),
    "all_history": "all_history",
    **dict.fromkeys(("lambda", "lambda_decay", "td_lambda", "td-lambda"), "lambda_decay"),
}
SCORING_REWARDS = {
    **dict.fromkeys(("task", "oracle", "environment", "env"), "task"),
    **dict.fromkeys(("reward_model", "model", "learned"), "reward_model"),
}


def _canonical(table: Mapping[str, str], field: str, value: Any, default: str) -> str:
    key = str(value or default).strip().lower()
    if key not in table:
        raise ValueError(f"{field}={value!r}; use one of {sorted(set(table.values()))}")
    return table[key]


def _positive_or_none(args: Any, name: str) -> None:
    value = getattr(args, name)
    if value is not None:
        if int(value) < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {value!r}")
        setattr(args, name, int(value))


def validate_iterative_fields(args: Any) -> None:
    """Normalise and check the iterative fields of a ``MADPOIterConfig`` /
    ``MARLHFIterConfig`` in place (1.4.3's aliases and rules).

    Raises:
        ValueError: naming the bad field and value: ``num_iterations < 1``, an unknown
            mode or comparator, a replay or comparator field set for a mode that does not
            read it, or a missing one a mode needs.
    """
    if int(args.num_iterations) < 1:
        raise ValueError(f"num_iterations must be >= 1, got {args.num_iterations!r}")
    mode = _canonical(
        _REPLAY_MODES, "preference_replay_mode", args.preference_replay_mode, "current"
    )
    args.preference_replay_mode = mode
    k, lam, size = (
        args.preference_replay_k,
        args.preference_replay_lambda,
        args.preference_replay_sample_size,
    )
    if mode == "current":
        if k not in (None, 1):
            raise ValueError(f"preference_replay_k={k!r} needs preference_replay_mode='nearest_k'")
        if size is not None:
            raise ValueError(
                f"preference_replay_sample_size={size!r} is read by the replay modes "
                "'nearest_k', 'all_history' and 'lambda_decay' only; set it to None"
            )
    elif mode == "nearest_k":
        if k is None or int(k) < 1:
            raise ValueError(
                f"preference_replay_mode='nearest_k' needs preference_replay_k >= 1, got {k!r}"
            )
        args.preference_replay_k = int(k)
    elif k is not None:
        raise ValueError(f"preference_replay_k={k!r} needs preference_replay_mode='nearest_k'")
    if mode == "lambda_decay":
        if lam is None or not 0.0 <= float(lam) <= 1.0:
            raise ValueError(
                f"preference_replay_mode='lambda_decay' needs preference_replay_lambda in [0, 1], got {lam!r}"
            )
        args.preference_replay_lambda = float(lam)
    elif lam is not None:
        raise ValueError(
            f"preference_replay_lambda={lam!r} needs preference_replay_mode='lambda_decay'"
        )
    if mode != "current":
        _positive_or_none(args, "preference_replay_sample_size")

    policy = _canonical(
        _COMPARATOR_POLICIES, "comparator_policy", args.comparator_policy, "current"
    )
    args.comparator_policy = policy
    args.comparator_generation_mode = _canonical(
        _GENERATION_MODES,
        "comparator_generation_mode",
        args.comparator_generation_mode,
        "decentralized",
    )
    if args.comparator_generation_mode == "centralized":
        index = int(args.comparator_centralized_agent_index)
        if not 0 <= index < int(args.num_agents):
            raise ValueError(
                f"comparator_centralized_agent_index={index} must be in [0, num_agents={args.num_agents})"
            )
    _positive_or_none(args, "comparator_num_candidates")
    _positive_or_none(args, "comparator_api_max_n_per_request")
    named = args.comparator_model_name is not None or args.comparator_agents is not None
    if policy == "model" and not named:
        raise ValueError(
            "comparator_policy='model' needs comparator_model_name or comparator_agents"
        )
    if policy != "model" and named:
        raise ValueError(
            "comparator_model_name / comparator_agents are read by comparator_policy='model' "
            f"only (comparator_policy={policy!r}); set them to None"
        )
    if policy == "history":
        history_k = 1 if args.comparator_history_k is None else int(args.comparator_history_k)
        if history_k < 1:
            raise ValueError(
                f"comparator_history_k must be >= 1, got {args.comparator_history_k!r}"
            )
        args.comparator_history_k = history_k
    elif args.comparator_history_k is not None:
        raise ValueError(
            f"comparator_history_k={args.comparator_history_k!r} needs comparator_policy='history'"
        )
    if policy == "api" and not args.comparator_api_url:
        raise ValueError("comparator_policy='api' needs comparator_api_url")  # fmt: skip
    if policy == "api":
        api_config(args)  # raises ValueError naming a bad comparator_api_* value


def api_config(args: Any) -> Any:
    """The :class:`~comlrl.algos.recipes.preference.iterative.api_comparator.ApiComparatorConfig` of
    1.4.3's ``comparator_api_*`` fields.

    Raises:
        ValueError: as the config (an empty url, an unknown format, a bad timeout).
    """
    from comlrl.algos.recipes.preference.iterative.api_comparator import ApiComparatorConfig

    return ApiComparatorConfig(
        url=str(args.comparator_api_url or ""),
        format=str(args.comparator_api_format or "generic"),
        model=args.comparator_api_model,
        headers=args.comparator_api_headers,
        api_key=args.comparator_api_key,
        api_key_env=args.comparator_api_key_env,
        key_header=args.comparator_api_key_header,
        key_prefix=args.comparator_api_key_prefix,
        response_field=args.comparator_api_response_field,
        extra_body=args.comparator_api_extra_body,
        timeout=float(args.comparator_api_timeout),
        max_n_per_request=args.comparator_api_max_n_per_request,
    )


def check_iterative_supported(args: Any) -> None:
    """Raise :class:`~comlrl.trainers._base.UnsupportedFieldError` (naming the field) for
    the iterative settings this package does not implement; called before any model loads."""
    from comlrl.trainers._base import JOINT_MODES, _reject

    centralized = getattr(args, "collaboration_mode", "decentralized") == "centralized"
    _reject(
        args,
        "comparator_generation_mode",
        args.comparator_generation_mode == "decentralized" or centralized,
        "with decentralized agents the comparator samples each agent's completion from that "
        "agent's own prompt (a centralized comparator is built only for "
        "collaboration_mode='centralized', whose one joint actor it compares); set "
        "comparator_generation_mode='decentralized'.",
    )
    _reject(
        args,
        "comparator_devices",
        args.comparator_devices is None,
        "comparator models share the agents' device; set it to None.",
    )
    _reject(
        args,
        "joint_mode",
        JOINT_MODES[str(args.joint_mode).lower()] == "align",
        "current and comparator joint actions are compared index by index (aligned), as in "
        "1.4.3; set joint_mode='aligned'.",
    )
    _reject(args, "num_turns", int(args.num_turns) == 1, "iterative preference training is "
            "single-turn; set num_turns=1.")  # fmt: skip


def rounds_from_args(
    args: Any,
    agents: Sequence[Any],
    model_kwargs: Mapping[str, Any],
    seed: int,
    distribution: Any = None,
) -> IterativeRounds:
    """The rounds of a validated ``MADPOIterConfig`` / ``MARLHFIterConfig``: its comparator
    (``comparator_agents`` or ``comparator_model_name``, loaded with ``from_pretrained(name,
    **model_kwargs)``), replay (``preference_replay_*``), candidates
    (``preference_num_candidates``, ``comparator_num_candidates``), ``pair_selection``
    and ``preference_pairs_per_sample``; seeds as 1.4.3's trainers derived them. With a
    ``distribution`` (:class:`~comlrl.trainers.preference._reward_distribution.RewardDistributionLog`)
    each round also charts its rewards."""

    def load(name: str) -> Any:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(name, **dict(model_kwargs))

    a = args
    k = int(a.preference_num_candidates)
    params = [SamplingParams.from_config(a, n) for n in (k, int(a.comparator_num_candidates or k))]
    sources = a.comparator_agents if a.comparator_agents is not None else a.comparator_model_name
    comparator = Comparator(
        a.comparator_policy,
        agents,
        sources=sources if a.comparator_policy == "model" else None,
        load=load,
        history_k=int(a.comparator_history_k or 1),
        num_rounds=int(a.num_iterations),
        seed=seed + 7919,
        api=ApiComparatorClient(api_config(a)) if a.comparator_policy == "api" else None,
    )
    replay = PreferenceReplay(
        a.preference_replay_mode,
        a.preference_replay_k,
        a.preference_replay_lambda,
        a.preference_replay_sample_size,
        random.Random(seed + 1),
        shard_dir=a.preference_replay_dir,
    )
    settings: dict[str, Any] = {
        "sampling": params[0],
        "comparator_sampling": params[1],
        "pair_selection": a.pair_selection,
        "pairs_per_prompt": a.preference_pairs_per_sample,
        "seed": seed,
    }
    if distribution is not None:  # log_reward_distribution=True: 1.4.3's histograms
        from comlrl.trainers.preference._reward_distribution import ChartedRounds

        return ChartedRounds(comparator, replay, distribution=distribution, **settings)
    return IterativeRounds(comparator, replay, **settings)
