"""CoMLRL 1.4.3 config fields: the checks its config dataclasses make when built, and their
translation onto :class:`comlrl.algos.TrainConfig` fields (devices, sampling, schedule,
optimizer, evaluation, reference KL).

Every trainer of ``comlrl.trainers`` (reinforce, actor-critic, preference) uses these; the
1.4.3 config dataclasses call :func:`check_minimums` and :func:`check_parallel_training`
from their ``__post_init__``, the trainers :func:`common_train_config`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "UnsupportedFieldError",
    "UnsupportedTrainerError",
    "check_minimums",
    "check_parallel_training",
    "common_train_config",
    "device_fields",
    "device_list",
    "one_device",
]


class UnsupportedFieldError(ValueError):
    """A CoMLRL 1.4.3 config field or argument is set to a value this package does not
    implement (the message names the field, the value and what to do)."""


class UnsupportedTrainerError(NotImplementedError):
    """A CoMLRL 1.4.3 trainer or config this package names but does not implement (the
    message names it and what to use instead; see docs/compat.md)."""


def check_minimums(cfg: Any, minimums: Mapping[str, int]) -> None:
    """CoMLRL 1.4.3's lower bounds of a config's integer fields.

    Raises:
        ValueError: ``"<field> must be >= <low>, got <value>"`` for the first field below
            its bound (1.4.3's tests match the field name).
    """
    for name, low in minimums.items():
        value = getattr(cfg, name)
        if value is not None and value < low:
            raise ValueError(f"{name} must be >= {low}, got {value!r}")


def check_parallel_training(cfg: Any, device_fields: tuple[str, ...] = ("agent_devices",)) -> None:
    """1.4.3's ``parallel_training`` check: ``'none'`` (also ``'null'`` or None, stored as
    ``'none'``) or ``'mp'``, and ``'mp'`` needs every field of ``device_fields`` set;
    ``reference_kl_coef`` (when the config has it) is ``>= 0``.

    Raises:
        ValueError: naming the field.
    """
    raw = cfg.parallel_training
    mode = "none" if raw is None else str(raw).strip().lower()
    mode = "none" if mode == "null" else mode
    if mode not in ("none", "mp"):
        raise ValueError(
            f"parallel_training={raw!r}: use 'none' (all agents on one device) or 'mp' "
            "(agent i on agent_devices[i])."
        )
    if mode == "mp":
        for field in device_fields:
            if getattr(cfg, field) is None:
                raise ValueError(
                    f"parallel_training='mp' needs {field} (one device, or one per model)."
                )
    cfg.parallel_training = mode
    coef = getattr(cfg, "reference_kl_coef", 0.0)
    if coef is not None and coef < 0:
        raise ValueError(f"reference_kl_coef must be >= 0, got {coef!r}")


def device_list(spec: Any, count: int, field: str) -> list[str] | None:
    """A 1.4.3 device spec as one device name per model: None/``"auto"`` -> None (the
    automatic choice), a string -> that device ``count`` times, a list of one -> repeated,
    a list of ``count`` -> as given.

    Raises:
        ValueError: an empty list, or one whose length is neither 1 nor ``count``.
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto"):
        return None
    if isinstance(spec, str):
        return [spec] * count
    names = [str(s) for s in spec]
    if not names:
        raise ValueError(f"{field} must be a non-empty list, a device string or 'auto'.")
    if len(names) == 1:
        return names * count
    if len(names) != count:
        raise ValueError(f"{field} lists {len(names)} devices; give 1 or {count} (one per model).")
    return names


def device_fields(args: Any, num_agents: int) -> dict[str, Any]:
    """The :class:`~comlrl.algos.TrainConfig` placement of a 1.4.3 config:
    ``parallel_training='mp'`` puts agent ``i`` on ``agent_devices[i]`` (``"auto"``: one
    GPU per agent when there are enough), ``'none'`` every agent on the first device named
    (or the automatic one); ``reference_devices`` places the KL reference copies.

    Raises:
        ValueError: a malformed device list (see :func:`device_list`).
    """
    import torch

    spec = args.agent_devices
    if args.parallel_training == "mp" and num_agents > 1:
        names = device_list(spec, num_agents, "agent_devices")
        if names is None and torch.cuda.is_available() and torch.cuda.device_count() >= num_agents:
            names = [f"cuda:{i}" for i in range(num_agents)]
    else:
        if spec is not None and not isinstance(spec, str):
            if not list(spec):
                raise ValueError(
                    "agent_devices must be a non-empty list, a device string or 'auto'."
                )
            spec = str(list(spec)[0])
        names = device_list(spec, num_agents, "agent_devices")
    if names is None:
        fields: dict[str, Any] = {"device": "auto"}
    elif len(set(names)) == 1:
        fields = {"device": names[0]}
    else:
        fields = {"agent_devices": names}
    refs = getattr(args, "reference_devices", None)
    if getattr(args, "reference_kl_enabled", False) and refs is not None:
        fields["reference_devices"] = device_list(refs, num_agents, "reference_devices")
    return fields


