"""CoMLRL 1.4.3's reference-KL hooks of MAGRPO, IAC and MAAC, as thin adapters over ours.

Our recipes add ``reference_kl_coef * KL`` to the loss against a frozen copy of each
agent (docs/compat.md, "Reference KL"); 1.4.3 subtracts a per-sequence KL from the
returns (MAGRPO) or rewards (IAC/MAAC). 1.4.3's test suite calls its private hooks for
that directly; each method here reproduces the 1.4.3 behaviour its docstring names with
:mod:`comlrl.utils.reference_kl`. The training loops do not go through them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from comlrl.utils.reference_kl import (
    clone_reference_models,
    reference_kl_coef,
    reference_kl_enabled,
    reference_kl_for_sequence,
    resolve_reference_devices,
)

__all__ = ["ReferenceKLHooks143"]


class ReferenceKLHooks143:
    """1.4.3's ``reference_models``, ``_reference_kl_values``,
    ``_apply_reference_kl_to_returns`` (MAGRPO) and ``_kl_shaped_reward`` (IAC/MAAC)."""

    args: Any

    @property
    def reference_models(self) -> list[Any]:
        """The frozen reference copy of each agent when ``reference_kl_enabled`` (``[]``
        otherwise): the recipe run's once it is built; before that (no ``train_dataset``
        yet) copies made on first access, on ``reference_devices`` (default: the agents'
        devices), as 1.4.3 makes at construction."""
        given = self.__dict__.get("_reference_models")
        if given is not None:
            return given
        if not reference_kl_enabled(self.args):
            return []
        run = getattr(self, "_run_state", None)
        refs = getattr(self._base_run(), "ref_models", None) if run is not None else None  # type: ignore[attr-defined]
        if refs is not None:
            return list(refs)
        models = list(self.__dict__.get("_models") or [])  # none on a bare object.__new__
        if not models:
            return []
        devices = [next(m.parameters()).device for m in models]
        devices = resolve_reference_devices(self.args, devices, len(models))
        copies = clone_reference_models(models, devices=devices)
        self.__dict__["_reference_models"] = copies
        return copies

    @reference_models.setter
    def reference_models(self, models: Sequence[Any]) -> None:
        """Use these reference models in the hooks (1.4.3's tests assign them)."""
        self.__dict__["_reference_models"] = list(models)

    def _sequence_kl_function(self) -> Callable[..., torch.Tensor]:
        """``reference_kl_for_sequence`` as the trainer's module names it (1.4.3's tests
        replace it there), else :func:`comlrl.utils.reference_kl.reference_kl_for_sequence`."""
        for cls in type(self).__mro__:
            module = sys.modules.get(cls.__module__)
            found = getattr(module, "reference_kl_for_sequence", None)
            if found is not None:
                return found  # type: ignore[no-any-return]
        return reference_kl_for_sequence

    def _reference_kl_values(
        self,
        agent_idx: int,
        policy_model: Any,
        sequences: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_len: int,
        response_lens: Sequence[int],
    ) -> list[float]:
        """1.4.3's per-completion sequence KL of agent ``agent_idx`` against its reference:
        one value per row of ``sequences`` ``[B, S + L]`` (at most ``len(response_lens)``),
        row ``i``'s response being its ``response_lens[i]`` tokens after ``prompt_len``;
        without gradients, training modes and the torch RNG left as they were; ``[]``
        when the KL is off.

        Raises:
            RuntimeError: the KL is on but there are no reference models.
        """
        if not reference_kl_enabled(self.args):
            return []
        refs = self.reference_models
        if not refs:
            raise RuntimeError(
                "reference_kl_enabled=True but the reference models are missing; build the "
                "trainer with reference_kl_enabled=True (it makes them) or assign "
                "trainer.reference_models."
            )
        kl = self._sequence_kl_function()
        count = min(int(sequences.shape[0]), len(response_lens)) if len(response_lens) else 0
        values = []
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            for i in range(count):
                out = kl(
                    policy_model,
                    refs[agent_idx],
                    sequences[i : i + 1],
                    attention_mask[i : i + 1],
                    prompt_len,
                    response_lens[i],
                )
                values.append(float(torch.as_tensor(out).reshape(-1)[0]))
        return values

    def _apply_reference_kl_to_returns(
        self, returns: torch.Tensor, data: Mapping[str, Any]
    ) -> torch.Tensor:
        """1.4.3's MAGRPO shaping: ``returns - reference_kl_coef * KL`` with the KLs of
        ``data["reference_kls"]`` (missing ones count 0); ``returns`` unchanged when the KL
        is off or there are none."""
        kls = list(data.get("reference_kls") or [])
        if not reference_kl_enabled(self.args) or not kls:
            return returns
        per_row = torch.zeros_like(returns)
        n = min(len(kls), returns.numel())
        per_row.view(-1)[:n] = torch.tensor(kls[:n], dtype=returns.dtype, device=returns.device)
        return returns - reference_kl_coef(self.args) * per_row

    def _kl_shaped_reward(
        self, reward: float, data: Mapping[str, Any], index: int
    ) -> tuple[float, dict[str, float]]:
        """1.4.3's IAC/MAAC shaping of completion ``index``'s reward:
        ``reward - reference_kl_coef * KL`` and the KL, the penalty and the environment
        reward; ``(reward, {})`` when the KL is off."""
        if not reference_kl_enabled(self.args):
            return reward, {}
        kls = data.get("reference_kls") or []
        kl = float(kls[index]) if index < len(kls) else 0.0
        penalty = reference_kl_coef(self.args) * kl
        return reward - penalty, {
            "reference_kl": kl,
            "reference_kl_penalty": penalty,
            "environment_reward": reward,
        }
