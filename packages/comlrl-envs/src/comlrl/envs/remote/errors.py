"""The errors of remote scoring (all :class:`comlrl.core.RewardFunctionError`, which the
training command reports as a failed reward without a traceback), and the private
:class:`TransientError` that sends a chunk to another worker."""

from __future__ import annotations

from collections.abc import Mapping

from comlrl.core import RewardFunctionError

__all__ = ["NoLiveWorkersError", "RemoteRewardError", "RemoteTaskError", "TransientError"]


class RemoteRewardError(RewardFunctionError):
    """Remote scoring failed (a chunk used up its attempts, a worker broke the protocol)."""


class RemoteTaskError(RemoteRewardError):
    """A worker's task rejected the batch (bad shapes or values); retrying elsewhere would
    not help."""


class NoLiveWorkersError(RemoteRewardError):
    """Every reward worker is unreachable or has failed too often.

    Attributes:
        errors: ``{"host:port": last error message}`` for every worker.
    """

    def __init__(self, message: str, errors: Mapping[str, str]) -> None:
        super().__init__(message)
        self.errors = dict(errors)


class TransientError(Exception):
    """A failure worth retrying on another worker (transport, timeout, HTTP 5xx, a
    malformed answer). Never leaves :class:`~comlrl.envs.remote.RemoteReward`."""
