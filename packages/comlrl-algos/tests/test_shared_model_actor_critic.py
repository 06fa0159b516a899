"""IAC and MAAC agents that share one model object: one optimizer step per training step.

Issue 20 finding 6 on the actor-critic path. Agents on one model object take one optimizer
step (one set of Adam moments) on the sum of their actor losses, as the group-baseline
recipe does (``test_shared_model_update.py``); with value heads on that model
(``critic_mode="shared"``) the step also holds the sum of their value losses, and
separate critics that share a trunk take one critic step on the sum of theirs.

The reference step is computed by hand: each agent's (or critic's) gradient alone, on a
copy of the starting weights, through the single-agent update with SGD at ``lr=0`` and no
clipping; their sum, clipped to ``max_grad_norm`` over every parameter of the step; one
``torch.optim.AdamW`` step with the run's learning rates.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.models.value import Critic, ValueHead, hidden_size_of
from comlrl.algos.recipes.actor_critic import recipe
from comlrl.algos.recipes.actor_critic.critic import critic_inputs
from comlrl.algos.recipes.actor_critic.critic_updates import (
    update_critic,
    update_critics,
    update_shared,
)
from comlrl.algos.recipes.actor_critic.recipe import ActorCriticConfig, IACTrainer, MAACTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.update.policy import update_policy
from comlrl.algos.training.update.shared_models import sharing_groups

DATA = [{"id": i, "text": f"def f{i}(x):\n    return x + {i}"} for i in range(4)]
LR, CRITIC_LR, MAX_NORM = 1e-2, 3e-2, 1.0
# Adam's first step moves every weight by about lr * sign(g); two steps move it about
# twice as far, so a bug shows as differences of ~lr = 1e-2 (and a second set of moments
# as a second step). The hand-computed step adds the same float32 gradients in another
# order (one backward accumulating both losses vs. two backwards summed after), which
# differs by round-off; Adam's g / (sqrt(v) + eps) turns that into at most ~lr times the
# relative round-off of the smallest gradients. Measured worst differences: 1.6e-6 (value
# heads on the shared trunk, critic_type v), 7.9e-7 (q), 0.0 for actors without heads and
# for critics; 1e-5 leaves a 6x margin and sits 1000x below the bug's ~1e-2.
ATOL = 1e-5


def _reward(c1: list[str], c2: list[str]) -> list[float]:
    return [float(len(a) - len(b)) / 4 for a, b in zip(c1, c2, strict=True)]


def _perturb(module: Any, seed: int) -> None:
    """Random weights for a value head (a new head outputs 0 with zero weights, which
    would give the trunk no value gradient)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def _config(out: Path, **overrides: Any) -> ActorCriticConfig:
    fields: dict[str, Any] = {
        "num_steps": 1, "batch_size": 2, "num_generations": 2, "num_turns": 1,
        "max_new_tokens": 4, "optimizer": "adamw", "learning_rate": LR,
        "critic_learning_rate": CRITIC_LR, "max_grad_norm": MAX_NORM,
        "output_dir": str(out), "progress": False, "log_samples": 0,
        "parallel_agents": False, "seed": 0,
    }  # fmt: skip
    fields.update(overrides)
    return ActorCriticConfig(**fields)


def _count_steps(run: Any) -> list[tuple[str, int]]:
    """Wrap every optimizer's ``step`` to record ``("actor"|"critic", index)``."""
    steps: list[tuple[str, int]] = []
    optimizers = [("actor", i, o) for i, o in enumerate(run.optimizers)]
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


