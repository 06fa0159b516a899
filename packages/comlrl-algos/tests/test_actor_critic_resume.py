"""Actor-critic step checkpoints: a resumed IAC/MAAC run continues bit for bit (actors,
critics, both kinds of optimizer, data order and random streams), and a checkpoint that
does not fit the run is refused."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.models.value import Critic
from comlrl.algos.recipes.actor_critic.recipe import ActorCriticConfig, IACTrainer, MAACTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.run import checkpoint as ckpt
from comlrl.core import RewardFunctionError

DATA = [{"id": i, "text": f"def f{i}(x):\n    return x + {i}"} for i in range(5)]


def _reward(c1: list[str], c2: list[str]) -> list[float]:
    return [-abs(len(a) - len(b)) / 50.0 for a, b in zip(c1, c2, strict=True)]


def _feedback(**kw: object) -> list[str]:
    completions = kw["agent_completions"]
    assert isinstance(completions, list)
    return [f"# teammate wrote {len(c)} chars\n" for c in reversed(completions)]


def _trainer(tok, out: Path, method: str, mode: str, reward=_reward, **overrides):  # type: ignore[no-untyped-def]
    """Two tiny agents, two turns; 5 examples in batches of 2, so epochs straddle steps."""
    settings = dict(
        num_steps=4,
        batch_size=2,
        num_generations=1,
        num_turns=2,
        max_new_tokens=6,
        learning_rate=1e-2,
        critic_learning_rate=3e-2,
        gae_lambda=0.9,
        critic_mode=mode,
        output_dir=str(out),
        progress=False,
        parallel_agents=False,
        log_samples=0,
        seed=5,
        save_every=2,
    )
    cfg = ActorCriticConfig(**{**settings, **overrides})
    torch.manual_seed(0)
    agents = [
        HFAgent(build_default_model(len(tok), seed=i), tok, name=f"agent_{i}") for i in range(2)
    ]
    critics = None
    if mode == "separate":
        count = 2 if method == "iac" else 1
        critics = [
            Critic(build_default_model(len(tok), seed=10 + i), tok, kind=cfg.critic_type)
            for i in range(count)
        ]
    cls = IACTrainer if method == "iac" else MAACTrainer
    return cls(
        agents,
        cfg,
        critics=critics,
        dataset=DATA,
        reward_func=reward,
        formatters=[lambda ex: ex["text"], lambda ex: ex["text"] + "\n# test"],
        transition=_feedback,
    )


@pytest.mark.parametrize(
    ("method", "mode", "kind"),
    [("iac", "shared", "v"), ("maac", "separate", "q")],
    ids=["iac-shared-v", "maac-separate-q"],
)
def test_a_resumed_actor_critic_run_continues_bit_for_bit(
    tiny_tokenizer, tmp_path: Path, method: str, mode: str, kind: str
) -> None:  # type: ignore[no-untyped-def]
    """Resumed at step 2 with freshly built agents and critics, the run gives exactly the
    uninterrupted run's rows 3 and 4 and the same final weights (same ops on the same
    thread: no tolerance needed)."""
    full = _trainer(tiny_tokenizer, tmp_path / "full", method, mode, critic_type=kind)
    want = full.train()
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "full", copy)
    shutil.rmtree(copy / "final")
    shutil.rmtree(copy / "checkpoints" / "step-000004")
    random.seed(1234)  # scramble what the checkpoint must restore
    torch.manual_seed(1234)
    resumed = _trainer(tiny_tokenizer, copy, method, mode, critic_type=kind)
    resumed.data.next_batch(3)
    with torch.no_grad():  # move a critic so that its weights must come back too
        for p in resumed.critics[0].head.parameters():
            p.add_(0.5)
    assert resumed.resume(copy / "checkpoints" / "step-000002") == 2
    rows = [json.loads(x) for x in (copy / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2], "rows after the checkpoint go"
    got = resumed.train()
    assert [r["step"] for r in got] == [3, 4]
    for g, w in zip(got, want[2:], strict=True):
        critic_keys = [k for k in w if k.startswith(("critic/", "value_loss/"))]
        keys = ["reward_mean", "loss/agent_0", "loss/agent_1", "grad_norm/agent_1", *critic_keys]
        assert len(keys) > 4, "the rows carry critic metrics"
        for key in keys:
            assert g[key] == w[key], (g["step"], key, g[key], w[key])
    for a, b in zip(resumed.critics, full.critics, strict=True):
        for x, y in zip(a.head.state_dict().values(), b.head.state_dict().values(), strict=True):
            assert torch.equal(x, y)
        if not a.shared:
            for x, y in zip(a.trunk.parameters(), b.trunk.parameters(), strict=True):
                assert torch.equal(x, y)
    for a, b in zip(resumed.agents, full.agents, strict=True):
        for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True):
            assert torch.equal(x, y)


def test_resume_refuses_a_checkpoint_of_another_method_or_kind(
    tiny_tokenizer, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    run = _trainer(tiny_tokenizer, tmp_path / "a", "iac", "shared", num_steps=1, save_every=1)
    run.train()
    path = tmp_path / "a" / "checkpoints" / "step-000001"
    state = torch.load(path / ckpt.STATE_FILE, weights_only=True)
    assert set(state["critics"]) >= {"heads", "trunks", "optimizers"}
    other = _trainer(tiny_tokenizer, tmp_path / "b", "iac", "shared", critic_type="q")
    with pytest.raises(ckpt.CheckpointError, match="critic_type='v'; this run is IAC"):
        other.resume(path)
    state.pop("critics")
    torch.save(state, path / ckpt.STATE_FILE)
    again = _trainer(tiny_tokenizer, tmp_path / "c", "iac", "shared")
    with pytest.raises(ckpt.CheckpointError, match="holds no critic state"):
        again.resume(path)


@pytest.mark.parametrize(("method", "kind"), [("iac", "v"), ("maac", "q")])
def test_the_fused_critic_forward_changes_no_number(
    tiny_tokenizer, tmp_path: Path, method: str, kind: str
) -> None:  # type: ignore[no-untyped-def]
    """With one iteration and no micro-batching the sampling-time values come from the
    value loss's own forward; a micro-batch size above the batch turns that off without
    changing any other computation, so both runs must give the same rows and weights."""

    fused = _trainer(tiny_tokenizer, tmp_path / "f", method, "separate", critic_type=kind)
    plain = _trainer(
        tiny_tokenizer, tmp_path / "p", method, "separate", critic_type=kind, micro_batch_size=999
    )
    assert fused._can_fuse_critic_forward() and not plain._can_fuse_critic_forward()
    for _ in range(2):
        a, b = fused.step().row, plain.step().row
        keys = [k for k in a if not k.startswith(("time/", "tokens_per_s", "prompts_per_s"))]
        assert any(k.startswith(("critic/", "value_loss")) for k in keys)
        for key in keys:
            # Same ops on the same inputs; a forward with and without autograd recording
            # gives the same float32 numbers here, so only round-off of order 1e-7 may differ.
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
    for x, y in zip(fused.critics, plain.critics, strict=True):
        for p, q in zip(x.trunk.parameters(), y.trunk.parameters(), strict=True):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("method", "mode"), [("iac", "shared"), ("maac", "separate")])
def test_the_single_forward_actor_update_at_g1_changes_no_number(
    tiny_tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, mode: str
) -> None:  # type: ignore[no-untyped-def]
    """With G = 1 the actors' log-probs come from one forward over prompt and completion
    instead of the shared-prefix split (prompt, then completion over its KV cache); both
    compute the same function, so the rows and the actors' weights must agree."""
    from comlrl.algos.recipes.actor_critic import recipe as actor_critic_setup

    single = _trainer(tiny_tokenizer, tmp_path / "s", method, mode)
    assert single.actors.update_settings.shared_prefix is False
    monkeypatch.setattr(actor_critic_setup, "actor_update_settings", lambda settings, g: settings)
    split = _trainer(tiny_tokenizer, tmp_path / "p", method, mode)
    assert split.actors.update_settings.shared_prefix is True
    for _ in range(2):
        a, b = single.step().row, split.step().row
        keys = [k for k in a if not k.startswith(("time/", "tokens_per_s", "prompts_per_s"))]
        for key in keys:
            # Same maths, different op order (one attention over prompt + completion vs a
            # cached prefix): float32 round-off of order 1e-7 relative, grown a little
            # by two optimizer steps at lr 1e-2.
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), key
    for x, y in zip(single.agents, split.agents, strict=True):
        for p, q in zip(x.model.parameters(), y.model.parameters(), strict=True):
            torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("method", "mode"), [("iac", "shared"), ("maac", "separate")])