def one_device(args: Any, num_agents: int, trainer: str) -> str:
    """The one device of a trainer whose agents stay together.

    Raises:
        UnsupportedFieldError: the settings place the agents on several devices.
    """
    fields = device_fields(args, num_agents)
    if "agent_devices" in fields:
        raise UnsupportedFieldError(
            f"{type(args).__name__}.agent_devices={args.agent_devices!r} with "
            f"parallel_training='mp' is not supported by {trainer}: its agents share one "
            "device; give one device (e.g. 'cuda:0')."
        )
    return str(fields["device"])


def common_train_config(
    args: Any, num_agents: int, num_examples: int, has_eval: bool
) -> dict[str, Any]:
    """The :class:`~comlrl.algos.TrainConfig` fields every 1.4.3 config shares.

    ``num_train_epochs`` passes over ``num_examples`` examples at ``train_batch_size``
    (default ``rollout_buffer_size``) examples per step become ``num_steps``;
    ``eval_interval`` (in examples) becomes ``eval_every`` (in steps) on the first
    ``eval_num_samples`` evaluation examples, one sampled joint action each, and the first
    evaluation runs before step 1 (1.4.3 evaluates before its first batch). 1.4.3's
    optimizer: ``torch.optim.AdamW`` with its defaults (weight decay 0.01), no gradient
    clipping, data in order (no shuffling). 1.4.3's policy gradient differentiates the
    untempered log-probs (``update_temperature=1.0``); an early end's reward counts once
    (``hold_terminal_reward=False``); ``discount`` is ``gamma`` (the actor-critic TD
    targets; the group-baseline trainers set 1, see :func:`~comlrl.trainers.reinforce.magrpo.group_baseline_config`);
    early termination is decided per tree node, as 1.4.3 does. ``reference_kl_enabled``
    sets ``kl_coef = reference_kl_coef`` with the ``k3`` estimator.
    """
    batch = int(getattr(args, "train_batch_size", None) or args.rollout_buffer_size)
    steps = max(1, math.ceil(int(args.num_train_epochs) * num_examples / batch))
    eval_on = has_eval and int(args.eval_interval) > 0 and int(args.eval_num_samples) > 0
    top_k = getattr(args, "top_k", None)
    fields = {
        "num_agents": num_agents,
        **device_fields(args, num_agents),
        "max_new_tokens": int(args.max_new_tokens),
        "temperature": float(getattr(args, "temperature", 1.0)),
        "top_p": float(getattr(args, "top_p", 1.0)),
        "top_k": int(top_k or 0),
        "num_turns": int(args.num_turns),
        "gamma": float(getattr(args, "discount", 1.0)),
        "hold_terminal_reward": False,
        "update_temperature": 1.0,
        "early_termination_threshold": getattr(args, "early_termination_threshold", None),
        "termination_scope": "node",
        "learning_rate": float(args.agent_learning_rate),
        "optimizer": "adamw",
        "weight_decay": 0.01,
        "max_grad_norm": None,
        "batch_size": batch,
        "num_steps": steps,
        "shuffle": False,
        "eval_every": max(1, math.ceil(int(args.eval_interval) / batch)) if eval_on else 0,
        "eval_on_start": eval_on,
        "eval_greedy": False,
        "eval_num_samples": 1,
        "eval_limit": int(args.eval_num_samples) if eval_on else None,
        "log_samples": 0,
        "reward_curve": False,
    }
    if getattr(args, "reference_kl_enabled", False):
        fields.update(kl_coef=float(args.reference_kl_coef), kl_estimator="k3")
    return fields
