"""Where each agent lives: one device per agent (model parallel over agents).

``agent_devices: [cuda:0, cuda:1]`` puts agent ``i``'s model on device ``i``, like
CoMLRL's ``parallel_training="mp"``. Each agent then samples, computes log-probs and
takes its optimizer step on its own device (``HFAgent.sample`` encodes prompts on the
model's device; :func:`comlrl.algos.training.update.policy.update_policy` moves the agent's batches and
advantages to it). What crosses agents stays off the devices: completions are decoded to
text, the joint reward is computed from text, and returns and advantages are built on
the CPU before each agent's update moves its own share over.

Nothing here allocates on a device: :func:`validate_devices` only asks torch how many
devices of a kind exist, so the checks run (and are tested) on CPU-only machines by
faking ``torch.cuda.device_count``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["parse_device", "device_exists", "validate_devices", "agent_placement", "model_device"]


def parse_device(name: str) -> torch.device:
    """``name`` as a :class:`torch.device`.

    Raises:
        ValueError: ``name`` is not a device string (e.g. ``"cuda:x"``, ``"auto"``).
    """
    if not isinstance(name, str) or name.strip() == "auto":
        raise ValueError(
            f"device {name!r} is not a device name; use e.g. 'cpu', 'cuda:0', 'cuda:1' "
            "('auto' is only valid for the single `device` field)."
        )
    try:
        return torch.device(name.strip())
    except RuntimeError as exc:
        raise ValueError(
            f"device {name!r} is not a device name ({exc}); use e.g. 'cpu' or 'cuda:0'."
        ) from None


def device_exists(device: torch.device) -> bool:
    """Whether ``device`` exists on this machine (CUDA: ``index < torch.cuda.device_count()``).

    Other accelerator kinds (``mps``, ``xpu``, ...) are checked through ``torch.<kind>``'s
    ``is_available`` / ``device_count`` where torch has them.
    """
    if device.type in ("cpu", "meta"):
        return True
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return (device.index or 0) < count
    backend = getattr(torch, device.type, None) or getattr(torch.backends, device.type, None)
    if backend is None or not getattr(backend, "is_available", lambda: False)():
        return False
    count = getattr(backend, "device_count", lambda: 1)()
    return (device.index or 0) < count


def validate_devices(
    names: Sequence[str], num_agents: int, field: str = "agent_devices"
) -> list[torch.device]:
    """Check a per-agent device list before anything loads; returns the devices.

    Args:
        names: one device name per agent.
        num_agents: ``A``.
        field: the config field, for the message.

    Raises:
        ValueError: not exactly ``A`` names, a name that is not a device, or a device this
            machine does not have (with the count it has).
    """
    if len(names) != num_agents:
        raise ValueError(
            f"{field} lists {len(names)} devices for num_agents={num_agents}; give exactly "
            f"one device per agent, e.g. {[f'cuda:{i}' for i in range(num_agents)]}."
        )
    devices = [parse_device(n) for n in names]
    for name, dev in zip(names, devices, strict=True):
        if not device_exists(dev):
            cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise ValueError(
                f"{field}: device {name!r} does not exist on this machine ({cuda} CUDA "
                f"device{'s' if cuda != 1 else ''} visible); use devices that exist or 'cpu'."
            )
    return devices


def agent_placement(
    num_agents: int, agent_devices: Sequence[str] | None, default: torch.device
) -> list[torch.device]:
    """Device of each agent: ``agent_devices`` when given (validated), else ``default`` for all.

    Raises:
        ValueError: see :func:`validate_devices`.
    """
    if agent_devices is None:
        return [default] * num_agents
    return validate_devices(agent_devices, num_agents)


def model_device(model: Any) -> torch.device:
    """Device of a model's first parameter (``model.device`` for parameter-free wrappers)."""
    params = getattr(model, "parameters", None)
    if params is not None:
        for p in params():
            return torch.device(p.device)
    return torch.device(model.device)
