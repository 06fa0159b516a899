"""CoMLRL 1.4.3's private ``MAGRPOTrainer._compute_rewards``, as a thin adapter over
:func:`comlrl.utils.reward_utils.call_reward_function` (the rule our training reward
calls reward functions by). 1.4.3's test suite calls it directly; our recipe does not go
through it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MAGRPOHooks143"]


class MAGRPOHooks143:
    """1.4.3's ``_compute_rewards`` (see the module docstring)."""

    reward_func: Any
    num_agents: int

    def _compute_rewards(
        self,
        prompts: Sequence[str],
        completions_list: list[Any],
        batch_items: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[float]:
        """1.4.3's reward of each aligned joint action: agent ``a``'s entry of
        ``completions_list`` (one text or a list of them; a bare text is wrapped in a
        list *in place*, as 1.4.3 does) gives its completions; joint action ``k`` is
        scored by one call with one-element lists, and its first value goes through
        ``reward_processor`` (when the trainer has one)."""
        from comlrl.utils.reward_utils import call_reward_function

        for a in range(self.num_agents):
            if not isinstance(completions_list[a], list):
                completions_list[a] = [completions_list[a]]
        processor = getattr(self, "reward_processor", None)
        count = min(len(completions_list[a]) for a in range(self.num_agents))
        rewards = []
        for k in range(count):
            values = call_reward_function(
                self.reward_func,
                list(prompts),
                [[completions_list[a][k]] for a in range(self.num_agents)],
                num_agents=self.num_agents,
                batch_items=None if batch_items is None else list(batch_items),
            )
            rewards.append(float(processor(values[0])) if processor else float(values[0]))
        return rewards
