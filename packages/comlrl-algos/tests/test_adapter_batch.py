"""LoRA agents on one base in one batch: decoding, sampling and updating together.

The fast decode step's per-block LoRA is checked against peft's own mixed-adapter batches
(``adapter_names=``) on the same rows; agents sampling together must draw the tokens they
draw one by one (and leave their streams in the same state); the joint update must give
every adapter the gradient of its own loss. Tolerances: float32 rounding. Together the
prompts are padded to the longest agent's prompt, so the attention and the GEMMs over the
prompt run over more (masked) positions and sum in another order: logits agree to ~1e-6
of their scale, which over 20 decode steps of these randomly perturbed adapters moves
log-probs by up to ~1e-3 (measured 9e-4) while every drawn token stays the same;
gradients (SGD with lr 1, so the step is the clipped gradient) agree to 1e-5.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from comlrl.algos import HFAgent, load_model_and_tokenizer
from comlrl.algos.models.hf_cache import output_cache
from comlrl.algos.models.loading import STORIES260K
from comlrl.algos.rollout.environment import CallbackEnvironment
from comlrl.algos.rollout.sampling.fast_decode.decoder import FastDecoder
from comlrl.algos.rollout.shared_base import sample_together, sampling_units
from comlrl.algos.rollout.tree import TreeSettings, rollout
from comlrl.algos.training.update.agents import build_optimizer
from comlrl.algos.training.update.policy import update_adapters, update_policy
from comlrl.algos.training.update.settings import UpdateSettings
from comlrl.core import SamplingParams

pytest.importorskip("peft", reason="LoRA needs peft: pip install 'comlrl-algos[lora]'")

from comlrl.algos.models.lora import LoraSettings, attach_lora  # noqa: E402
from comlrl.algos.models.lora_policy import AdapterBatch  # noqa: E402

PROMPTS = [
    ["Once upon a time", "The cat"],
    ["A dog ran", "Lily saw a big"],
    ["Tom", "One day, a little girl named"],
]


def _agents(n: int = 3, *, batch: bool = True, loop: str = "auto", **lora: Any) -> list[HFAgent]:
    """``n`` LoRA agents of one stories260k base, adapters perturbed apart, each seeded."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agents = [HFAgent(*load_model_and_tokenizer(STORIES260K), name=f"a{i}") for i in range(n)]
        attach_lora(agents, LoraSettings(batch_agents=batch, **lora), seed=0)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for agent in agents:
            for p in agent.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    for i, agent in enumerate(agents):
        agent.seed(100 + i)
        assert agent.sampler is not None
        agent.sampler.decode_loop = loop
    return agents


@pytest.mark.parametrize("target", [["q_proj", "v_proj"], "all-linear"])
def test_the_fast_steps_lora_equals_peft_mixed_adapter_batches(target: Any) -> None:
    """Rows of three agents in one batch: the fast step (per-block LoRA, fused q|k|v with a
    block-diagonal B) against peft's forward with ``adapter_names`` (one name per row)."""
    agents = _agents(target_modules=target)
    view = AdapterBatch.of([a.model for a in agents])
    shared = agents[0].model.shared
    p, g, steps = 3, 2, 5  # one prompt per agent, two rows each
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (p, 6), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding on the second agent's prompt
    new = torch.randint(3, 500, (p * g, steps), generator=gen)
    view.eval()
    with torch.no_grad():
        out = view(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
        )
        assert FastDecoder.unsupported_reason(view) is None
        fast = FastDecoder(view)
        start = mask.sum(-1, keepdim=True).repeat_interleave(g, dim=0)
        fast.start(output_cache(out), mask, g, start + torch.arange(steps), 6 + steps)
        got = torch.stack([fast.step(new[:, t]) for t in range(steps)], dim=1)
        full_ids = torch.cat([ids.repeat_interleave(g, 0), new], dim=1)
        full_mask = torch.cat([mask.repeat_interleave(g, 0), torch.ones_like(new)], dim=1)
        names = [f"agent_{i // g}" for i in range(p * g)]
        ref = shared.peft_model(
            input_ids=full_ids,
            attention_mask=full_mask,
            position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0),
            adapter_names=names,
        ).logits[:, 6:]
        ours = view(
            input_ids=full_ids,
            attention_mask=full_mask,
            position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0),
        ).logits[:, 6:]
    assert fast.native_status.startswith("off: LoRA")
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)  # our hooks are peft's API
    scale = float(ref.abs().max())
    assert float((got - ref).abs().max()) < 1e-5 * scale
    # and each block really is its own agent's: the blocks' adapters differ
    assert float((ref[0:2] - ref[2:4]).abs().max()) > 1e-3 * scale


@pytest.mark.parametrize("loop", ["eager", "static"])
@pytest.mark.parametrize("keyed", [False, True])
def test_agents_on_one_base_sample_together_what_they_sample_alone(loop: str, keyed: bool) -> None:
    params = SamplingParams(num_generations=3, max_new_tokens=20)
    together, alone = _agents(loop=loop), _agents(loop=loop)
    keys = [[11 * a + n for n in range(2)] for a in range(3)] if keyed else None
    for _ in range(2):  # the first call checks the fast step; the second is the loop's
        joint = sample_together(together, PROMPTS, params, keys)
        single = [
            a.sample(p, params, keys[i] if keys else None)
            for i, (a, p) in enumerate(zip(alone, PROMPTS, strict=True))
        ]
        for j, s in zip(joint, single, strict=True):
            assert j.texts() == s.texts()
            assert torch.equal(j.batch.input_ids, s.batch.input_ids)
            assert torch.equal(j.batch.attention_mask, s.batch.attention_mask)
            m = s.batch.completion_mask
            torch.testing.assert_close(
                j.batch.behaviour_logprobs[m], s.batch.behaviour_logprobs[m], rtol=0, atol=2e-3
            )
    for a, b in zip(together, alone, strict=True):  # each agent's stream where alone
        assert a.generator is not None and b.generator is not None
        assert torch.equal(a.generator.get_state(), b.generator.get_state())
    sampler = together[0].model.shared.cache[("batched_sampler", ("agent_0", "agent_1", "agent_2"))]
    assert sampler.fast_decode_status == "on"
    assert sampler.decode_loop_status == (
        "static" if loop == "static" else "eager: decode_loop='eager'"
    )


