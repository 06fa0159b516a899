"""CoMLRL 1.4.3's ``CentralizedMAGRPOConfig`` / ``CentralizedMAGRPOTrainer``: one joint
policy writes every role's output (:mod:`comlrl.algos`' centralized collaboration:
:func:`comlrl.algos.centralized_callbacks`), trained as a one-agent MAGRPO run, as
``comlrl train algo=centralized_magrpo`` does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer

__all__ = ["CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"]


@dataclass
class CentralizedMAGRPOConfig(MAGRPOConfig):
    """:class:`MAGRPOConfig` with ``num_turns=1`` and ``collaboration_mode="centralized"``;
    ``num_agents`` counts roles, ``max_new_tokens`` bounds the whole joint response and
    ``num_generations`` counts joint responses.

    Raises:
        ValueError: as :class:`MAGRPOConfig`; ``collaboration_mode`` other than
            ``"centralized"``; ``num_turns != 1``.
    """

    num_turns: int = 1
    collaboration_mode: str = "centralized"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.collaboration_mode != "centralized":
            raise ValueError(
                f"collaboration_mode={self.collaboration_mode!r}; CentralizedMAGRPOConfig "
                "trains one joint policy ('centralized'); use MAGRPOConfig for separate agents."
            )
        if self.num_turns != 1:
            raise ValueError(f"num_turns={self.num_turns!r}; centralized MAGRPO is single-turn.")


class CentralizedMAGRPOTrainer(MAGRPOTrainer):
    """CoMLRL 1.4.3's ``CentralizedMAGRPOTrainer``: per example, the roles' prompts
    (``formatters``, one per role) go through ``centralized_adapter.build_prompt(item,
    agent_prompts)`` into one prompt; the one policy samples ``num_generations`` joint
    responses, ``centralized_adapter.parse_completion(completion, item, num_agents)``
    splits each into the roles' outputs (all ``""`` when it cannot), and ``reward_func``
    scores them as one joint action. Advantages and loss: :class:`MAGRPOTrainer`'s.

    Args:
        centralized_adapter: an object with ``build_prompt`` and ``parse_completion``
            (e.g. :class:`comlrl.algos.TaggedRoles`).
        num_agents: the role count; must equal ``args.num_agents``.
        agents: None or one model (the joint policy); or ``agent_model=``.
        tokenizer: one tokenizer.
        reward_func, formatters: role-level, as :class:`MAGRPOTrainer`'s.
        args: a :class:`CentralizedMAGRPOConfig`.
        **kwargs: the other :class:`MAGRPOTrainer` arguments.

    Raises:
        ValueError: a non-centralized config, ``num_agents != args.num_agents``, several
            models or tokenizers, or no callable ``reward_func``.
        TypeError: an adapter without ``build_prompt`` / ``parse_completion``.
    """

    config_cls = CentralizedMAGRPOConfig
    accepted_config = CentralizedMAGRPOConfig
    algorithm_name = "CentralizedMAGRPO"

    def __init__(
        self,
        *,
        centralized_adapter: Any,
        num_agents: int = 2,
        agents: Sequence[Any] | None = None,
        tokenizer: Any = None,
        reward_func: Callable[..., Any] | None = None,
        formatters: Any = None,
        args: Any = None,
        **kwargs: Any,
    ) -> None:
        from comlrl.algos import centralized_callbacks, check_role_format
        from comlrl.trainers.environment import CompatReward, build_formatters

        config = args if args is not None else CentralizedMAGRPOConfig()
        if not isinstance(config, CentralizedMAGRPOConfig):
            raise ValueError(
                "CentralizedMAGRPOTrainer needs args=CentralizedMAGRPOConfig(...) "
                f"(collaboration_mode='centralized'), got {type(config).__name__}"
            )
        if num_agents != config.num_agents:
            raise ValueError(
                f"num_agents={num_agents} but args.num_agents={config.num_agents}; both count "
                "the roles and must match."
            )
        if agents is not None and len(agents) != 1:
            raise ValueError(
                f"centralized MAGRPO trains one joint policy; got {len(agents)} agents "
                "(pass agents=[model] or agent_model=)."
            )
        if isinstance(tokenizer, (list, tuple)) and len(tokenizer) != 1:
            raise ValueError(f"centralized MAGRPO takes one tokenizer, got {len(tokenizer)}")
        if reward_func is None or not callable(reward_func):
            raise ValueError(f"reward_func must be a callable, got {reward_func!r}")
        check_role_format(centralized_adapter)
        self.centralized_adapter = centralized_adapter
        self.num_roles = num_agents
        roles = build_formatters(formatters, num_agents)
        role_reward = CompatReward(
            reward_func, num_agents, roles[0], kwargs.pop("reward_processor", None)
        )
        joint_prompt, self.joint_reward = centralized_callbacks(
            lambda item: [f(item) for f in roles], role_reward, num_agents, centralized_adapter
        )
        super().__init__(
            agents=agents,
            num_agents=1,
            tokenizer=tokenizer,
            reward_func=self.joint_reward,
            formatters=[joint_prompt],
            args=config,
            **kwargs,
        )
