"""``comlrl.trainers``' IAC/MAAC given one model object for several agents (moved from
comlrl-algos' ``test_shared_model_actor_critic.py`` with the compat layer)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.actor_critic import recipe


def _reward(c1: list[str], c2: list[str]) -> list[float]:
    return [float(len(a) - len(b)) / 4 for a, b in zip(c1, c2, strict=True)]


def _count_steps(run: Any) -> list[tuple[str, int]]:
    """Wrap every optimizer's ``step`` to record ``("actor"|"critic", index)``."""
    steps: list[tuple[str, int]] = []
    optimizers = [("actor", i, o) for i, o in enumerate(run.base.optimizers)]
    optimizers += [("critic", i, o) for i, o in enumerate(run.critic_optimizers) if o is not None]
    seen: set[int] = set()
    for kind, i, opt in optimizers:
        if id(opt) in seen:  # one optimizer object listed twice is counted once
            continue
        seen.add(id(opt))
        original = opt.step

        def counted(*a: Any, _k: str = kind, _i: int = i, _s: Any = original, **kw: Any) -> Any:
            steps.append((_k, _i))
            return _s(*a, **kw)

        opt.step = counted  # type: ignore[method-assign]
    return steps


@pytest.mark.parametrize("setting", ["iac_heads", "iac_one_critic_model", "maac"])
def test_compat_trainers_with_agents_on_one_model_take_one_step(
    tiny_tokenizer: Any, setting: str
) -> None:
    """``comlrl.trainers``' IAC/MAAC given one model object for both agents (and, for
    separate IAC critics, one critic model object for both critics) step it once."""
    from comlrl.trainers import IACConfig, IACTrainer, MAACConfig, MAACTrainer

    torch.manual_seed(0)
    model = build_default_model(len(tiny_tokenizer), seed=0)
    common: dict[str, Any] = dict(
        num_turns=1, num_train_epochs=1, max_new_tokens=4, rollout_buffer_size=2,
        num_generations=2, agent_devices="cpu", critic_devices="cpu",
    )  # fmt: skip
    kwargs: dict[str, Any] = dict(
        agents=[model, model], tokenizer=tiny_tokenizer, reward_func=_reward,
        train_dataset=[{"prompt": "def f(x):"}, {"prompt": "def g(y):"}],
    )  # fmt: skip
    trainer: Any
    if setting == "iac_heads":
        trainer = IACTrainer(args=IACConfig(use_separate_critic=False, **common), **kwargs)
        want = [("actor", 0)]
    elif setting == "iac_one_critic_model":
        critic = build_default_model(len(tiny_tokenizer), seed=3)
        trainer = IACTrainer(args=IACConfig(**common), critics=[critic, critic], **kwargs)
        want = [("actor", 0), ("critic", 0)]
    else:
        critic = build_default_model(len(tiny_tokenizer), seed=3)
        trainer = MAACTrainer(args=MAACConfig(**common), critics=[critic], **kwargs)
        want = [("actor", 0), ("critic", 0)]
    trainer._run  # noqa: B018 (builds the run)
    run = trainer._ac_run
    steps = _count_steps(run)
    recipe.step(run)
    assert Counter(steps) == Counter(want)
    assert run.base.optimizers[1].state == {}
    assert all(int(s["step"]) == 1 for s in run.base.optimizers[0].state.values())