def test_a_rollout_samples_the_adapters_of_one_base_in_one_call() -> None:
    env = CallbackEnvironment(
        [lambda ex: ex["prompt"]] * 3,
        lambda c1, c2, c3: [float(len(a) % 3) for a in c1],
    )
    examples = [{"prompt": "Once upon a time"}, {"prompt": "The dog"}]
    params = SamplingParams(num_generations=2, max_new_tokens=8)
    batched, separate = _agents(), _agents(batch=False)
    assert sampling_units(batched) == [[0, 1, 2]]
    assert sampling_units(separate) == [[0], [1], [2]]
    calls: list[int] = []

    def counted(fn: Any, n: int) -> list[Any]:
        calls.append(n)
        return [fn(i) for i in range(n)]

    a = rollout(batched, examples, env, params, TreeSettings(), map_agents=counted)
    b = rollout(separate, examples, env, params, TreeSettings())
    assert calls == [1]
    for x, y in zip(a.turns[0].agents, b.turns[0].agents, strict=True):
        assert x.texts() == y.texts()


@pytest.mark.parametrize(
    "settings",
    [
        UpdateSettings(),
        UpdateSettings(
            loss_reduction="token_mean", micro_batch_size=3, clip_ratio=0.2, num_iterations=2
        ),
    ],
)
def test_the_joint_update_gives_every_adapter_the_gradient_of_its_own_loss(
    settings: UpdateSettings,
) -> None:
    """SGD with lr 1: an agent's step is its (clipped) gradient; the joint update's must
    equal each agent's own update's, and so must its metrics."""
    params = SamplingParams(num_generations=3, max_new_tokens=12)
    sampled = _agents()
    samples = [a.sample(p, params) for a, p in zip(sampled, PROMPTS, strict=True)]
    advantages = [torch.randn(6, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    result = {}
    for mode in ("alone", "joint"):
        agents = _agents()
        before = [torch.cat([p.detach().flatten() for p in a.model.parameters()]) for a in agents]
        opts = [build_optimizer(a.model.parameters(), "sgd", lr=1.0) for a in agents]
        if mode == "alone":
            stats = [
                update_policy(a.model, o, [s.batch], [adv], settings)
                for a, o, s, adv in zip(agents, opts, samples, advantages, strict=True)
            ]
        else:
            stats = update_adapters(
                [a.model for a in agents],
                opts,
                [[s.batch] for s in samples],
                [[adv] for adv in advantages],
                settings,
            )
        steps = [
            torch.cat([p.detach().flatten() for p in a.model.parameters()]) - b
            for a, b in zip(agents, before, strict=True)
        ]
        result[mode] = (steps, stats)
    for a in range(3):
        alone, joint = result["alone"][0][a], result["joint"][0][a]
        assert float(alone.abs().max()) > 1e-3  # the agent did move
        torch.testing.assert_close(joint, alone, rtol=0, atol=1e-5)
        sa, sj = result["alone"][1][a], result["joint"][1][a]
        assert set(sa) == set(sj)
        for key in sa:
            assert sj[key] == pytest.approx(sa[key], rel=1e-4, abs=1e-6), key


def test_adapters_of_different_bases_do_not_batch() -> None:
    a, b = _agents(2), _agents(2)
    with pytest.raises(ValueError, match="different bases"):
        AdapterBatch.of([a[0].model, b[1].model])
    with pytest.raises(ValueError, match="cannot sample in one batch"):
        sample_together([a[0], b[1]], PROMPTS[:2], SamplingParams(num_generations=1))
    assert sampling_units([a[0], b[1]]) == [[0], [1]]


def test_a_batch_whose_rows_do_not_split_into_the_adapter_blocks_is_refused() -> None:
    view = AdapterBatch.of([a.model for a in _agents(2)])
    with pytest.raises(ValueError, match="does not split into 2 adapter blocks"):
        view(input_ids=torch.tensor([[1, 403, 261]]))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_agents_sampling_together_in_the_graph_draw_what_they_draw_alone() -> None:
    params = SamplingParams(num_generations=3, max_new_tokens=20)
    together, alone = _agents(), _agents()
    for agents in (together, alone):
        for i, agent in enumerate(agents):
            agent.model.to("cuda")
            agent.seed(100 + i)
    for _ in range(2):  # the check, then the captured loop
        joint = sample_together(together, PROMPTS, params)
        single = [a.sample(p, params) for a, p in zip(alone, PROMPTS, strict=True)]
        for j, s in zip(joint, single, strict=True):
            assert torch.equal(j.batch.input_ids, s.batch.input_ids)
    sampler = together[0].model.shared.cache[("batched_sampler", ("agent_0", "agent_1", "agent_2"))]
    assert sampler.decode_loop_status == "static (CUDA graph)", sampler.graph_off
