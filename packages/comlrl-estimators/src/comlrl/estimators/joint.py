"""Joint actions from per-agent completions, and credit from joint returns back to them.

Each of the A agents samples G completions for the same task instance (prompt index p).
A *joint action* picks one completion per agent; the reward function scores joint
actions. Two ways to form them (docs/architecture.md, one step, step 4):

- ``"align"``: the g-th completion of every agent together, K = G joint actions.
- ``"cross"``: every combination, K = G**A joint actions.

:func:`credit_completions` turns the joint returns ``[P, K]`` into one return per
completion ``[A, P, G]``: the mean over the joint actions the completion took part in.
Those per-completion returns are what :func:`comlrl.estimators.advantages.compute_advantages`
takes, one agent at a time, with the G completions of a prompt as the group.

Named axes: ``P`` prompts, ``G`` completions per agent per prompt, ``A`` agents,
``K`` joint actions.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "JOINT_MODES",
    "MAX_CROSS_JOINT_ACTIONS",
    "credit_completions",
    "joint_action_indices",
]

#: Accepted values of ``joint_action_indices(mode=...)``.
JOINT_MODES: tuple[str, ...] = ("align", "cross")

#: Largest number of joint actions ``G**A`` that ``mode="cross"`` builds. Each joint
#: action is one call of the reward function, so beyond this the reward step dominates.
MAX_CROSS_JOINT_ACTIONS = 4096

JointMode = Literal["align", "cross"]


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def joint_action_indices(
    num_agents: int,
    group_size: int,
    mode: JointMode,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """Which completion of each agent forms each joint action.

    Args:
        num_agents: A, number of agents (>= 1).
        group_size: G, completions per agent per prompt (>= 1).
        mode: ``"align"``: K = G, row k is ``(k, ..., k)``. ``"cross"``: K = G**A, the
            Cartesian product in ``itertools.product(range(G), repeat=A)`` order
            (agent 0 varies slowest, the last agent fastest).
        device: where to put the result.

    Returns:
        int64 ``[K, A]``; entry ``[k, a]`` is the index ``g`` in ``[0, G)`` of agent a's
        completion in joint action k.

    Raises:
        ValueError: ``mode`` not in :data:`JOINT_MODES`; non-positive sizes; or
            ``mode="cross"`` with ``G**A > MAX_CROSS_JOINT_ACTIONS``.
    """
    if mode not in JOINT_MODES:
        raise ValueError(f"unknown joint mode {mode!r}; use one of {list(JOINT_MODES)}")
    num_agents = _check_positive_int("num_agents", num_agents)
    group_size = _check_positive_int("group_size", group_size)
    if mode == "align":
        return (
            torch.arange(group_size, device=device).unsqueeze(1).expand(group_size, num_agents)
        ).contiguous()
    num_joint = group_size**num_agents
    if num_joint > MAX_CROSS_JOINT_ACTIONS:
        raise ValueError(
            f"mode='cross' with group_size={group_size} and num_agents={num_agents} makes "
            f"{group_size}**{num_agents} = {num_joint} joint actions, more than "
            f"{MAX_CROSS_JOINT_ACTIONS}; use mode='align' or a smaller group_size"
        )
    k = torch.arange(num_joint, device=device).unsqueeze(1)
    # Digit a of k in base G, most significant digit first (agent 0 slowest).
    place = group_size ** torch.arange(num_agents - 1, -1, -1, device=device)
    return torch.div(k, place, rounding_mode="floor") % group_size


def credit_completions(joint_returns: Tensor, joint_index: Tensor, group_size: int) -> Tensor:
    """Per-completion returns: the mean joint return of the joint actions it is part of.

    ``out[a, p, g] = mean{ joint_returns[p, k] : joint_index[k, a] == g }``.
    With ``"align"`` indices this copies ``joint_returns`` to every agent; with
    ``"cross"`` indices each completion averages the ``G**(A-1)`` joint actions it
    took part in. Vectorized with ``index_add`` (no loops over P or K); differentiable
    in ``joint_returns``.

    Args:
        joint_returns: ``[P, K]`` floating return of each joint action for each prompt.
        joint_index: ``[K, A]`` integer completion indices, e.g. from
            :func:`joint_action_indices`.
        group_size: G, completions per agent per prompt.

    Returns:
        ``[A, P, G]`` in the dtype of ``joint_returns``.

    Raises:
        ValueError: wrong ranks or mismatched K; non-floating ``joint_returns``; an
            index outside ``[0, G)``; or a completion that is in no joint action (its
            mean would be undefined; the message names agent and completion).
    """
    group_size = _check_positive_int("group_size", group_size)
    if joint_returns.dim() != 2:
        raise ValueError(f"joint_returns must be [P, K], got shape {list(joint_returns.shape)}")
    if not joint_returns.dtype.is_floating_point:
        raise ValueError(f"joint_returns must be floating point, got dtype {joint_returns.dtype}")
    if (
        joint_index.dim() != 2
        or joint_index.dtype.is_floating_point
        or (joint_index.dtype == torch.bool)
    ):
        raise ValueError(
            "joint_index must be an integer tensor [K, A], got "
            f"shape {list(joint_index.shape)} dtype {joint_index.dtype}"
        )
    num_prompts, num_joint = joint_returns.shape
    if joint_index.shape[0] != num_joint:
        raise ValueError(
            f"joint_returns has K = {num_joint} joint actions but joint_index has "
            f"{joint_index.shape[0]} rows"
        )
    num_agents = joint_index.shape[1]
    index = joint_index.to(device=joint_returns.device, dtype=torch.int64)
    if index.numel() and bool(((index < 0) | (index >= group_size)).any()):
        raise ValueError(
            f"joint_index values must lie in [0, {group_size}), got min "
            f"{int(index.min())} max {int(index.max())}"
        )
    # Slot a * G + g for completion g of agent a; slots are the columns of the sums.
    slot = (index + torch.arange(num_agents, device=index.device) * group_size).T.reshape(-1)
    counts = torch.bincount(slot, minlength=num_agents * group_size)
    if bool((counts == 0).any()):
        a, g = divmod(int((counts == 0).nonzero()[0]), group_size)
        raise ValueError(
            f"completion {g} of agent {a} is in no joint action, so it has no return; "
            "every completion must appear in joint_index"
        )
    source = joint_returns.unsqueeze(1).expand(num_prompts, num_agents, num_joint)
    sums = joint_returns.new_zeros(num_prompts, num_agents * group_size).index_add(
        1, slot, source.reshape(num_prompts, num_agents * num_joint)
    )
    means = sums / counts.to(joint_returns.dtype)
    return means.reshape(num_prompts, num_agents, group_size).permute(1, 0, 2).contiguous()
