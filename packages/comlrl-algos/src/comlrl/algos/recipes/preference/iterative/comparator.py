"""The comparator policy of iterative preference refresh (:mod:`.replay` holds the pairs):
whose joint actions the current policy's are compared with in each round.

Policies (``comparator``):

- ``current`` / ``current_copy``: the current agents themselves, sampled at the start of
  the round (their own random streams, so the two sets of candidates are independent
  draws);
- ``model``: frozen models (one name or model for every agent, or one per agent), loaded
  once and shared by agents that name the same one;
- ``history``: the policy as it was ``history_k`` rounds ago (the initial policy while
  fewer rounds have passed), kept as CPU copies of the weights; ``history_k = 1`` is the
  current policy;
- ``api``: a model served behind an HTTP API (:mod:`.api_comparator`), asked for each
  agent's prompts (one :class:`~.api_comparator.ApiAgent` per agent, tokenizing with that
  agent's tokenizer).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from comlrl.algos.training.run.checkpoint import cpu_state_dict

__all__ = ["COMPARATORS", "Comparator"]

#: the comparator policies
COMPARATORS = ("current", "current_copy", "model", "history", "api")


class Comparator:
    """The comparator's agents for each round.

    Args:
        policy: one of :data:`COMPARATORS`.
        agents: the ``A`` current :class:`~comlrl.algos.rollout.agent.HFAgent` s (trained).
        sources: ``policy="model"``: one model name or model for every agent, or one per
            agent.
        load: ``name -> model`` for the names in ``sources``.
        history_k: ``policy="history"``: how many rounds back the comparator is.
        num_rounds: the rounds the run has (``None``: unknown; snapshots a later round
            would read are kept either way).
        seed: base seed of the comparator agents' sampling streams.
        api: ``policy="api"``: the
            :class:`~comlrl.algos.recipes.preference.iterative.api_comparator.ApiComparatorClient`.

    Raises:
        ValueError: an unknown ``policy``, ``history_k < 1``, ``policy="model"`` without
            ``sources`` or ``load``, ``sources`` of neither one nor ``A`` entries, or
            ``policy="api"`` without ``api`` (or ``api`` with another policy).
    """

    def __init__(
        self,
        policy: str,
        agents: Sequence[Any],
        *,
        sources: str | Any | Sequence[Any] | None = None,
        load: Callable[[str], Any] | None = None,
        history_k: int = 1,
        num_rounds: int | None = None,
        seed: int = 0,
        api: Any = None,
    ) -> None:
        if policy not in COMPARATORS:
            raise ValueError(f"comparator={policy!r}; use one of {COMPARATORS}")
        if (policy == "api") != (api is not None):
            raise ValueError(
                f"comparator={policy!r} with api={api!r}: the API client is read by "
                "comparator='api' only, and that policy needs one"
            )
        if history_k < 1:
            raise ValueError(f"comparator_history_k must be >= 1, got {history_k}")
        self.policy = policy
        self.agents = list(agents)
        self.history_k = int(history_k)
        self.num_rounds = num_rounds
        self.seed = seed
        self.load = load
        self.sources: list[Any] = []
        if policy == "model":
            self.sources = self._per_agent(sources)
        self.api_agents: list[Any] = []
        if policy == "api":
            from comlrl.algos.recipes.preference.iterative.api_comparator import ApiAgent

            self.api_agents = [
                ApiAgent(api, a.tokenizer, i, name=f"comparator_{i}")
                for i, a in enumerate(self.agents)
            ]
        #: the snapshot index each round's history comparator used (for logs and tests)
        self.used: list[int] = []
        self.frozen: list[Any] | None = None
        #: round index -> per-agent CPU state dicts (history); index 0 = the initial policy
        self.snapshots: dict[int, list[dict[str, torch.Tensor]]] = {}

    def _per_agent(self, sources: Any) -> list[Any]:
        count = len(self.agents)
        if sources is None:
            raise ValueError("comparator='model' needs comparator models (one, or one per agent)")
        listed = (
            [sources]
            if isinstance(sources, str) or not isinstance(sources, Sequence)
            else list(sources)
        )
        if len(listed) not in (1, count):
            raise ValueError(
                f"{len(listed)} comparator models for {count} agents; give one or one per agent"
            )
        if any(isinstance(s, str) for s in listed) and self.load is None:
            raise ValueError("comparator models given by name need a load= function")
        return listed * count if len(listed) == 1 else listed

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
        by_name: dict[str, Any] = {}  # one frozen copy per distinct name, shared by agents
        models = []
        for source in self.sources:
            if isinstance(source, str):
                if source not in by_name:
                    assert self.load is not None  # checked in __init__
                    by_name[source] = self.load(source)
                models.append(by_name[source])
            else:
                models.append(source)
        return models

    def start(self) -> None:
        """Before round 0: keep the initial policy (history)."""
        if self.policy == "history" and self.history_k > 1:
            self.snapshots[0] = self._state()

    def _state(self) -> list[dict[str, torch.Tensor]]:
        return [cpu_state_dict(a.model) for a in self.agents]

    def snapshot_index(self, round_index: int) -> int:
        """The snapshot the history comparator uses in round ``round_index``: the policy
        after round ``round_index - history_k``, i.e. snapshot
        ``max(0, round_index - history_k + 1)``; ``history_k = 1`` is the current policy."""
        return max(0, round_index - self.history_k + 1)

    def agents_for(self, round_index: int) -> list[Any]:
        """The comparator agents of round ``round_index`` (called at the round's start)."""
        if self.policy in ("current", "current_copy"):
            return self.agents
        if self.policy == "api":
            return self.api_agents
        if self.policy == "model":
            self._ensure_frozen()
            assert self.frozen is not None
            return self.frozen
        index = self.snapshot_index(round_index)
        self.used.append(index)
        if index == round_index:  # the snapshot is the current policy itself
            return self.agents
        self._ensure_frozen()
        assert self.frozen is not None
        for hf, state in zip(self.frozen, self.snapshots[index], strict=True):
            hf.model.load_state_dict(state)
        return self.frozen

    def _ensure_frozen(self) -> None:
        """Build the frozen comparator agents once: the loaded models (``model``) or
        copies of the current ones that snapshots are loaded into (``history``)."""
        if self.frozen is None:
            models = (
                self._load_models()
                if self.policy == "model"
                else [copy.deepcopy(a.model) for a in self.agents]
            )
            self.frozen = self._wrap(models)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to compare as this one would: the history snapshots
        (CPU tensors), the snapshot indices used, and, once built, the frozen agents'
        sampling streams (their weights are the loaded models or a snapshot, both
        rebuilt)."""
        return {
            "snapshots": {i: [dict(sd) for sd in sds] for i, sds in self.snapshots.items()},
            "used": list(self.used),
            "frozen_generators": (
                [hf.generator.get_state() for hf in self.frozen]
                if self.frozen is not None
                else None
            ),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (on a comparator built with the same policy
        and agents, before its first round).

        Raises:
            ValueError: the saved state has frozen agents for a policy without them, or
                another number of them.
        """
        self.snapshots = {int(i): [dict(sd) for sd in sds] for i, sds in state["snapshots"].items()}
        self.used = [int(i) for i in state["used"]]
        saved = state["frozen_generators"]
        if saved is None:
            return
        if self.policy not in ("model", "history") or len(saved) != len(self.agents):
            raise ValueError(
                f"the saved comparator has {len(saved)} frozen agents; this run's comparator "
                f"({self.policy!r}, {len(self.agents)} agents) does not fit it"
            )
        self._ensure_frozen()
        assert self.frozen is not None
        for hf, gen_state in zip(self.frozen, saved, strict=True):
            hf.generator.set_state(gen_state)

    def finish_round(self, round_index: int) -> None:
        """After round ``round_index``'s update: snapshot the policy (history) and drop the
        snapshots no later round reads."""
        if self.policy != "history":
            return
        nxt = round_index + 1
        keep_from = self.snapshot_index(nxt)
        later = self.num_rounds is None or nxt + self.history_k - 1 < self.num_rounds
        if later and keep_from < nxt:
            self.snapshots[nxt] = self._state()  # round nxt + k - 1 reads it
        for index in [i for i in self.snapshots if i < keep_from]:
            del self.snapshots[index]
