"""CoMLRL 1.4.3's ``CentralizedMAGRPOConfig`` / ``CentralizedMAGRPOTrainer`` (module path
``comlrl.trainers.reinforce.centralized_magrpo``): one joint policy for every role."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from comlrl.trainers._centralized import JointRoleEvaluation
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer, accepts_legacy_fields
from comlrl.trainers.reinforce._centralized_hooks143 import CentralizedLossHooks143

__all__ = ["CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"]


@accepts_legacy_fields
@dataclass
class CentralizedMAGRPOConfig(MAGRPOConfig):
    """CoMLRL 1.4.3's ``CentralizedMAGRPOConfig``: :class:`MAGRPOConfig` with
    ``num_turns=1`` and ``collaboration_mode="centralized"``. ``num_agents`` is the role
    count; ``max_new_tokens`` is the budget of the whole joint response;
    ``num_generations`` counts joint responses.

    Raises:
        ValueError: as :class:`MAGRPOConfig`, ``collaboration_mode`` other than
            ``"centralized"`` or ``num_turns != 1``.
    """

    num_turns: int = 1
    collaboration_mode: str = "centralized"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.collaboration_mode != "centralized":
            raise ValueError(
                f"CentralizedMAGRPOConfig.collaboration_mode={self.collaboration_mode!r}; it "
                "must be 'centralized': centralized collaboration trains one joint policy (use "
                "MAGRPOConfig for separate agents)."
            )
        if self.num_turns != 1:
            raise ValueError(
                f"CentralizedMAGRPOConfig.num_turns={self.num_turns!r}; centralized MAGRPO is "
                "single-turn (num_turns=1), as in CoMLRL 1.4.3."
            )


class CentralizedMAGRPOTrainer(JointRoleEvaluation, CentralizedLossHooks143, MAGRPOTrainer):
    """CoMLRL 1.4.3's ``CentralizedMAGRPOTrainer``: one joint policy, trained with the
    MAGRPO objective on the task reward of its parsed role outputs.

    Per example, the roles' prompts (``formatters``, one per role) go through
    ``centralized_adapter.build_prompt(item, agent_prompts)`` into one prompt; the single
    policy samples ``num_generations`` joint responses of up to ``max_new_tokens`` tokens;
    ``centralized_adapter.parse_completion(completion, item, num_agents)`` splits each into
    the roles' outputs, which ``reward_func`` scores as one joint action (a response the
    adapter cannot parse gives every role ``""``). Advantages and the loss are
    :class:`MAGRPOTrainer`'s over every token of the joint response, up to and including
    its EOS. ``eval_logger`` receives the role outputs.

    Args:
        centralized_adapter: an object with ``build_prompt`` and ``parse_completion``
            (e.g. :class:`comlrl.trainers.preference.TaggedCentralizedComparatorAdapter`).
        num_agents: the role count; must equal ``args.num_agents``.
        agents: None, or a one-element list (the joint policy); or ``agent_model=``.
        tokenizer: one tokenizer (or a one-element list).
        reward_func, formatters: role-level, as :class:`MAGRPOTrainer` with ``num_agents``
            agents.
        args: a :class:`CentralizedMAGRPOConfig`.
        **kwargs: the other :class:`MAGRPOTrainer` arguments.

    Raises:
        ValueError: a non-centralized config, ``num_turns != 1``, ``num_agents !=
            args.num_agents``, several models or tokenizers, or no ``reward_func``.
        TypeError: an adapter without ``build_prompt`` / ``parse_completion``.
    """

    config_cls = CentralizedMAGRPOConfig
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
        from comlrl.trainers._callbacks import CompatReward, build_formatters
        from comlrl.trainers._centralized import centralized_callbacks, check_adapter

        config = args if args is not None else CentralizedMAGRPOConfig()
        if getattr(config, "collaboration_mode", None) != "centralized":
            raise ValueError(
                "CentralizedMAGRPOTrainer needs args=CentralizedMAGRPOConfig(...) "
                f"(collaboration_mode='centralized'), got {type(config).__name__}"
            )
        if config.num_turns != 1:
            raise ValueError(f"centralized MAGRPO is single-turn; got num_turns={config.num_turns}")
        if num_agents != config.num_agents:
            raise ValueError(
                f"num_agents={num_agents} but args.num_agents={config.num_agents}; both are "
                "the role count and must match."
            )
        if agents is not None and len(agents) != 1:
            raise ValueError(
                f"centralized MAGRPO trains exactly one actor (a joint policy); got {len(agents)} agents "
                "(pass agents=[model] or agent_model=)."
            )
        if isinstance(tokenizer, (list, tuple)) and len(tokenizer) != 1:
            raise ValueError(f"centralized MAGRPO takes one tokenizer, got {len(tokenizer)}")
        if not callable(reward_func):
            raise ValueError(f"reward_func must be a callable, got {reward_func!r}")
        check_adapter(centralized_adapter)
        self.centralized_adapter = centralized_adapter
        self.num_roles = num_agents
        role_formatters = build_formatters(formatters, num_agents)
        role_reward = CompatReward(
            reward_func, num_agents, role_formatters[0], kwargs.get("reward_processor")
        )
        joint_prompt, joint_reward = centralized_callbacks(
            lambda item: [f(item) for f in role_formatters],
            role_reward,
            num_agents,
            centralized_adapter,
        )
        self._joint_reward = joint_reward
        super().__init__(
            agents=agents,
            num_agents=1,
            tokenizer=tokenizer,
            reward_func=reward_func,
            formatters=[joint_prompt],
            args=config,
            **kwargs,
        )
        self.env.reward = joint_reward

    def _wandb_run_config(self) -> dict[str, Any]:
        """1.4.3's run config of centralized MAGRPO: ``algorithm="MAGRPO"`` (the config's
        ``collaboration_mode`` says it is centralized), ``num_roles`` and
        ``num_actor_models=1``, beside the config's fields."""
        return {**super()._wandb_run_config(), "algorithm": "MAGRPO",
                "num_roles": self.num_roles, "num_actor_models": 1}  # fmt: skip
