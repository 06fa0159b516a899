"""Critics at work: the text each critic reads (:func:`critic_inputs`; IAC: an agent's own
prompt, MAAC: every agent's), their values at sampling time (:func:`rollout_values`), GAE
advantages and lambda-return targets on the rollout tree (:func:`critic_advantages`), and the
updates (:mod:`.critic_updates`, imported here: :func:`update_critic`,
:func:`update_critics`, :func:`value_terms`, :func:`update_shared`).

Named axes: ``A`` agents, ``N_t`` nodes at turn ``t``, ``K`` joint actions per node, ``M``
critic inputs."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from comlrl.algos.models.value import Critic
from comlrl.algos.recipes.actor_critic.config import Method
from comlrl.algos.records import Rollout, TurnRollout
from comlrl.estimators.gae import q_advantages, tree_gae
from comlrl.estimators.joint import credit_completions

__all__ = [
    "AGENT_REWARDS_KEY",
    "agent_rewards",
    "joint_prompt",
    "critic_inputs",
    "rollout_values",
    "critic_advantages",
]


def joint_prompt(prompts: Sequence[str], completions: Sequence[str] | None = None) -> str:
    """The centralised critic's text: every agent's prompt and, for ``Q``, its completion.

    ``Agent 1 prompt: ...`` lines for every agent, then (with ``completions``)
    ``Agent 1 response: ...`` lines; the value is read at the text's last token.
    """
    lines = [f"Agent {a + 1} prompt: {p}" for a, p in enumerate(prompts)]
    if completions is not None:
        lines += [f"Agent {a + 1} response: {c}" for a, c in enumerate(completions)]
    return "\n".join(lines)


def critic_inputs(turn: TurnRollout, method: Method, kind: str, critic: int) -> list[str]:
    """The texts critic ``critic`` reads at one turn, in the order of its values.

    - IAC, ``v``: agent ``critic``'s ``N_t`` prompts;
    - IAC, ``q``: its ``N_t * G`` prompt+completion texts, node-major;
    - MAAC, ``v``: ``N_t`` :func:`joint_prompt` texts;
    - MAAC, ``q``: ``N_t * K`` joint prompt + joint action texts, node-major.
    """
    if method == "iac":
        samples = turn.agents[critic]
        if kind == "v":
            return list(samples.prompts)
        return [
            p + c.text
            for p, group in zip(samples.prompts, samples.completions, strict=True)
            for c in group
        ]
    num_agents = len(turn.agents)
    if kind == "v":
        return [joint_prompt([s.prompts[n] for s in turn.agents]) for n in range(turn.num_nodes)]
    rows = turn.joint_index.tolist()
    return [
        joint_prompt(
            [s.prompts[n] for s in turn.agents],
            [turn.agents[a].completions[n][row[a]].text for a in range(num_agents)],
        )
        for n in range(turn.num_nodes)
        for row in rows
    ]


def _as_joint(
    values: torch.Tensor, turn: TurnRollout, method: Method, kind: str, critic: int
) -> torch.Tensor:
    """A critic's values at one turn as ``[N_t, K]``, one per joint action."""
    n, k = turn.rewards.shape
    if kind == "v":
        return values.view(n, 1).expand(n, k)
    if method == "maac":
        return values.view(n, k)
    g = turn.agents[critic].batch.group_size
    return values.view(n, g)[:, turn.joint_index[:, critic].to(values.device)]


@torch.no_grad()
def rollout_values(
    ro: Rollout, critics: Sequence[Critic], method: Method, *, micro_batch_size: int | None = None
) -> list[list[torch.Tensor]]:
    """Sampling-time values: per critic ``c``, per turn ``t``, the flat ``[M_t]`` float32
    values of :func:`critic_inputs` (on CPU)."""
    return [
        [
            critic.values(
                critic_inputs(turn, method, critic.kind, c), micro_batch_size=micro_batch_size
            )
            .float()
            .cpu()
            for turn in ro.turns
        ]
        for c, critic in enumerate(critics)
    ]


#: A reward info key holding one reward per agent (``comlrl.trainers``' IAC/MAAC, whose
#: CoMLRL 1.4.3 reward functions may return ``A`` values for a joint action).
AGENT_REWARDS_KEY = "agent_rewards"


def agent_rewards(turns: Sequence[TurnRollout], a: int) -> list[torch.Tensor] | None:
    """Agent ``a``'s rewards per turn (``[N_t, K]`` float32, like ``turn.rewards``) when
    every reward info of every turn holds :data:`AGENT_REWARDS_KEY`, else None."""
    if not turns or any(
        len(t.infos) != t.rewards.numel() or any(AGENT_REWARDS_KEY not in i for i in t.infos)
        for t in turns
    ):
        return None
    return [
        torch.tensor(
            [float(i[AGENT_REWARDS_KEY][a]) for i in t.infos], dtype=t.rewards.dtype
        ).view_as(t.rewards)
        for t in turns
    ]


