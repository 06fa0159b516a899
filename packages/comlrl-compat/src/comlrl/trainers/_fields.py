"""CoMLRL 1.4.3 config fields, checked and translated: the errors for what this package does
not implement, 1.4.3's checks of its config fields (run when a config is built, as 1.4.3's
``__post_init__``), its device fields as comlrl.algos' placement, and the fields every
trainer shares as :class:`comlrl.algos.TrainConfig` fields."""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "ADVANTAGE_MODES",
    "JOINT_MODES",
    "UnsupportedFieldError",
    "UnsupportedTrainerError",
    "check_common_fields",
    "check_config_fields",
    "common_train_config",
    "critic_device_names",
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


#: CoMLRL's ``advantage_mode`` -> our estimator name.
ADVANTAGE_MODES = {"mean": "grpo", "raw": "reinforce", "max": "remax", "rloo": "rloo"}
#: CoMLRL's ``joint_mode`` spellings -> ours.
JOINT_MODES = {"aligned": "align", "align": "align", "cross": "cross", "crossed": "cross"}


def _reject(args: Any, field: str, ok: bool, what: str) -> None:
    if not ok:
        raise UnsupportedFieldError(
            f"{type(args).__name__}.{field}={getattr(args, field)!r} is not supported by "
            f"comlrl.trainers: {what}"
        )


def check_config_fields(cfg: Any, *, critic_devices: bool = False) -> None:
    """The checks CoMLRL 1.4.3's configs make when built (call from ``__post_init__``):
    ``parallel_training`` is ``'none'`` (``'null'``, None) or ``'mp'`` (stored
    normalised), ``'mp'`` needs ``agent_devices`` (and, with ``critic_devices=True``,
    IAC/MAAC's ``critic_devices``), ``reference_kl_coef >= 0``, and ``reference_devices`` (when the KL
    is on) names 1 or ``num_agents`` devices.

    Raises:
        ValueError: naming the field.
    """
    raw = cfg.parallel_training
    mode = "none" if raw is None else str(raw).strip().lower()
    if mode in ("null", "none"):
        mode = "none"
    if mode not in ("none", "mp"):
        raise ValueError(
            f"parallel_training={raw!r}: use 'none' (all agents on one device) or 'mp' "
            "(agent i on agent_devices[i]), as in CoMLRL 1.4.3."
        )
    if mode == "mp":
        for field in ("agent_devices", "critic_devices") if critic_devices else ("agent_devices",):
            if getattr(cfg, field) is None:
                raise ValueError(
                    f"parallel_training='mp' needs {field} (one device, or one per model)."
                )
    cfg.parallel_training = mode
    coef = getattr(cfg, "reference_kl_coef", 0.0)
    if coef is not None and coef < 0:
        raise ValueError(f"reference_kl_coef must be >= 0, got {coef!r}")
    refs = getattr(cfg, "reference_devices", None)
    if getattr(cfg, "reference_kl_enabled", False) and refs is not None:
        if not isinstance(refs, str) and len(refs) not in (1, int(cfg.num_agents)):
            raise ValueError(
                f"reference_devices length ({len(refs)}) must be 1 or num_agents="
                f"{cfg.num_agents}: {list(refs)!r}"
            )


def check_common_fields(args: Any) -> None:
    """Raise :class:`UnsupportedFieldError` for settings we do not implement, and
    ``ValueError`` for device settings CoMLRL 1.4.3 also rejects."""
    check_config_fields(args)
    from comlrl.algos.models.devices import validate_devices

    fields = device_fields(args, int(args.num_agents))  # raises on a malformed spec
    fields["critic_devices"] = critic_device_names(args, int(args.num_agents))
    for field, names in fields.items():
        names = [names] if isinstance(names, str) else names
        if names is not None and names != ["auto"]:
            validate_devices(names, len(names), "agent_devices" if field == "device" else field)
    _reject(args, "eval_batch_size", args.eval_batch_size >= 1, "must be >= 1.")


