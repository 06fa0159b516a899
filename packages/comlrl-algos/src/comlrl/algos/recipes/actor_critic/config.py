"""The actor-critic recipes' config (:class:`ActorCriticConfig`: the critic's settings on top
of :class:`~comlrl.algos.training.config.rl.RLConfig`) and where critics live
(:func:`critic_placement`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import torch
from comlrl.algos.training.config.rl import ConfigError, RLConfig
from pydantic import Field, model_validator

__all__ = [
    "Method",
    "ActorCriticConfig",
    "planned_agent_devices",
    "critic_placement",
]


Method = Literal["iac", "maac"]


_GROUP_BASELINE_ONLY = (
    "is a setting of the group-baseline recipes (algo=magrpo, marloo, maremax, mareinforce); "
    "IAC/MAAC measure advantages against their critic: drop it"
)
_CHUNK_SCHEDULE = (
    "is a schedule of the group-baseline recipes; IAC/MAAC take one step per agent on the "
    "whole rollout: drop it"
)


class ActorCriticConfig(RLConfig):
    """:class:`~comlrl.algos.training.config.rl.RLConfig` plus the critic's settings (IAC, MAAC).

    ``learning_rate`` is the actors'; ``clip_ratio`` is the actors' PPO clip against the
    behaviour log-probs (needed for ``num_iterations > 1``). ``num_generations`` defaults
    to 1 (one trajectory per prompt, CoMLRL 1.4.3's setting); any ``G`` works. The critic
    is the baseline: the group-baseline fields (``estimator``, ``advantage_scale``,
    ``advantage_eps``, ``advantage_stats``, ``advantage_group``, ``update_chunk_nodes``,
    ``update_chunk_split_turns``) are not fields here, and giving one is an error that
    says so.
    """

    foreign_fields: ClassVar[dict[str, str]] = {
        "estimator": f"estimator {_GROUP_BASELINE_ONLY}",
        "advantage_scale": f"advantage_scale {_GROUP_BASELINE_ONLY}",
        "advantage_eps": f"advantage_eps {_GROUP_BASELINE_ONLY}",
        "advantage_stats": f"advantage_stats {_GROUP_BASELINE_ONLY}",
        "advantage_group": f"advantage_group {_GROUP_BASELINE_ONLY}",
        "update_chunk_nodes": f"update_chunk_nodes {_CHUNK_SCHEDULE}",
        "update_chunk_split_turns": f"update_chunk_split_turns {_CHUNK_SCHEDULE}",
        "role_format": "role_format is a setting of the group-baseline recipes (one model for "
        "every role: algo=centralized_magrpo), MADPO and MARLHF; IAC/MAAC train one model per "
        "agent: drop it",
    }

    num_generations: int = Field(1, ge=1, description="G, completions per prompt per agent.")
    clip_ratio: float | None = Field(
        0.2, gt=0, description="Actor PPO clip epsilon; None = no clip."
    )
    critic_learning_rate: float | None = Field(
        None, gt=0, description="Critic learning rate per optimizer step; None = learning_rate."
    )
    value_loss_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    value_clip_range: float | None = Field(
        None,
        gt=0,
        description="Clip new values to within this of the sampling-time values "
        "(reward units); None = no clipping.",
    )
    gae_lambda: float = Field(
        1.0,
        ge=0,
        le=1,
        description="GAE lambda: 1 = Monte Carlo returns minus the value, 0 = one-step TD error.",
    )
    critic_type: Literal["v", "q"] = Field(
        "v",
        description="v: V(prompt) read at the last prompt token; q: Q(prompt, "
        "completion) read at the last response token.",
    )
    critic_mode: Literal["separate", "shared"] = Field(
        "separate",
        description="IAC: a separate critic model per agent, or a value head on "
        "the actor's own model (shared trunk). MAAC's centralised critic is always separate.",
    )
    critic_model: str | None = Field(
        None,
        description="Model (HF id, path or built-in name) of separate critics; None = "
        "the agent's own model (MAAC: agent 0's).",
    )
    value_head_hidden_dim: int | None = Field(
        None, ge=1, description="Hidden layer width of the value head; None = linear head."
    )
    advantage_normalization: bool = Field(
        True,
        description="Whiten each agent's advantages over the step (mean 0, std 1; "
        "skipped with a single advantage).",
    )
    critic_max_length: int | None = Field(
        None, ge=1, description="Cut critic inputs to their last N tokens; None = no cut."
    )
    critic_devices: list[str] | None = Field(
        None,
        description="Where the critics live: IAC one device per agent (critic i on device "
        "i), MAAC one device for the centralised critic. None: each critic beside its agent "
        "(MAAC: beside agent 0). A value head on the actor's trunk (critic_mode='shared') "
        "lives with its actor, so there it may only repeat the agents' devices.",
    )

    @model_validator(mode="after")
    def _ac_consistent(self) -> ActorCriticConfig:
        if self.kl_mode == "reward":
            raise ValueError(
                "kl_mode='reward' is a setting of the group-baseline recipes (algo=magrpo, "
                "marloo, maremax, mareinforce); IAC/MAAC take the reference KL as a loss term: "
                "set kl_mode=loss."
            )
        if self.critic_mode == "shared" and self.critic_model is not None:
            raise ValueError(
                f"critic_model={self.critic_model!r} names a separate critic but "
                "critic_mode='shared' puts the value head on the actor; drop one of them."
            )
        if self.critic_devices is not None:
            from comlrl.algos.models.devices import validate_devices

            count = len(self.critic_devices)
            if count not in (1, self.num_agents):
                raise ValueError(
                    f"critic_devices lists {count} devices for num_agents={self.num_agents}; "
                    f"give one per agent for IAC (e.g. {[f'cuda:{i}' for i in range(self.num_agents)]})"
                    " or one for MAAC's centralised critic (e.g. ['cuda:0'])."
                )
            validate_devices(self.critic_devices, count, "critic_devices")
            if self.critic_mode == "shared":
                agents = self.agent_devices or (
                    [self.device] * self.num_agents if self.device != "auto" else None
                )
                if agents is not None and count == self.num_agents:
                    for i, (c, a) in enumerate(zip(self.critic_devices, agents, strict=True)):
                        if _same_device(c, a):
                            continue
                        raise ValueError(
                            f"critic_devices[{i}]={c!r} but agent {i} lives on {a!r}, and "
                            "critic_mode='shared' puts its value head on that agent's own "
                            "model; drop critic_devices or use critic_mode='separate'."
                        )
        return self

    @property
    def baseline_label(self) -> str:
        """``"v-critic"`` or ``"q-critic"`` (the baseline, for titles)."""
        return f"{self.critic_type}-critic"

    @property
    def critic_lr(self) -> float:
        """The critic's learning rate (``critic_learning_rate`` or ``learning_rate``)."""
        return (
            self.critic_learning_rate
            if self.critic_learning_rate is not None
            else self.learning_rate
        )


def _same_device(a: str, b: str) -> bool:
    """Whether two device names name one device (``cuda`` is ``cuda:0``)."""
    x, y = torch.device(a.strip()), torch.device(b.strip())
    return x.type == y.type and (x.index or 0) == (y.index or 0)


def planned_agent_devices(config: RLConfig, num_agents: int) -> list[torch.device]:
    """Where setup will place each agent (``agent_devices``, else ``device``), without
    moving anything, so critic placement can be checked before any model moves.

    Raises:
        ConfigError: ``agent_devices`` that do not fit (see
            :func:`comlrl.algos.models.devices.validate_devices`).
    """
    from comlrl.algos.models.devices import agent_placement
    from comlrl.algos.training.update.agents import resolve_device

    try:
        return agent_placement(num_agents, config.agent_devices, resolve_device(config.device))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def critic_placement(
    config: ActorCriticConfig, method: Method, agent_devices: Sequence[torch.device]
) -> list[torch.device]:
    """The device of each critic: IAC critic ``i`` on ``critic_devices[i]`` (default: agent
    ``i``'s device), MAAC's one critic on ``critic_devices[0]`` (default: agent 0's). Moves
    nothing; call it before any model is placed.

    Args:
        config: the run's config (``critic_devices``, ``critic_mode``).
        method: ``"iac"`` or ``"maac"``.
        agent_devices: ``A`` devices, where each agent is (or will be) placed.

    Raises:
        ConfigError: ``critic_devices`` does not list one device per critic (``A`` for
            IAC, 1 for MAAC), names a device this machine lacks, or puts a value head on
            a trunk shared with its actor (``critic_mode="shared"``) anywhere but on that
            actor's device.
    """
    from comlrl.algos.models.devices import validate_devices

    count = len(agent_devices) if method == "iac" else 1
    names = config.critic_devices
    if names is None:
        return list(agent_devices[:count])
    if len(names) != count:
        raise ConfigError(
            f"{method.upper()} has {count} critic{'s' if count != 1 else ''} but "
            f"critic_devices={names!r}; "
            + (
                "give one device per agent (critic i beside or apart from agent i)."
                if method == "iac"
                else "give one device for the centralised critic, e.g. ['cuda:0']."
            )
        )
    try:
        devices = validate_devices(names, count, "critic_devices")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if method == "iac" and config.critic_mode == "shared":
        for i, (c, a) in enumerate(zip(devices, agent_devices, strict=True)):
            if not _same_device(str(c), str(a)):
                raise ConfigError(
                    f"critic_devices[{i}]={names[i]!r} but agent {i} is on {str(a)!r}, and "
                    "critic_mode='shared' puts its value head on that agent's own model; drop "
                    "critic_devices or use critic_mode='separate'."
                )
    return devices