def critic_advantages(
    ro: Rollout,
    values: Sequence[Sequence[torch.Tensor]],
    method: Method,
    kind: str,
    *,
    gamma: float,
    lam: float,
    normalize: bool,
    eps: float = 1e-8,
    num_turns: int | None = None,
    hold_terminal: bool = True,
) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
    """Per-completion advantages for the actors and regression targets for the critics.

    Args:
        ro: the step's rollout.
        values: :func:`rollout_values`' output.
        method: ``"iac"`` (critic ``a`` for agent ``a``) or ``"maac"`` (one critic).
        kind: ``"v"`` or ``"q"``.
        gamma: discount; lam: GAE lambda (:func:`~comlrl.estimators.gae.tree_gae`).
        normalize: whiten each agent's advantages over all turns of the step
            (population std + ``eps``; skipped with fewer than 2).
        num_turns: the turn limit an early end's reward is held for (None: the
            rollout's turns).
        hold_terminal: hold an early end's reward (the default); False: count it once.

    With a ``v`` critic the advantages are :func:`~comlrl.estimators.gae.tree_gae`'s GAE; with
    a ``q`` critic they are :func:`~comlrl.estimators.gae.q_advantages` (the lambda-return
    minus the mean Q of the node's joint actions; ``K = 1``: the lambda-return, and the
    whitening's batch mean is the baseline).

    Returns:
        ``(advantages, targets)``: ``advantages[t][a]`` is ``[N_t * G]`` float32 (rows
        of agent ``a``'s batch); ``targets[c][t]`` is critic ``c``'s ``[M_t, J]`` targets
        for its ``M_t`` values, ``J = K`` for ``v`` (a node's value is regressed on the
        lambda-return of each of its joint actions) and ``J = 1`` for ``q``.
    """
    num_agents = ro.num_agents
    turns = ro.turns
    joint = [
        [_as_joint(values[c][t], turn, method, kind, c) for t, turn in enumerate(turns)]
        for c in range(len(values))
    ]
    adv_out: list[list[torch.Tensor]] = [[torch.empty(0)] * num_agents for _ in turns]
    targets_out: list[list[torch.Tensor]] = []
    own = [agent_rewards(turns, a) for a in range(num_agents)]  # None: joint rewards only

    def gae(
        rewards: list[torch.Tensor] | None, c: int
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return tree_gae(
            rewards if rewards is not None else [t.rewards for t in turns],
            joint[c],
            [t.child for t in turns],
            [t.terminal for t in turns],
            gamma,
            lam,
            num_turns=num_turns,
            hold_terminal=hold_terminal,
        )

    for c in range(len(values)):
        # IAC: critic c learns agent c's own rewards when the reward gives one per agent
        advs, targets = gae(own[c] if method == "iac" else None, c)
        agents = range(num_agents) if method == "maac" else [c]
        # MAAC with per-agent rewards: the critic fits the joint (mean) reward; agent a's
        # advantage uses its own reward against the shared values
        per_agent = {
            a: gae(own[a], c) if method == "maac" and own[a] is not None else (advs, targets)
            for a in agents
        }
        per_turn = []
        for t, turn in enumerate(turns):
            g = turn.agents[0].batch.group_size
            for a in agents:
                a_advs, a_targets = per_agent[a]
                # Q: the lambda-return minus an action-independent baseline (q_advantages);
                # G - Q(s, a) would cancel the policy gradient once the critic fits.
                actor_adv = q_advantages(a_targets[t], joint[c][t]) if kind == "q" else a_advs[t]
                credited = credit_completions(actor_adv, turn.joint_index, g)  # [A, N_t, G]
                adv_out[t][a] = credited[a].reshape(-1).float()
            if kind == "v":
                per_turn.append(targets[t].float())
            elif method == "maac":
                per_turn.append(targets[t].reshape(-1, 1).float())
            else:
                per_turn.append(
                    credit_completions(targets[t], turn.joint_index, g)[c].reshape(-1, 1).float()
                )
        targets_out.append(per_turn)
    if normalize:
        for a in range(num_agents):
            flat = torch.cat([adv_out[t][a] for t in range(len(turns))])
            if flat.numel() > 1:
                mean, std = flat.mean(), flat.std(unbiased=False)
                for t in range(len(turns)):
                    adv_out[t][a] = (adv_out[t][a] - mean) / (std + eps)
    return adv_out, targets_out