def test_a_step_that_fails_before_its_updates_is_drawn_again_on_resume(
    tiny_tokenizer, tmp_path: Path, method: str, mode: str
) -> None:  # type: ignore[no-untyped-def]
    """A reward function that raises in the middle of a run (save_every=0): the loop driver
    checkpoints the last completed step, and that checkpoint must hold the data and random
    streams as that step left them (the failed step put them back), so the resumed run
    draws the failed step's batch again and gives exactly the uninterrupted run's rows."""
    want = _trainer(tiny_tokenizer, tmp_path / "full", method, mode, save_every=0).train()
    calls: list[int] = []

    def flaky(c1: list[str], c2: list[str]) -> list[float]:
        calls.append(1)
        if len(calls) == 5:  # a few calls in: inside step 2 or 3, whatever the turns
            raise ZeroDivisionError("a rare branch of the reward")
        return _reward(c1, c2)

    out = tmp_path / "broken"
    with pytest.raises(RewardFunctionError, match="a rare branch"):
        _trainer(tiny_tokenizer, out, method, mode, reward=flaky, save_every=0).train()
    saved = ckpt.latest_checkpoint(out)
    assert saved is not None, "the last completed step was checkpointed"
    resumed = _trainer(tiny_tokenizer, out, method, mode, save_every=0)
    k = resumed.resume(saved)
    got = resumed.train()
    assert k >= 1 and [r["step"] for r in got] == [r["step"] for r in want[k:]]
    for g, w in zip(got, want[k:], strict=True):
        for key in ("reward_mean", "loss/agent_0", "loss/agent_1"):
            assert g[key] == w[key], (g["step"], key, g[key], w[key])
