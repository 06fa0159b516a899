"""CoMLRL 1.4.3's per-agent task runner (``_run_agent_tasks``), for scripts and tests that
call it.

1.4.3 runs one function per agent, concurrently under ``parallel_training="mp"`` when the
agents sit on different devices, each agent always on its own worker thread (CUDA keeps
per-thread state such as the current device and stream). Our recipes do the same job with
:class:`comlrl.algos.training.agents.AgentPool`; this mixin gives the 1.4.3 entry points
with one single-thread executor per agent, so the binding agent -> thread holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["AgentTasks143"]

T = TypeVar("T")


class AgentTasks143:
    """1.4.3's ``_parallel_agent_mode_enabled``, ``_run_agent_tasks`` and
    ``_shutdown_agent_task_executors`` (see the module docstring). Reads
    ``parallel_training``, ``agent_devices`` and ``num_agents`` (or ``args.num_agents``)."""

    def _task_agent_count(self) -> int:
        count = self.__dict__.get("num_agents")
        if count is None:
            count = getattr(getattr(self, "args", None), "num_agents", 0)
        return int(count or 0)

    def _parallel_agent_mode_enabled(self) -> bool:
        """1.4.3's rule: ``parallel_training="mp"``, more than one agent, and the agents
        on more than one device (no ``agent_devices``: assumed apart)."""
        if str(getattr(self, "parallel_training", "")).lower() != "mp":
            return False
        if self._task_agent_count() <= 1:
            return False
        devices = getattr(self, "agent_devices", None)
        return not devices or len({str(d) for d in devices}) > 1

    def _run_agent_tasks(
        self,
        fn: Callable[[int], T],
        *,
        agent_indices: Sequence[int] | None = None,
        parallel: bool | None = None,
    ) -> list[T]:
        """``[fn(i) for i in agent_indices]`` (default: every agent), results in that
        order; concurrently when ``parallel`` (default :meth:`_parallel_agent_mode_enabled`),
        agent ``i`` always on the same worker thread. Exceptions propagate."""
        indices = list(range(self._task_agent_count()) if agent_indices is None else agent_indices)
        go_parallel = self._parallel_agent_mode_enabled() if parallel is None else bool(parallel)
        if not go_parallel or len(indices) <= 1:
            return [fn(i) for i in indices]
        executors: dict[int, ThreadPoolExecutor] = self.__dict__.setdefault(
            "_agent_task_executors", {}
        )
        futures = []
        for i in indices:
            if i not in executors:
                executors[i] = ThreadPoolExecutor(1, thread_name_prefix=f"comlrl-agent{i}")
            futures.append(executors[i].submit(fn, i))
        return [f.result() for f in futures]

    def _shutdown_agent_task_executors(self) -> None:
        """Stop the per-agent worker threads (safe to call twice)."""
        executors: dict[int, Any] = self.__dict__.pop("_agent_task_executors", {})
        for executor in executors.values():
            executor.shutdown(wait=True)
