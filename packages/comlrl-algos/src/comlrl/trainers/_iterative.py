"""Iterative preference refresh for CoMLRL 1.4.3's ``MADPOIter`` / ``MARLHFIter``.

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
the weights.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

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
#: pair orderings of the iterative trainers (1.4.3's ``_allowed_pair_selection_modes``)
PAIR_SELECTIONS = ("reward_gap", "all", "random", "comparator_reward")


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


def check_iterative_supported(args: Any) -> None:
    """Raise :class:`~comlrl.trainers._base.UnsupportedFieldError` (naming the field) for
    the iterative settings this package does not implement; called before any model loads."""
    from comlrl.trainers._base import JOINT_MODES, _reject

    _reject(
        args,
        "comparator_policy",
        args.comparator_policy != "api",
        "no HTTP comparator here; use 'current', 'current_copy', 'model' or 'history'.",
    )
    _reject(
        args,
        "comparator_generation_mode",
        args.comparator_generation_mode == "decentralized",
        "the comparator samples each agent's completion from that agent's own prompt; set "
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
        "preference_replay_dir",
        args.preference_replay_dir is None,
        "replayed pairs are kept in memory (no 1.4.3 JSONL shards); set it to None.",
    )
    _reject(
        args,
        "log_reward_distribution",
        not args.log_reward_distribution,
        "no reward-histogram files; read the per-round rows train() returns. Set it to False.",
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


# --------------------------------------------------------------------------- pairs


@dataclass(frozen=True)
class IterPair:
    """One (chosen, rejected) joint-action pair of one prompt, from one round.

    Attributes:
        round: the 0-based round that sampled it.
        example: the task example.
        prompts: ``A`` prompt texts.
        chosen, rejected: ``A`` completion texts each.
        prompt_ids: ``A`` lists of prompt token ids (as the agents saw them).
        chosen_ids, rejected_ids: ``A`` lists of completion token ids (as sampled,
            through the EOS token when one was emitted).
        chosen_reward, rejected_reward: the joint rewards that ordered them (task units,
            after ``reward_processor``; or reward-model scores).
        chosen_source, rejected_source: ``"current"`` or ``"comparator"``.
    """

    round: int
    example: Mapping[str, Any]
    prompts: tuple[str, ...]
    chosen: tuple[str, ...]
    rejected: tuple[str, ...]
    prompt_ids: tuple[tuple[int, ...], ...]
    chosen_ids: tuple[tuple[int, ...], ...]
    rejected_ids: tuple[tuple[int, ...], ...]
    chosen_reward: float
    rejected_reward: float
    chosen_source: str
    rejected_source: str


def select_comparison_pairs(
    current: Sequence[float],
    comparator: Sequence[float],
    mode: str,
    limit: int | None,
    rng: random.Random,
) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """Pair current joint action ``k`` with comparator joint action ``k`` for one prompt.

    Args:
        current: ``[K]`` rewards of the current policy's joint actions.
        comparator: ``[K']`` rewards of the comparator's.
        mode: ``comparator_reward`` (highest comparator reward first, then largest gap),
            ``reward_gap`` (largest ``|gap|`` first), ``random`` (shuffled with ``rng``),
            ``all`` (index order, no ``limit``).
        limit: pairs kept (``None``: all).
        rng: the stream ``random`` shuffles with.

    Returns:
        ``((winner_source, k), (loser_source, k))`` tuples; ties (equal rewards) give none.

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in PAIR_SELECTIONS:
        raise ValueError(f"pair_selection={mode!r}; use one of {PAIR_SELECTIONS}")
    found = []
    for k in range(min(len(current), len(comparator))):
        gap = float(current[k]) - float(comparator[k])
        if gap != 0:
            ends = (("current", k), ("comparator", k))
            win, lose = ends if gap > 0 else ends[::-1]
            found.append((abs(gap), float(comparator[k]), k, win, lose))
    if mode == "random":
        rng.shuffle(found)
    elif mode == "comparator_reward":
        found.sort(key=lambda f: (f[1], f[0]), reverse=True)
    elif mode == "reward_gap":
        found.sort(key=lambda f: f[0], reverse=True)
    if mode != "all" and limit is not None:
        found = found[:limit]
    return [(f[3], f[4]) for f in found]


def lambda_decay_weights(num_rounds: int, lam: float) -> list[float]:
    """Sampling weights of ``num_rounds`` stored rounds, oldest first: the newest round has
    weight proportional to ``(1 - lam)``, each older one ``lam`` times the next (finite
    TD(lambda)-style geometric weights, normalised to sum 1; ``lam = 1``: uniform;
    ``lam = 0``: the newest round only)."""
    if num_rounds < 1:
        return []
    if lam == 1.0:
        return [1.0 / num_rounds] * num_rounds
    newest_first = [(1.0 - lam) * lam**age for age in range(num_rounds)]
    total = sum(newest_first)
    return [w / total for w in reversed(newest_first)]


class PreferenceReplay:
    """Every round's pairs, and the choice of a round's training pairs
    (``preference_replay_mode``; 1.4.3's rules, kept in memory).

    - ``current``: this round's pairs, as generated.
    - ``nearest_k``: ``sample_size`` pairs drawn from the last ``k`` rounds (this one
      included), each draw picking a round uniformly among those with pairs.
    - ``all_history``: the same over every round so far.
    - ``lambda_decay``: the same over every round, rounds weighted by
      :func:`lambda_decay_weights`.

    ``sample_size`` defaults to this round's pair count (the last non-empty round's when
    this round has none). Within a round, ``c`` draws take ``c`` distinct pairs (whole
    shuffled passes first when ``c`` exceeds the round's pairs). The result is shuffled.

    Args:
        mode, k, lam, sample_size: the ``preference_replay_*`` fields.
        rng: the random stream of every draw.
    """

    def __init__(
        self,
        mode: str,
        k: int | None,
        lam: float | None,
        sample_size: int | None,
        rng: random.Random,
    ) -> None:
        self.mode, self.k, self.lam, self.sample_size, self.rng = mode, k, lam, sample_size, rng
        self.rounds: list[list[IterPair]] = []

    def add_and_select(self, pairs: Sequence[IterPair]) -> list[IterPair]:
        """Store this round's ``pairs`` and return the round's training pairs."""
        self.rounds.append(list(pairs))
        if self.mode == "current":
            return list(pairs)
        pool = self.rounds[-int(self.k or 1) :] if self.mode == "nearest_k" else self.rounds
        weights = (
            lambda_decay_weights(len(pool), float(self.lam or 0.0))
            if self.mode == "lambda_decay"
            else [1.0] * len(pool)
        )
        size = self.sample_size
        if size is None:
            size = next((len(r) for r in reversed(self.rounds) if r), 0)
        eligible = [i for i, r in enumerate(pool) if r and weights[i] > 0]
        if size <= 0 or not eligible:
            return []
        draws = self.rng.choices(eligible, weights=[weights[i] for i in eligible], k=size)
        picked: list[IterPair] = []
        for i in eligible:
            count, rows = draws.count(i), pool[i]
            while count >= len(rows):
                picked.extend(self.rng.sample(rows, len(rows)))
                count -= len(rows)
            picked.extend(self.rng.sample(rows, count))
        self.rng.shuffle(picked)
        return picked


def _row_tokens(batch: Any, row: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = batch.completion_mask.shape[1]
    start = batch.input_ids.shape[1] - width
    ids, attn = batch.input_ids[row].cpu(), batch.attention_mask[row].cpu()
    prompt = ids[:start][attn[:start].bool()]
    completion = ids[start:][batch.completion_mask[row].cpu()]
    return tuple(int(t) for t in prompt), tuple(int(t) for t in completion)


def round_pairs(
    current: Any,
    comparator: Any,
    *,
    round_index: int,
    mode: str,
    limit: int | None,
    rng: random.Random,
) -> tuple[list[IterPair], dict[str, float]]:
    """The pairs of one batch of prompts: current rollout vs comparator rollout (both
    single-turn, aligned joint actions, the same ``N`` examples in the same order).

    Returns:
        ``(pairs, stats)``; ``stats``: ``current_reward_mean`` and
        ``comparator_reward_mean`` over the ``[N, K]`` / ``[N, K']`` rewards.
    """
    cur, cmp = current.turns[0], comparator.turns[0]
    sides = {"current": cur, "comparator": cmp}
    pairs: list[IterPair] = []
    for n in range(cur.rewards.shape[0]):
        chosen_rewards = {s: t.rewards[n].tolist() for s, t in sides.items()}
        for win, lose in select_comparison_pairs(
            chosen_rewards["current"], chosen_rewards["comparator"], mode, limit, rng
        ):
            texts, tokens = [], []
            for source, k in (win, lose):
                turn = sides[source]
                agents = turn.agents
                picks = [int(turn.joint_index[k, a]) for a in range(len(agents))]
                texts.append(
                    tuple(s.completions[n][j].text for s, j in zip(agents, picks, strict=True))
                )
                g = [s.batch.group_size for s in agents]
                tokens.append(
                    [_row_tokens(s.batch, n * g[a] + picks[a]) for a, s in enumerate(agents)]
                )
            pairs.append(
                IterPair(
                    round=round_index,
                    example=current.examples[int(cur.example_index[n])],
                    prompts=tuple(s.prompts[n] for s in cur.agents),
                    chosen=texts[0],
                    rejected=texts[1],
                    prompt_ids=tuple(p for p, _ in tokens[0]),
                    chosen_ids=tuple(c for _, c in tokens[0]),
                    rejected_ids=tuple(c for _, c in tokens[1]),
                    chosen_reward=float(chosen_rewards[win[0]][win[1]]),
                    rejected_reward=float(chosen_rewards[lose[0]][lose[1]]),
                    chosen_source=win[0],
                    rejected_source=lose[0],
                )
            )
    stats = {
        "current_reward_mean": float(cur.rewards.mean()),
        "comparator_reward_mean": float(cmp.rewards.mean()),
    }
    return pairs, stats


def joint_pairs(pairs: Sequence[IterPair], pad_ids: Sequence[int], device: Any = "cpu") -> Any:
    """``P`` :class:`IterPair` s as one :class:`~comlrl.algos.recipes.preference.recipe.JointPreferencePairs`
    (per agent a :class:`~comlrl.algos.records.PolicyBatch` of ``2P`` rows, group size 2:
    chosen then rejected; prompts left-padded, completions right-padded with
    ``pad_ids[a]``), for :func:`~comlrl.algos.recipes.preference.recipe.madpo_update` and the
    reward model's Bradley-Terry fit.

    Raises:
        ValueError: no pairs.
    """
    from comlrl.algos.recipes.preference.recipe import JointPreferencePairs
    from comlrl.algos.rollout.sampling.collate import pack_token_rows

    if not pairs:
        raise ValueError("joint_pairs needs at least one pair, got 0")
    batches = tuple(
        pack_token_rows(
            [p.prompt_ids[a] for p in pairs],
            [ids for p in pairs for ids in (p.chosen_ids[a], p.rejected_ids[a])],
            group_size=2,
            pad_token_id=int(pad),
            device=device,
        )
        for a, pad in enumerate(pad_ids)
    )
    return JointPreferencePairs(
        examples=tuple(p.example for p in pairs),
        prompts=tuple(p.prompts for p in pairs),
        chosen=tuple(p.chosen for p in pairs),
        rejected=tuple(p.rejected for p in pairs),
        chosen_reward=torch.tensor([p.chosen_reward for p in pairs], dtype=torch.float32),
        rejected_reward=torch.tensor([p.rejected_reward for p in pairs], dtype=torch.float32),
        batches=batches,
    )


# --------------------------------------------------------------------------- comparator


class Comparator:
    """The comparator policy's agents for each round (see the module docstring).

    Args:
        args: the iterative config (``comparator_*`` fields, ``num_iterations``).
        agents: the ``A`` current :class:`~comlrl.algos.rollout.agent.HFAgent` s (trained).
        model_kwargs: ``from_pretrained`` keyword arguments for ``comparator_policy="model"``
            names (the trainer's ``model_config``).
        seed: base seed of the comparator agents' sampling streams.
    """

    def __init__(
        self, args: Any, agents: Sequence[Any], model_kwargs: Mapping[str, Any], seed: int
    ) -> None:
        self.policy = args.comparator_policy
        self.history_k = int(args.comparator_history_k or 1)
        self.sources = args.comparator_agents if args.comparator_agents is not None else None
        self.model_name = args.comparator_model_name
        self.agents = list(agents)
        self.model_kwargs = dict(model_kwargs)
        self.seed = seed
        self.num_rounds = int(args.num_iterations)
        #: the snapshot index each round's history comparator used (for logs and tests)
        self.used: list[int] = []
        self._frozen: list[Any] | None = None
        #: round index -> per-agent CPU state dicts (history); index 0 = the initial policy
        self.snapshots: dict[int, list[dict[str, torch.Tensor]]] = {}

    def _wrap(self, models: Sequence[Any]) -> list[Any]:
        from comlrl.algos.rollout.agent import HFAgent

        wrapped = []
        for a, (model, agent) in enumerate(zip(models, self.agents, strict=True)):
            model.to(next(agent.model.parameters()).device).eval().requires_grad_(False)
            hf = HFAgent(
                model,
                agent.tokenizer,
                name=f"comparator_{a}",
                prompt_format=getattr(agent, "prompt_format", "raw"),
            )
            hf.seed(self.seed * 1_000_003 + a)
            wrapped.append(hf)
        return wrapped

    def _load_models(self) -> list[Any]:
        from transformers import AutoModelForCausalLM

        count = len(self.agents)
        if self.sources is not None:
            sources = [self.sources] if isinstance(self.sources, str) else list(self.sources)
            if len(sources) not in (1, count):
                raise ValueError(
                    f"comparator_agents has {len(sources)} entries for {count} agents; give one "
                    "or one per agent"
                )
            sources = sources * count if len(sources) == 1 else sources
        else:
            sources = [self.model_name] * count
        by_name: dict[str, Any] = {}  # one frozen copy per distinct name, shared by agents
        models = []
        for source in sources:
            if isinstance(source, str):
                if source not in by_name:
                    by_name[source] = AutoModelForCausalLM.from_pretrained(
                        source, **self.model_kwargs
                    )
                models.append(by_name[source])
            else:
                models.append(source)
        return models

    def start(self) -> None:
        """Before round 0: keep the initial policy (history)."""
        if self.policy == "history" and self.history_k > 1:
            self.snapshots[0] = self._state()

    def _state(self) -> list[dict[str, torch.Tensor]]:
        return [
            {k: v.detach().to("cpu", copy=True) for k, v in a.model.state_dict().items()}
            for a in self.agents
        ]

    def snapshot_index(self, round_index: int) -> int:
        """The snapshot the history comparator uses in round ``round_index``: the policy
        after round ``round_index - comparator_history_k`` (1.4.3's ``iteration_XXXX``
        checkpoint), i.e. snapshot ``max(0, round_index - k + 1)``; ``k = 1`` is the
        current policy."""
        return max(0, round_index - self.history_k + 1)

    def agents_for(self, round_index: int) -> list[Any]:
        """The comparator agents of round ``round_index`` (called at the round's start)."""
        if self.policy in ("current", "current_copy"):
            return self.agents
        if self.policy == "model":
            if self._frozen is None:
                self._frozen = self._wrap(self._load_models())
            return self._frozen
        index = self.snapshot_index(round_index)
        self.used.append(index)
        if index == round_index:  # the snapshot is the current policy itself
            return self.agents
        if self._frozen is None:
            self._frozen = self._wrap([copy.deepcopy(a.model) for a in self.agents])
        for hf, state in zip(self._frozen, self.snapshots[index], strict=True):
            hf.model.load_state_dict(state)
        return self._frozen

    def finish_round(self, round_index: int) -> None:
        """After round ``round_index``'s update: snapshot the policy (history) and drop the
        snapshots no later round reads."""
        if self.policy != "history":
            return
        nxt = round_index + 1
        keep_from = self.snapshot_index(nxt)
        if nxt + self.history_k - 1 < self.num_rounds and keep_from < nxt:
            self.snapshots[nxt] = self._state()  # round nxt + k - 1 reads it
        for index in [i for i in self.snapshots if i < keep_from]:
            del self.snapshots[index]


def steps(num_items: int, batch: int, epochs: int) -> int:
    """Optimizer steps of ``epochs`` passes over ``num_items`` in batches of ``batch``."""
    return epochs * math.ceil(num_items / batch) if num_items else 0
