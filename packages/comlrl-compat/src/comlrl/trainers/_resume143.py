"""Resuming a checkpoint folder CoMLRL 1.4.3 wrote (``train(checkpoint_dir=...)`` of 1.4.3's
MAGRPO family) in ours: ``trainer.train(resume_from_checkpoint="<1.4.3 run>/checkpoint-2")``.

What comes back: the agents' weights, their AdamW moments and step counts, the KL
reference models (when saved), Python's/NumPy's/torch's global random streams,
``env_step``, stateful callbacks, the epoch cursor, the commit sequence, the run id and
W&B identity. The data cursor is put at the start of the next epoch, and the optimizer
step at ``ceil(epochs * len(train_dataset) / train_batch_size)`` (our steps take
``train_batch_size`` examples, 1.4.3's rolled out one at a time). So the run continues
*from* 1.4.3's state, not bit for bit as 1.4.3 would have (our sampler and each agent's
sampling generator differ from 1.4.3's, docs/compat.md "Checkpoints").

Everything is checked before anything changes: the trainer class (by name), the config
fields both versions have (those of ``PORTABLE_FIELDS`` and paths excepted), the cursor
(a MAGRPO epoch, empty rollout buffers), the number of agents, parameter names and shapes,
and the optimizers' parameter groups.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from comlrl.utils._checkpoint_parts import PORTABLE_FIELDS, config_fields, stateful_callbacks
from comlrl.utils._trainer_snapshot import set_global_rng

__all__ = ["Resume143"]


def _states(state: Mapping[str, Any], section: str, name: str) -> list[Any]:
    record = state.get(section, {}).get(name)
    return list(record["states"]) if isinstance(record, Mapping) else []


class Resume143:
    """``_resume_143(state, where)`` for the trainers on a group-baseline run (the MAGRPO
    family): see the module docstring."""

    args: Any
    env_step: int
    _checkpoint_kind: str
    _base_run: Any
    _checkpoint_start_epoch: Any
    _checkpoint_resume_wandb: Any

    def _resume_143(self, state: Mapping[str, Any], where: str) -> dict[str, Any]:
        run = self._base_run()
        self._check_143(state, run, where)
        agents = _states(state, "models", "agents")
        optimizers = _states(state, "optimizers", "optimizers")
        refs = _states(state, "models", "reference_models")
        live_refs = getattr(run, "ref_models", None) or []
        for agent, weights in zip(run.agents, agents, strict=True):
            agent.model.load_state_dict(weights)
        for opt, saved in zip(run.optimizers, optimizers, strict=True):
            opt.load_state_dict(saved)
        if refs and len(refs) == len(live_refs):
            for model, weights in zip(live_refs, refs, strict=True):
                model.load_state_dict(weights)
        epoch = int(state["progress"].get("epoch", 0))
        total_examples = epoch * len(run.data.dataset)
        run.step = min(math.ceil(total_examples / self.config.batch_size), self.config.num_steps)  # type: ignore[attr-defined]
        run.data.order, run.data.epoch = [], epoch  # the next batch opens epoch + 1
        runtime = state.get("runtime", {})
        self.env_step = int(runtime.get("env_step", 0))
        self._last_train_log_step = int(runtime.get("_last_train_log_step", -1))
        live = stateful_callbacks(self)
        for name, record in (state.get("callbacks") or {}).items():
            live[name].load_state_dict(record["state"])
        rng = dict(state["rng"])
        if "numpy" in rng:
            rng["numpy"] = tuple(rng["numpy"])
        set_global_rng(rng)
        self._checkpoint_progress = dict(state["progress"])
        self._checkpoint_sequence = int(state["sequence"])
        self._checkpoint_run_id = state.get("run_id")
        self._checkpoint_resume_wandb(state.get("wandb"))
        self._checkpoint_save_blocked = False
        return dict(self._checkpoint_progress)

    def _check_143(self, state: Mapping[str, Any], run: Any, where: str) -> None:
        name = str(state.get("trainer_class", "")).rpartition(".")[2]
        if state.get("version") != 1 or name != type(self).__name__:
            raise ValueError(
                f"{where}: a CoMLRL 1.4.3 checkpoint of {state.get('trainer_class')!r} (version "
                f"{state.get('version')!r}); this trainer is {type(self).__name__}"
            )
        saved = {k: v for k, v in (state.get("config") or {}).items() if not k.endswith("_dir")}
        now = config_fields(self.args)
        changed = sorted(
            k for k in set(saved) & set(now) if k not in PORTABLE_FIELDS and saved[k] != now[k]
        )
        if changed:
            raise ValueError(
                f"{where}: the 1.4.3 run's configuration differs in {', '.join(changed)}; build "
                "the trainer with the config that run used."
            )
        progress = state.get("progress") or {}
        self._checkpoint_start_epoch(progress)
        if any(state.get("runtime", {}).get("rollout_buffers", [])):
            raise ValueError(
                f"{where}: the 1.4.3 checkpoint has buffered rollouts (not an epoch boundary)"
            )
        agents = _states(state, "models", "agents")
        if len(agents) != len(run.agents):
            raise ValueError(
                f"{where}: {len(agents)} agents saved; this trainer has {len(run.agents)}"
            )
        for i, (agent, weights) in enumerate(zip(run.agents, agents, strict=True)):
            live = agent.model.state_dict()
            if set(live) != set(weights) or any(
                tuple(live[k].shape) != tuple(weights[k].shape) for k in live
            ):
                raise ValueError(f"{where}: agent {i}'s saved weights do not fit its model")
        optimizers = _states(state, "optimizers", "optimizers")
        if len(optimizers) != len(run.optimizers) or any(
            [len(g["params"]) for g in opt.param_groups]
            != [len(g["params"]) for g in saved["param_groups"]]
            for opt, saved in zip(run.optimizers, optimizers)
        ):
            raise ValueError(f"{where}: the saved optimizers do not fit this trainer's")
        names = set(state.get("callbacks") or {})
        if not names <= set(stateful_callbacks(self)):
            raise ValueError(f"{where}: the 1.4.3 run had stateful callbacks {sorted(names)}")
