"""Evaluation: the training rollout, without an update, on held-out examples.

:func:`evaluate` runs :func:`comlrl.algos.rollout.tree.rollout` (multi-turn included) over an
evaluation set in batches, greedily (``top_k=1``) or sampled, and
:func:`summarize_rollouts` turns the rollouts into one row of numbers:

- ``reward_mean`` (turn 0) and per turn ``t`` ``turn_<t>/reward_mean``,
  ``turn_<t>/num_nodes``;
- for tasks whose reward infos carry a test verdict (the code suites of
  :mod:`comlrl.envs`: ``info["status"]``, ``"passed"``, ``"total"``; gsm8k:
  ``info["status"]``), with ``n`` joint actions per problem (``n = G`` in ``align`` mode):

  - ``pass@k``: the unbiased estimator of Chen et al. 2021 (:func:`pass_at_k`) over the
    turn-0 joint actions (the task as posed);
  - ``pass@k/final``: the same over the episodes each turn-0 joint action starts: one
    counts as passed when a joint action anywhere in its subtree passed (the team got
    there with the feedback of later turns);
  - ``turn_<t>/pass_rate``: the fraction of turn ``t``'s joint actions that passed;
  - ``solved_rate``: the fraction of problems with a passing joint action at any turn;
- on a task mixture (:mod:`comlrl.algos.rollout.mixture`), ``reward/<task>``: the mean
  turn-0 reward of each task's joint actions.
- for agents with tools, the tool metrics of
  :func:`~comlrl.algos.rollout.tool_metrics.tool_metrics` (calls per completion, error kinds,
  ``tool_error_fraction``).

Random streams: evaluation draws from its own streams, seeded from ``seed`` alone (the same
at every evaluation of a run, so successive evaluations differ only by the weights), and
leaves the agents' training streams and torch's global stream where they were.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from comlrl.algos.records import Rollout
from comlrl.algos.rollout.environment import Environment
from comlrl.algos.rollout.mixture import task_reward_sums
from comlrl.algos.rollout.tool_metrics import sum_tool_counts, tool_counts, tool_metrics
from comlrl.algos.rollout.tree import TreeSettings, rollout
from comlrl.core import SamplingParams

__all__ = [
    "pass_at_k",
    "joint_action_passed",
    "eval_sampling",
    "eval_streams",
    "summarize_rollouts",
    "evaluate",
]

#: Offset of the evaluation streams' seeds from the run's seed.
EVAL_SEED_OFFSET = 7_919


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from ``n`` samples of which ``c`` passed.

    Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1 (per
    problem): ``pass@k = 1 - C(n - c, k) / C(n, k)``, computed as the product
    ``1 - prod_{i = n-c+1}^{n} (1 - k / i)`` (their numerically stable form); average it
    over problems.

    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def joint_action_passed(info: Mapping[str, Any]) -> bool | None:
    """Whether a joint action's reward info says the task's tests all passed.

    ``True``/``False`` from ``info["status"] == "passed"`` (the sandbox verdict of the
    code suites, gsm8k's agreement verdict), else from ``passed == total > 0``; ``None``
    when the info carries no verdict (e.g. the writing tasks).
    """
    status = info.get("status")
    if isinstance(status, str):
        return status == "passed"
    passed, total = info.get("passed"), info.get("total")
    if isinstance(passed, int) and isinstance(total, int) and not isinstance(passed, bool):
        return total > 0 and passed == total
    return None


def eval_sampling(
    num_samples: int,
    max_new_tokens: int,
    *,
    greedy: bool,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
) -> SamplingParams:
    """Sampling settings of an evaluation: greedy is ``top_k=1`` (the argmax token).

    Raises:
        ValueError: ``greedy`` with ``num_samples > 1`` (``k`` copies of one completion).
    """
    if greedy and num_samples > 1:
        raise ValueError(
            f"greedy evaluation gives the same completion {num_samples} times; use "
            "num_samples=1 or sampled evaluation (eval_greedy=false) for pass@k with k > 1."
        )
    return SamplingParams(
        num_generations=num_samples,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=1.0 if greedy else top_p,
        top_k=1 if greedy else top_k,
    )


@contextlib.contextmanager
def eval_streams(agents: Sequence[Any], seed: int) -> Iterator[None]:
    """Give every agent a fresh evaluation generator and fork torch's global stream.

    On exit the agents get their training generators back and the global stream is
    where it was, so evaluating in the middle of a run does not change what it trains on.
    Models are put in eval mode (no dropout) and back.
    """
    saved = [getattr(a, "generator", None) for a in agents]
    modes = [getattr(getattr(a, "model", None), "training", None) for a in agents]
    cuda = (
        list(range(torch.cuda.device_count()))
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else []
    )
    try:
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(seed + EVAL_SEED_OFFSET)
            for i, agent in enumerate(agents):
                if saved[i] is not None:
                    gen = torch.Generator(device=saved[i].device)  # type: ignore[union-attr]
                    agent.generator = gen.manual_seed((seed + EVAL_SEED_OFFSET) * 1_000_003 + i)
                if modes[i] is not None:
                    agent.model.eval()
            yield
    finally:
        for agent, own, mode in zip(agents, saved, modes, strict=True):
            if own is not None:
                agent.generator = own
            if mode is not None:
                agent.model.train(mode)


def summarize_rollouts(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """One evaluation row from the rollouts of every batch (keys in the module docstring).

    ``pass@k`` keys are written for ``k = 1`` and ``k = n`` (the joint actions per
    problem) and only when every joint action's info carries a verdict.
    """
    out: dict[str, float] = {}
    rewards: dict[int, list[torch.Tensor]] = {}
    nodes: dict[int, int] = {}
    verdicts: dict[int, list[bool | None]] = {}
    first: list[list[bool | None]] = []  # per problem: turn-0 joint actions passed
    episode: list[list[bool]] = []  # per problem: any pass in each turn-0 joint action's subtree
    tools: list[dict[str, float] | None] = []
    for ro in rollouts:
        for turn in ro.turns:
            counts = [tool_counts(s) for s in turn.agents]
            tools = [sum_tool_counts(x) for x in itertools.zip_longest(tools, counts)]
        passed: list[list[bool | None]] = [
            [joint_action_passed(i) for i in turn.infos]
            if len(turn.infos) == turn.rewards.numel()
            else [None for _ in range(turn.rewards.numel())]
            for turn in ro.turns
        ]
        for t, turn in enumerate(ro.turns):
            rewards.setdefault(t, []).append(turn.rewards.reshape(-1))
            nodes[t] = nodes.get(t, 0) + turn.num_nodes
            verdicts.setdefault(t, []).extend(passed[t])
        # Bottom-up: sub[t][n * K + j] = passed here or anywhere below this joint action.
        sub: list[list[bool]] = [[]] * len(ro.turns)
        for t in range(len(ro.turns) - 1, -1, -1):
            turn, k = ro.turns[t], ro.turns[t].joint_index.shape[0]
            child = turn.child.reshape(-1).tolist()
            below = sub[t + 1] if t + 1 < len(ro.turns) else []
            sub[t] = [
                bool(passed[t][i])
                or (child[i] >= 0 and any(below[child[i] * k : (child[i] + 1) * k]))
                for i in range(len(child))
            ]
        k0 = ro.turns[0].joint_index.shape[0]
        for n in range(ro.turns[0].num_nodes):
            first.append(passed[0][n * k0 : (n + 1) * k0])
            episode.append(sub[0][n * k0 : (n + 1) * k0])
    out["num_problems"] = float(len(first))
    out["reward_mean"] = float(torch.cat(rewards[0]).mean())
    per_task: dict[str, list[float]] = {}
    for ro in rollouts:
        for name, (total, count) in (
            task_reward_sums(ro.turns[0].infos, ro.turns[0].rewards) or {}
        ).items():
            entry = per_task.setdefault(name, [0.0, 0.0])
            entry[0] += total
            entry[1] += count
    for name, (total, count) in sorted(per_task.items()):
        out[f"reward/{name}"] = total / count
    for t in sorted(rewards):
        r = torch.cat(rewards[t])
        out[f"turn_{t}/reward_mean"] = float(r.mean())
        out[f"turn_{t}/num_nodes"] = float(nodes[t])
    out.update(tool_metrics(tools))
    if any(v is None for vs in verdicts.values() for v in vs):
        return out
    n = len(first[0])
    for k in sorted({1, n}):
        out[f"pass@{k}"] = sum(pass_at_k(n, sum(map(bool, p)), k) for p in first) / len(first)
        out[f"pass@{k}/final"] = sum(pass_at_k(n, sum(e), k) for e in episode) / len(episode)
    for t in sorted(verdicts):
        out[f"turn_{t}/pass_rate"] = sum(map(bool, verdicts[t])) / len(verdicts[t])
    out["solved_rate"] = sum(any(e) for e in episode) / len(episode)
    return out


def evaluate(
    agents: Sequence[Any],
    env: Environment,
    dataset: Sequence[Mapping[str, Any]],
    params: SamplingParams,
    tree: TreeSettings | None = None,
    *,
    batch_size: int = 8,
    seed: int = 0,
    map_agents: Callable[[Callable[[int], Any], int], list[Any]] | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, float], list[Rollout]]:
    """Roll every example of ``dataset`` out once, without updating; summarize.

    Args:
        agents: the ``A`` agents (their training generators are left untouched).
        env: the task environment (prompts, reward, feedback).
        dataset: the evaluation examples, in order.
        params: e.g. :func:`eval_sampling`; ``G = params.num_generations`` samples per node.
        tree: turns, termination and branching, as in training (default: one turn).
        batch_size: examples per rollout call.
        seed: seed of the evaluation streams (same seed, same weights: same result).
        map_agents: how to run the agents (e.g. ``AgentPool.map``); default sequential.
        progress: called with the number of examples done after each batch (e.g. a
            progress bar's ``update``).

    Returns:
        ``(row, rollouts)``: :func:`summarize_rollouts`'s row plus ``time/eval_s``
        (seconds), and the rollouts themselves.

    Raises:
        ValueError: an empty ``dataset`` or ``batch_size < 1``.
        RewardFunctionError: as for :func:`~comlrl.algos.rollout.tree.rollout`.
    """
    if len(dataset) == 0:
        raise ValueError("the evaluation set is empty; check eval_split and eval_limit.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    t0 = time.perf_counter()
    extra: dict[str, Any] = {} if map_agents is None else {"map_agents": map_agents}
    branch_rng = random.Random(seed + EVAL_SEED_OFFSET)
    rollouts = []
    with eval_streams(agents, seed), torch.no_grad():
        for start in range(0, len(dataset), batch_size):
            batch = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
            rollouts.append(
                rollout(agents, batch, env, params, tree or TreeSettings(), rng=branch_rng, **extra)
            )
            if progress is not None:
                progress(len(batch))
    row = summarize_rollouts(rollouts)
    row["time/eval_s"] = time.perf_counter() - t0
    return row, rollouts
