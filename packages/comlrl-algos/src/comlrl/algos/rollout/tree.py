"""Sample, score and expand a batch of examples into a :class:`~comlrl.algos.records.Rollout`.

:func:`rollout` is the first stage of every on-policy recipe. Per turn it makes one
batched sampling call per agent over all nodes of that turn (every example, every open
branch; agents that are LoRA adapters of one base share one call), scores every joint action with one batched reward call, and asks the environment
for the next prompts of the joint actions whose episode goes on. The tree is expanded
breadth-first; returns are computed at the end by
:func:`comlrl.estimators.returns.tree_returns`. Nothing is left on the agents or the caller:
everything is in the returned record.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
from comlrl.algos.records import AgentSamples, Rollout, TurnRollout, flat_texts
from comlrl.algos.rollout.environment import Branch, Environment
from comlrl.algos.rollout.sampling.collate import collate_completions
from comlrl.algos.rollout.shared_base import sample_together, sampling_units
from comlrl.algos.rollout.tool_calls import sample_with_tools
from comlrl.algos.rollout.toolbox import ToolBox
from comlrl.core import Agent, Feedback, JointAction, SamplingParams, check_rewards
from comlrl.core.prompts import Prompt, prompt_text
from comlrl.estimators.joint import joint_action_indices
from comlrl.estimators.returns import tree_returns

__all__ = ["TreeSettings", "derive_seed", "rollout", "sample_agent"]

T = TypeVar("T")


@dataclass(frozen=True)
class TreeSettings:
    """The shape of a multi-turn rollout tree.

    Attributes:
        num_turns: ``T``, the most turns an episode runs (1 = single-turn).
        gamma: discount of later turns' rewards in the returns, in ``[0, 1]``.
        joint_mode: ``"align"`` (``K = G`` joint actions per node) or ``"cross"``
            (``K = G**A``).
        early_termination_threshold: a joint action whose reward is above this ends its
            episode (``termination_scope="joint_action"``), or a node whose mean reward is
            above it expands no child (``"node"``, CoMLRL 1.4.3's rule). ``None``: only
            the task's ``Feedback.done`` and the turn limit end episodes.
        termination_scope: see above. An episode that ends before ``num_turns`` has its
            last reward held for the turns it skips (see
            :mod:`comlrl.estimators.returns`), unless ``hold_terminal_reward`` is False.
        hold_terminal_reward: hold an early end's reward in the returns (the default);
            False: count it once (CoMLRL 1.4.3's returns).
        max_branches: expand at most this many joint actions per node (``None``: all of
            them, a full tree of ``K**(T-1)`` leaves per example).
        branch_select: which ones when limited: ``"top"`` (highest reward, ties by
            index) or ``"random"`` (a uniform subset).
    """

    num_turns: int = 1
    gamma: float = 1.0
    joint_mode: Literal["align", "cross"] = "align"
    early_termination_threshold: float | None = None
    termination_scope: Literal["joint_action", "node"] = "joint_action"
    max_branches: int | None = None
    branch_select: Literal["top", "random"] = "top"
    hold_terminal_reward: bool = True

    def __post_init__(self) -> None:
        if self.num_turns < 1:
            raise ValueError(f"num_turns must be >= 1, got {self.num_turns}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.max_branches is not None and self.max_branches < 1:
            raise ValueError(f"max_branches must be >= 1 or None, got {self.max_branches}")


def derive_seed(*parts: int) -> int:
    """A 63-bit seed determined by ``parts`` alone (BLAKE2b of their decimal forms).

    Used to key sampling streams by (run seed, step, prompt, turn, node, agent), so a
    prompt's completions do not depend on which other prompts share its batch or rank.
    """
    digest = hashlib.blake2b(",".join(str(int(p)) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def sample_agent(
    agent: Agent,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    keys: Sequence[int] | None = None,
    tools: ToolBox | None = None,
) -> AgentSamples:
    """One agent's ``G`` completions per prompt, as :class:`AgentSamples`.

    Uses the agent's ``sample`` method when it has one (:class:`~comlrl.algos.HFAgent`),
    else its :class:`comlrl.core.Agent` ``generate`` plus
    :func:`~comlrl.algos.rollout.sampling.collate.collate_completions`, which needs
    ``agent.tokenizer`` (and puts the tensors on ``agent.model``'s device). There the
    prompts are tokenized as ``agent.render(prompts)`` when the agent has ``render`` (the
    text its model saw, e.g. through a chat template), else as their plain text.

    ``keys`` (one seed per prompt) asks for prompt-keyed sampling: the agent's
    ``sample(prompts, params, keys=keys)`` draws each prompt's completions from a stream
    seeded by its key.

    ``tools`` (the agent's :class:`~comlrl.algos.rollout.toolbox.ToolBox`): sample with
    tool calls inside the completions
    (:func:`~comlrl.algos.rollout.tool_calls.sample_with_tools`), which needs an
    :class:`~comlrl.algos.HFAgent`.

    Raises:
        TypeError: ``keys`` given for an agent without ``sample(..., keys=)``, or
            ``tools`` for an agent that is not an ``HFAgent`` (no generation backend).
    """
    if tools is not None:
        if getattr(agent, "generation_backend", None) is None:
            raise TypeError(
                f"agent {getattr(agent, 'name', agent)!r} has tools but no generation_backend; "
                "tool calls inside a turn need an HFAgent (comlrl.algos.HFAgent)."
            )
        return sample_with_tools(agent, prompts, params, tools, keys)
    sample = getattr(agent, "sample", None)
    if keys is not None:
        if not callable(sample):
            raise TypeError(
                f"agent {getattr(agent, 'name', agent)!r} has no sample() method, so it cannot "
                "draw prompt-keyed completions; use sampling_rng='agent' or an HFAgent."
            )
        return sample(prompts, params, keys=keys)  # type: ignore[no-any-return]
    if callable(sample):
        return sample(prompts, params)  # type: ignore[no-any-return]
    groups = agent.generate(prompts, params)
    tokenizer = getattr(agent, "tokenizer", None)
    if tokenizer is None:
        raise TypeError(
            f"agent {getattr(agent, 'name', agent)!r} has neither sample() nor a tokenizer; "
            "give it a `tokenizer` attribute so its completions can be collated for the update"
        )
    model = getattr(agent, "model", None)
    device = next(model.parameters()).device if model is not None else "cpu"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    render = getattr(agent, "render", None)
    texts = render(prompts) if callable(render) else [prompt_text(p) for p in prompts]
    return collate_completions(texts, groups, tokenizer, pad_token_id=int(pad), device=device)


def _sequential(fn: Callable[[int], T], n: int) -> list[T]:
    return [fn(a) for a in range(n)]


def rollout(
    agents: Sequence[Agent],
    examples: Sequence[Mapping[str, Any]],
    env: Environment,
    params: SamplingParams,
    tree: TreeSettings = TreeSettings(),
    *,
    map_agents: Callable[[Callable[[int], Any], int], list[Any]] = _sequential,
    rng: random.Random | None = None,
    sample_keys: Sequence[int] | None = None,
) -> Rollout:
    """Roll ``P`` examples out for up to ``tree.num_turns`` turns.

    Args:
        agents: ``A`` agents (:class:`comlrl.core.Agent`; see :func:`sample_agent`).
        examples: the ``P`` task examples of this step.
        env: prompts, reward and transition (:mod:`comlrl.algos.rollout.environment`).
        params: sampling settings; ``G = params.num_generations``.
        tree: turns, discount, termination and branching.
        map_agents: ``map_agents(fn, n) -> [fn(0), ..., fn(n-1)]`` over the turn's sampling
            calls (one per agent, or one for agents that are adapters of one base:
            :func:`~comlrl.algos.rollout.shared_base.sampling_units`); pass a concurrent
            one (:class:`comlrl.algos.training.update.agents.AgentPool`) to sample them in parallel.
        rng: random stream for ``branch_select="random"``.
        sample_keys: one seed per example for prompt-keyed sampling: agent ``a`` draws
            the completions of the ``j``-th node of example ``p`` at turn ``t`` from a
            stream seeded by ``derive_seed(sample_keys[p], t, j, a)``, so the rollout of
            an example does not depend on the other examples it is batched with (data
            parallel runs give the same completions on any number of ranks). ``None``:
            the agents' own streams.

    Returns:
        The :class:`Rollout` with rewards, tree links and returns of every turn.

    Raises:
        RewardFunctionError: the reward function raised or returned a non-finite value
            (the message names the joint action and its example); nothing is updated.
        ValueError: agents and environment disagree on the number of agents, or the
            transition returned something other than one prompt per agent.
    """
    if len(agents) != env.num_agents:
        raise ValueError(f"{len(agents)} agents for an environment of {env.num_agents} agents")
    if sample_keys is not None and len(sample_keys) != len(examples):
        raise ValueError(
            f"{len(sample_keys)} sample_keys for {len(examples)} examples; give one per example"
        )
    rng = rng or random.Random(0)
    num_agents, g = len(agents), params.num_generations
    joint_index = joint_action_indices(num_agents, g, tree.joint_mode)
    idx_rows = [tuple(int(i) for i in row) for row in joint_index.tolist()]
    k = len(idx_rows)
    timings = {"generate_s": 0.0, "reward_s": 0.0, "transition_s": 0.0}
    toolboxes: tuple[ToolBox | None, ...] = tuple(getattr(env, "toolboxes", ()) or ())
    # the sampling calls of a turn: one per agent, or one for agents that are adapters of
    # one base (rollout/shared_base.py)
    units = sampling_units(agents, toolboxes, keyed=sample_keys is not None)
    nodes: list[tuple[int, Branch]] = [(p, env.root(ex)) for p, ex in enumerate(examples)]
    parents = [-1] * len(nodes)
    turns: list[dict[str, Any]] = []
    for t in range(tree.num_turns):
        t0 = time.perf_counter()
        node_keys: list[int] | None = None
        if sample_keys is not None:
            seen: dict[int, int] = {}
            node_keys = []
            for p, _ in nodes:
                node_keys.append(derive_seed(sample_keys[p], t, seen.get(p, 0)))
                seen[p] = seen.get(p, 0) + 1

        def sample(
            u: int, nodes: list[tuple[int, Branch]] = nodes, node_keys: list[int] | None = node_keys
        ) -> list[AgentSamples]:
            unit = units[u]
            keys = [
                [derive_seed(k, a) for k in node_keys] if node_keys is not None else None
                for a in unit
            ]
            prompts = [[b.prompts[a] for _, b in nodes] for a in unit]
            if len(unit) > 1:  # adapters of one base: one batch (rollout/shared_base.py)
                together = keys if node_keys is not None else None
                return sample_together([agents[a] for a in unit], prompts, params, together)
            a = unit[0]
            box = toolboxes[a] if a < len(toolboxes) else None
            return [sample_agent(agents[a], prompts[0], params, keys[0], box)]

        samples: list[AgentSamples] = [None] * num_agents  # type: ignore[list-item]
        for unit, got in zip(units, map_agents(sample, len(units)), strict=True):
            for a, s in zip(unit, got, strict=True):
                samples[a] = s
        t1 = time.perf_counter()
        texts = flat_texts(samples, joint_index)  # [A][N * K]
        flat_examples = [examples[p] for p, _ in nodes for _ in range(k)]
        scored = env.reward(texts, flat_examples)
        values = check_rewards(scored.rewards, texts, flat_examples)
        rewards = torch.tensor(values, dtype=torch.float32).view(len(nodes), k)
        t2 = time.perf_counter()
        terminal = _terminal(rewards, tree, last=t == tree.num_turns - 1)
        child = torch.full((len(nodes), k), -1, dtype=torch.int64)
        feedback: list[Feedback | None] = [None] * (len(nodes) * k)
        next_nodes: list[tuple[int, Branch]] = []
        next_parents: list[int] = []
        if t < tree.num_turns - 1:
            for n, (p, branch) in enumerate(nodes):
                open_children: list[tuple[int, Branch]] = []
                for j in range(k):
                    if terminal[n, j]:
                        continue
                    i = n * k + j
                    action = JointAction(idx_rows[j], tuple(texts[a][i] for a in range(num_agents)))
                    branch_j, fb = env.step(examples[p], branch, action, scored.infos[i], t)
                    feedback[i] = fb
                    if fb.done:
                        terminal[n, j] = True
                    else:
                        open_children.append((j, branch_j))
                for j, branch_j in _select(open_children, rewards[n], tree, rng):
                    child[n, j] = len(next_nodes)
                    next_nodes.append((p, branch_j))
                    next_parents.append(n * k + j)
        timings["generate_s"] += t1 - t0
        timings["reward_s"] += t2 - t1
        timings["transition_s"] += time.perf_counter() - t2
        turns.append(
            dict(
                turn=t,
                example_index=torch.tensor([p for p, _ in nodes], dtype=torch.int64),
                parent=torch.tensor(parents, dtype=torch.int64),
                agents=tuple(samples),
                joint_index=joint_index,
                rewards=rewards,
                terminal=terminal,
                child=child,
                infos=tuple(scored.infos),
                feedback=tuple(feedback),
            )
        )
        if not next_nodes:
            break
        nodes, parents = next_nodes, next_parents
    returns = tree_returns(
        [d["rewards"] for d in turns],
        [d["child"] for d in turns],
        [d["terminal"] for d in turns],
        tree.gamma,
        num_turns=tree.num_turns,  # an early end's reward is held for the turns it skips
        hold_terminal=tree.hold_terminal_reward,
    )
    return Rollout(
        examples=tuple(examples),
        turns=tuple(TurnRollout(returns=r, **d) for d, r in zip(turns, returns, strict=True)),
        gamma=tree.gamma,
        timings=timings,
    )


def _terminal(rewards: torch.Tensor, tree: TreeSettings, *, last: bool) -> torch.Tensor:
    """``[N, K]`` bool: episodes that end with this joint action before any feedback."""
    if last:
        return torch.ones_like(rewards, dtype=torch.bool)
    threshold = tree.early_termination_threshold
    if threshold is None:
        return torch.zeros_like(rewards, dtype=torch.bool)
    if tree.termination_scope == "node":
        return (rewards.mean(dim=1, keepdim=True) > threshold).expand_as(rewards).clone()
    return rewards > threshold


def _select(
    candidates: list[tuple[int, Branch]],
    rewards: torch.Tensor,
    tree: TreeSettings,
    rng: random.Random,
) -> list[tuple[int, Branch]]:
    """The joint actions of one node that open a child, in joint-action order."""
    limit = tree.max_branches
    if limit is None or len(candidates) <= limit:
        return candidates
    if tree.branch_select == "top":
        ranked = sorted(candidates, key=lambda c: (-float(rewards[c[0]]), c[0]))[:limit]
    else:
        ranked = rng.sample(candidates, limit)
    return sorted(ranked, key=lambda c: c[0])