def _capture_advantages(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Record the step's critic values, advantages and targets."""
    seen: dict[str, Any] = {}
    original = recipe.critic_advantages

    def recording(ro: Any, values: Any, *args: Any, **kwargs: Any) -> Any:
        adv, targets = original(ro, values, *args, **kwargs)
        seen.update(values=values, adv=adv, targets=targets)
        return adv, targets

    monkeypatch.setattr(recipe, "critic_advantages", recording)
    return seen


def _grads(params: list[torch.nn.Parameter], update: Any, sgd: Any) -> list[torch.Tensor]:
    """The gradient one single-agent update steps on (its optimizer ``sgd``: SGD at lr=0
    that records it, as the update frees the gradients after the step)."""
    for p in params:
        p.grad = None
    opt = sgd(params)
    update(opt)
    return opt.grads(params)  # type: ignore[no-any-return]


def _adamw_step(
    groups: list[tuple[list[torch.nn.Parameter], float]], grads: list[torch.Tensor]
) -> None:
    """One AdamW step on ``grads`` (flat, in the groups' order), clipped to MAX_NORM."""
    params = [p for ps, _ in groups for p in ps]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
    torch.optim.AdamW([{"params": ps, "lr": lr} for ps, lr in groups], weight_decay=0.0).step()


def _sum(*grads: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.stack(gs).sum(0) for gs in zip(*grads, strict=True)]


def _assert_same_weights(got: list[torch.nn.Parameter], want: list[torch.nn.Parameter]) -> float:
    worst = max(float((g - w).detach().abs().max()) for g, w in zip(got, want, strict=True))
    assert worst < ATOL, f"weights differ from one summed step by up to {worst:.3g}"
    return worst


def _texts(ro: Any, method: Literal["iac", "maac"], kind: str, c: int) -> list[str]:
    return [s for turn in ro.turns for s in critic_inputs(turn, method, kind, c)]


def _one_model_agents(tok: Any) -> tuple[Any, list[HFAgent]]:
    model = build_default_model(len(tok), seed=0)
    return model, [HFAgent(model, tok, name=f"agent_{i}") for i in range(2)]


@pytest.mark.parametrize("kind", ["v", "q"])
def test_iac_value_heads_on_one_shared_model_take_one_step_on_the_summed_losses(
    tiny_tokenizer: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: Literal["v", "q"],
    recording_sgd: Any,
) -> None:
    model, agents = _one_model_agents(tiny_tokenizer)
    cfg = _config(tmp_path, critic_mode="shared", critic_type=kind, value_head_hidden_dim=None)
    trainer = IACTrainer(
        agents, cfg, dataset=DATA, reward_func=_reward,
        formatters=[lambda ex: ex["text"], lambda ex: ex["text"] + "\n# second"],
    )  # fmt: skip
    run = trainer
    heads = [c.head for c in run.critics]
    assert heads[0] is not heads[1]  # IAC: each agent its own critic head, one trunk
    for i, head in enumerate(heads):
        _perturb(head, seed=11 + i)
    start_model, start_heads = copy.deepcopy(model), copy.deepcopy(heads)
    steps = _count_steps(run)
    seen = _capture_advantages(monkeypatch)
    result = run.step()

    assert steps == [("actor", 0)]  # one step, on the first sharer's optimizer
    opt = run.optimizers[0]
    assert run.optimizers[1].state == {}  # one set of Adam moments
    stepped = {id(p) for g in opt.param_groups for p in g["params"]}
    assert all(id(p) in stepped for p in [*model.parameters(), *heads[0].parameters(),
                                          *heads[1].parameters()])  # fmt: skip
    assert all(int(s["step"]) == 1 for s in opt.state.values())
    assert len(opt.state) == len(stepped)

    # by hand: each agent's policy + coef * value gradient alone, summed, one AdamW step
    ro, adv = result.rollout, seen["adv"]
    assert ro is not None
    old = [torch.cat(v) for v in seen["values"]]
    tgt = [torch.cat(t) for t in seen["targets"]]
    settings = dataclasses.replace(run.actors.update_settings, max_grad_norm=None)
    params = [*start_model.parameters(), *start_heads[0].parameters(), *start_heads[1].parameters()]
    per_agent = []
    for a in range(2):
        critic = Critic(start_model, tiny_tokenizer, start_heads[a], kind=kind, shared=True)
        per_agent.append(
            _grads(
                params,
                lambda o, a=a, critic=critic: update_shared(
                    start_model,
                    critic,
                    o,
                    ro.agent_batches(a),
                    [t[a] for t in adv],
                    settings,
                    _texts(ro, "iac", kind, a),
                    old[a],
                    tgt[a],
                    coef=cfg.value_loss_coef,
                    clip_range=cfg.value_clip_range,
                ),
                recording_sgd,
            )  # fmt: skip
        )
    head_params = [*start_heads[0].parameters(), *start_heads[1].parameters()]
    _adamw_step([(list(start_model.parameters()), LR), (head_params, CRITIC_LR)], _sum(*per_agent))
    _assert_same_weights(
        [*model.parameters(), *heads[0].parameters(), *heads[1].parameters()], params
    )
    row = result.row
    assert row["loss/agent_0"] == row["loss/agent_1"]  # the one summed loss that was stepped
    # each agent's own value loss: its head on its own texts
    assert row["value_loss/agent_0"] != row["value_loss/agent_1"]


def _actor_reference(
    run: Any, start_model: Any, ro: Any, adv: Any, sgd: Any
) -> list[torch.nn.Parameter]:
    settings = dataclasses.replace(run.actors.update_settings, max_grad_norm=None)
    params = list(start_model.parameters())
    per_agent = [
        _grads(
            params,
            lambda o, a=a: update_policy(
                start_model, o, ro.agent_batches(a), [t[a] for t in adv], settings
            ),
            sgd,
        )
        for a in range(2)
    ]
    _adamw_step([(params, LR)], _sum(*per_agent))
    return params


@pytest.mark.parametrize("critics_share", [False, True])
def test_iac_separate_critics_with_actors_on_one_model(
    tiny_tokenizer: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    critics_share: bool,
    recording_sgd: Any,
) -> None:
    """The actors take one step; separate critics on one trunk take one critic step on
    their summed value losses, critics on their own trunks one each."""
    model, agents = _one_model_agents(tiny_tokenizer)
    trunk = build_default_model(len(tiny_tokenizer), seed=5)
    trunks = [trunk, trunk] if critics_share else [trunk, copy.deepcopy(trunk)]
    size = hidden_size_of(trunk)
    critics = [Critic(t, tiny_tokenizer, ValueHead(size), kind="v") for t in trunks]
    for i, c in enumerate(critics):
        _perturb(c.head, seed=21 + i)
    trainer = IACTrainer(
        agents, _config(tmp_path, critic_mode="separate"), critics=critics, dataset=DATA,
        reward_func=_reward,
        formatters=[lambda ex: ex["text"], lambda ex: ex["text"] + "\n# second"],
    )  # fmt: skip
    run = trainer
    start_model, start_critics = copy.deepcopy(model), copy.deepcopy(critics)
    steps = _count_steps(run)
    seen = _capture_advantages(monkeypatch)
    result = run.step()

    want = [("actor", 0), ("critic", 0)] + ([] if critics_share else [("critic", 1)])
    assert Counter(steps) == Counter(want)
    assert run.optimizers[1].state == {}
    _assert_same_weights(
        list(model.parameters()),
        _actor_reference(run, start_model, result.rollout, seen["adv"], recording_sgd),
    )
    # critics by hand: each critic's value gradient alone; summed where they share a trunk
    ro = result.rollout
    old = [torch.cat(v) for v in seen["values"]]
    tgt = [torch.cat(t) for t in seen["targets"]]
    cfg = run.config
    groups = [[0, 1]] if critics_share else [[0], [1]]
    for members in groups:
        params = list({id(p): p for m in members for p in start_critics[m].parameters()}.values())
        per_critic = [
            _grads(
                params,
                lambda o, m=m: update_critic(
                    start_critics[m],
                    o,
                    _texts(ro, "iac", "v", m),
                    old[m],
                    tgt[m],
                    coef=cfg.value_loss_coef,
                    clip_range=cfg.value_clip_range,
                    max_grad_norm=None,
                ),
                recording_sgd,
            )  # fmt: skip
            for m in members
        ]
        _adamw_step([(params, CRITIC_LR)], _sum(*per_critic))
        got = list({id(p): p for m in members for p in critics[m].parameters()}.values())
        _assert_same_weights(got, params)
    if critics_share:
        opt = run.critic_optimizers[0]
        assert opt is not None and all(int(s["step"]) == 1 for s in opt.state.values())
        assert len(opt.state) == len(params)  # trunk and both heads: one set of moments


def test_maac_actors_on_one_model_take_one_step_on_the_summed_losses(
    tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recording_sgd: Any
) -> None:
    model, agents = _one_model_agents(tiny_tokenizer)
    critic = Critic(build_default_model(len(tiny_tokenizer), seed=9), tiny_tokenizer, kind="v")
    trainer = MAACTrainer(
        agents, _config(tmp_path, critic_mode="separate"), critics=[critic], dataset=DATA,
        reward_func=_reward,
        formatters=[lambda ex: ex["text"], lambda ex: ex["text"] + "\n# second"],
    )  # fmt: skip
    run = trainer
    start_model = copy.deepcopy(model)
    steps = _count_steps(run)
    seen = _capture_advantages(monkeypatch)
    result = run.step()
    assert Counter(steps) == Counter([("actor", 0), ("critic", 0)])
    assert run.optimizers[1].state == {}
    _assert_same_weights(
        list(model.parameters()),
        _actor_reference(run, start_model, result.rollout, seen["adv"], recording_sgd),
    )


def test_sharing_groups_group_by_identity_in_first_index_order() -> None:
    a, b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    assert sharing_groups([a, b, a]) == [[0, 2], [1]]
    assert sharing_groups([b, copy.deepcopy(b)]) == [[0], [1]]  # equal weights: not shared
    assert sharing_groups([]) == []


def test_a_separate_critic_on_an_agents_model_is_refused(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """Its own optimizer would step the actor's weights a second time."""
    from comlrl.algos.training.config.rl import ConfigError

    model, agents = _one_model_agents(tiny_tokenizer)
    critics = [Critic(model, tiny_tokenizer, kind="v") for _ in agents]
    with pytest.raises(ConfigError, match="critic 0 is separate but its trunk is an agent's"):
        IACTrainer(
            agents, _config(tmp_path, critic_mode="separate"), critics=critics, dataset=DATA,
            reward_func=_reward, formatters=[lambda ex: ex["text"]] * 2,
        )  # fmt: skip


def test_update_critics_wants_one_of_each_per_critic(tiny_tokenizer: Any) -> None:
    critic = Critic(build_default_model(len(tiny_tokenizer), seed=1), tiny_tokenizer, kind="v")
    opt = torch.optim.SGD(list(critic.parameters()), lr=0.0)
    with pytest.raises(ValueError, match="2 critics but 1 text lists"):
        update_critics(
            [critic, critic], opt, [["a"]], [torch.zeros(1)] * 2, [torch.zeros(1, 1)] * 2
        )
    with pytest.raises(ValueError, match="critic 1: 1 texts but old_values"):
        update_critics(
            [critic, critic], opt, [["a"], ["b"]], [torch.zeros(1), torch.zeros(2)],
            [torch.zeros(1, 1)] * 2,
        )  # fmt: skip