def device_list(spec: Any, count: int, field: str) -> list[str] | None:
    """CoMLRL 1.4.3's device spec as one device name per model: ``None``/``"auto"`` ->
    ``None`` (our automatic choice), a string -> that device ``count`` times, a list of one
    -> repeated, a list of ``count`` -> as given.

    Raises:
        ValueError: an empty list, or a list whose length is neither 1 nor ``count``.
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
    """The :class:`~comlrl.algos.TrainConfig` placement fields for a CoMLRL 1.4.3 config:
    ``parallel_training='mp'`` puts agent ``i`` on ``agent_devices[i]`` (``agent_devices``
    in comlrl.algos; ``"auto"`` spreads the agents over the visible GPUs when there are
    enough, as 1.4.3 does), ``'none'`` (or one model) puts every agent on the first device
    named (or the automatic one); ``reference_devices`` places the KL reference copies
    when ``reference_kl_enabled``.

    Raises:
        ValueError: a malformed device list (see :func:`device_list`).
    """
    import torch

    if args.parallel_training == "mp" and num_agents > 1:
        names = device_list(args.agent_devices, num_agents, "agent_devices")
        if names is None and torch.cuda.is_available() and torch.cuda.device_count() >= num_agents:
            names = [f"cuda:{i}" for i in range(num_agents)]
    else:
        spec = args.agent_devices
        if spec is not None and not isinstance(spec, str):
            spec = list(spec)
            if not spec:
                raise ValueError(
                    "agent_devices must be a non-empty list, a device string or 'auto'."
                )
            spec = str(spec[0])
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


def critic_device_names(args: Any, num_agents: int) -> list[str] | None:
    """``critic_devices`` of a CoMLRL 1.4.3 actor-critic config as comlrl.algos'
    ``critic_devices``: IAC with separate critics, one device per agent (one device is
    repeated); MAAC (no ``use_separate_critic`` field), its one centralised critic's device;
    ``None`` (critics beside their agents / agent 0) when unset or, as in 1.4.3, for IAC
    value heads on the agents (``use_separate_critic=False``).

    Raises:
        ValueError: a list whose length is neither 1 nor the number of critics.
    """
    spec = getattr(args, "critic_devices", None)
    if spec is None:
        return None
    if not hasattr(args, "use_separate_critic"):
        return device_list(spec, 1, "critic_devices")
    if not args.use_separate_critic:
        return None
    return device_list(spec, num_agents, "critic_devices")


def one_device(args: Any, num_agents: int, trainer: str) -> str:
    """The single device of a trainer that keeps its agents together (preference recipes).

    Raises:
        UnsupportedFieldError: the settings place agents on several devices.
    """
    fields = device_fields(args, num_agents)
    fields.pop("reference_devices", None)
    if "agent_devices" in fields:
        raise UnsupportedFieldError(
            f"{type(args).__name__}.agent_devices={args.agent_devices!r} with "
            f"parallel_training='mp' is not supported by {trainer} here: its agents share one "
            "device; give one device (e.g. 'cuda:0')."
        )
    return str(fields["device"])


def common_train_config(
    args: Any, num_agents: int, num_examples: int, has_eval: bool
) -> dict[str, Any]:
    """The :class:`~comlrl.algos.TrainConfig` fields shared by every CoMLRL config."""
    batch = int(args.train_batch_size or args.rollout_buffer_size)
    steps = max(1, math.ceil(int(args.num_train_epochs) * num_examples / batch))
    eval_on = has_eval and int(args.eval_interval) > 0 and int(args.eval_num_samples) > 0
    return {
        "num_agents": num_agents,
        **device_fields(args, num_agents),
        "max_new_tokens": int(args.max_new_tokens),
        "temperature": float(args.temperature),
        "top_p": float(args.top_p),
        "top_k": int(args.top_k or 0),
        "num_turns": int(args.num_turns),
        "gamma": float(args.discount),
        "early_termination_threshold": args.early_termination_threshold,
        "termination_scope": "node",
        "learning_rate": float(args.agent_learning_rate),
        # CoMLRL 1.4.3: torch.optim.AdamW with its defaults (weight decay 0.01), no clipping
        "optimizer": "adamw",
        "weight_decay": 0.01,
        "max_grad_norm": None,
        "batch_size": batch,
        "num_steps": steps,
        "shuffle": False,
        "eval_every": max(1, math.ceil(int(args.eval_interval) / batch)) if eval_on else 0,
        "eval_greedy": False,
        "eval_num_samples": 1,
        "eval_limit": int(args.eval_num_samples) if eval_on else None,
        "log_samples": 0,
        "reward_curve": False,
        "kl_coef": float(args.reference_kl_coef) if args.reference_kl_enabled else 0.0,
    }
