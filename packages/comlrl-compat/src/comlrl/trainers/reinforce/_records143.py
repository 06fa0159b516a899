"""CoMLRL 1.4.3's MAGRPO rollout record ``NodeSample`` (importable from
``comlrl.trainers.reinforce.magrpo``, as in 1.4.3).

Our recipe does not produce these: a 1.4.3-style trainer assembled by hand keeps them in
``rollout_buffers`` (one list per agent), and a checkpoint of such a trainer stores them
(:mod:`comlrl.utils._trainer_snapshot`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["NodeSample"]


@dataclass
class NodeSample:
    """One agent's completions at one node of a rollout tree.

    Attributes:
        agent_idx, turn_idx: the agent and the turn (0-based).
        completions_data: the node's tensors by name (prompt and completion ids, masks,
            behaviour log-probs, ...).
        returns: one return per completion (``G`` floats).
        node_mean_reward, node_mean_return: the node's mean reward and mean return.
        node_env_step: the environment step (joint actions scored so far) of the node.
    """

    agent_idx: int
    turn_idx: int
    completions_data: dict[str, Any]
    returns: list[float]
    node_mean_reward: float
    node_mean_return: float
    node_env_step: int
