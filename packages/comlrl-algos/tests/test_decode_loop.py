"""The fixed-shape decode loop (StaticDecodeLoop) draws the eager loop's tokens.

On CPU the loop runs the step a CUDA graph would capture, eagerly: the same fixed-shape
forward over a static KV cache, the same sampling, log-prob and EOS/stop bookkeeping on
the device, host looks every ``check_every`` steps. It must give the eager loop's tokens
from the same random streams, leave the streams where the eager loop leaves them, and
show a stop hook the same tokens. Log-probs: the fixed-shape step attends over every
cache slot (the unwritten ones masked) and the eager CPU step is the C++ one, so the
logits differ by float32 rounding (~1e-6 of the largest |logit|); log-probs are checked
at 1e-5 absolute (|logits| < ~10 for these tiny random models).

The ``cuda``-marked tests run the same comparisons with the step captured as a CUDA graph.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.environment import CallbackEnvironment
from comlrl.algos.rollout.sampling.native import NativeSampler
from comlrl.algos.rollout.tool_calls import sample_with_tools
from comlrl.algos.rollout.toolbox import ToolBox
from comlrl.algos.rollout.tree import TreeSettings, rollout
from comlrl.core import SamplingParams, Tool

from .test_decode import _tiny

IDS = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12], [0, 0, 0, 4, 4]])
MASK = (IDS != 0).long()

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _streams(per_prompt: bool, seed: int = 5) -> torch.Generator | list[torch.Generator]:
    if per_prompt:
        return [torch.Generator().manual_seed(seed + p) for p in range(IDS.shape[0])]
    return torch.Generator().manual_seed(seed)


def _next_draws(gen: torch.Generator | list[torch.Generator]) -> list[torch.Tensor]:
    """The streams' next numbers: equal only if the streams are in the same state."""
    gens = [gen] if isinstance(gen, torch.Generator) else gen
    return [torch.rand(4, generator=g) for g in gens]


def _run(
    model: Any,
    loop: str,
    params: SamplingParams,
    *,
    eos: Sequence[int] = (1,),
    per_prompt: bool = False,
    device: str = "cpu",
    **kw: Any,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], NativeSampler]:
    sampler = NativeSampler(model, pad_token_id=0, eos_token_ids=list(eos), decode_loop=loop, **kw)
    ids, mask = IDS.to(device), MASK.to(device)
    # the first call checks the fast decode step against the model's forward (eagerly)
    sampler.sample(ids, mask, SamplingParams(num_generations=2, max_new_tokens=3), None)
    gen = _streams(per_prompt)
    if device != "cpu":
        gen = [torch.Generator(device=device).manual_seed(5 + p) for p in range(3)]
    tokens, logp = sampler.sample(ids, mask, params, gen)
    return tokens, logp, _next_draws(gen), sampler


def _assert_same(a: Any, b: Any, atol: float = 1e-5) -> None:
    assert a[0].shape == b[0].shape, (a[0].shape, b[0].shape)
    assert torch.equal(a[0], b[0])
    valid = a[0] != 0
    torch.testing.assert_close(a[1][valid], b[1][valid], rtol=0, atol=atol)
    for x, y in zip(a[2], b[2], strict=True):
        assert torch.equal(x, y)  # the streams end in the same state


@pytest.mark.parametrize(
    ("kind", "params", "check_every", "per_prompt"),
    [
        ("llama", SamplingParams(num_generations=3, max_new_tokens=20), 8, False),
        ("qwen2", SamplingParams(num_generations=3, max_new_tokens=20), 1, True),
        (
            "qwen2",
            SamplingParams(
                num_generations=2, max_new_tokens=17, temperature=0.7, top_k=20, top_p=0.9
            ),
            3,
            False,
        ),
        ("mistral", SamplingParams(num_generations=2, max_new_tokens=9, top_p=0.8), 4, True),
    ],
)
def test_the_fixed_shape_loop_draws_the_eager_loops_tokens(
    kind: str, params: SamplingParams, check_every: int, per_prompt: bool
) -> None:
    model = _tiny(kind)
    eager = _run(model, "eager", params, per_prompt=per_prompt)
    static = _run(model, "static", params, per_prompt=per_prompt, check_every=check_every)
    assert static[3].decode_loop_status == "static" and static[3].fast_decode_status == "on"
    _assert_same(eager, static)


@pytest.mark.parametrize("check_every", [1, 3, 8])
def test_rows_that_end_early_end_the_loop_where_the_eager_loop_ends(check_every: int) -> None:
    """Many EOS ids: every row ends within a few steps; the fixed-shape loop runs on to its
    next look, then drops those steps and puts the streams back."""
    model = _tiny("llama")
    params = SamplingParams(num_generations=3, max_new_tokens=30)
    eos = list(range(3, 40))
    eager = _run(model, "eager", params, eos=eos)
    static = _run(model, "static", params, eos=eos, check_every=check_every)
    assert eager[0].shape[1] < params.max_new_tokens  # the loop did stop early
    _assert_same(eager, static)


def test_a_stop_hook_sees_the_eager_loops_tokens_and_stops_the_same_rows() -> None:
    """A hook that stops a row at a token divisible by 7 (as a stop sequence or a closed
    tool call would): the same calls with the same tokens, the same stopped rows."""

    def hook(calls: list[list[int]]) -> Any:
        def stop(token: torch.Tensor) -> torch.Tensor:
            calls.append(token.tolist())
            return torch.tensor([t % 7 == 0 and t != 0 for t in token.tolist()])

        return stop

    model = _tiny("llama")
    params = SamplingParams(num_generations=3, max_new_tokens=30)
    out = {}
    for loop in ("eager", "static"):
        calls: list[list[int]] = []
        sampler = NativeSampler(
            model, pad_token_id=0, eos_token_ids=list(range(3, 30)), decode_loop=loop, check_every=3
        )
        sampler.sample(IDS, MASK, SamplingParams(num_generations=2, max_new_tokens=3))
        gens = _streams(True)
        tokens, logp = sampler.sample(IDS, MASK, params, gens, hook(calls))
        out[loop] = (tokens, logp, _next_draws(gens), calls)
    _assert_same(out["eager"], out["static"])
    assert out["eager"][3] == out["static"][3]
    assert any(t % 7 == 0 and t != 0 for call in out["eager"][3] for t in call)  # it did stop rows


def test_the_model_forward_over_a_static_cache_draws_the_eager_loops_tokens() -> None:
    """Without the fast decode step the fixed-shape loop runs the model's own forward over
    transformers' StaticCache (the path of architectures the fast step does not cover)."""
    model = _tiny("qwen2")
    params = SamplingParams(num_generations=2, max_new_tokens=12, top_k=30)
    eager = _run(model, "eager", params, fast_decode=False)
    static = _run(model, "static", params, fast_decode=False, check_every=4)
    assert static[3].decode_loop_status == "static"
    _assert_same(eager, static)


def test_a_cache_the_static_loop_cannot_hold_decodes_eagerly_and_says_why() -> None:
    """Sliding-window layers (Mistral) through the model's forward: transformers' static
    cache holds full-attention layers only, so the eager loop decodes and says why."""
    model = _tiny("mistral", sliding_window=64)
    sampler = NativeSampler(
        model, pad_token_id=0, eos_token_ids=[1], decode_loop="static", fast_decode=False
    )
    tokens, _ = sampler.sample(IDS, MASK, SamplingParams(num_generations=2, max_new_tokens=6))
    assert tokens.shape == (6, 6)
    assert sampler.decode_loop_status.startswith("eager: ")
    assert "SlidingWindow" in sampler.decode_loop_status


def test_an_unknown_decode_loop_is_refused() -> None:
    with pytest.raises(ValueError, match="decode_loop must be one of"):
        NativeSampler(_tiny("llama"), pad_token_id=0, eos_token_ids=[1], decode_loop="graph")


def _agents(tiny_tokenizer: Any, loop: str) -> list[HFAgent]:
    from comlrl.algos.models.loading import build_default_model

    agents = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer, name=f"a{i}")
        for i in range(2)
    ]
    for i, agent in enumerate(agents):
        agent.seed(100 + i)
        assert agent.sampler is not None
        agent.sampler.decode_loop = loop
    return agents


def test_a_multi_turn_rollout_is_the_same_with_either_loop(tiny_tokenizer: Any) -> None:
    """Two turns: the second turn's prompts hold the first turn's feedback (longer,
    differently padded prompts); every turn samples the same completions."""

    def env() -> CallbackEnvironment:
        def transition(  # type: ignore[no-untyped-def]
            prompt,
            agent_completions,
            num_agents,
            prompt_history_per_agent,
            response_history_per_agent,
        ):
            return [f"{prompt} -> {agent_completions[a][:12]} # again" for a in range(num_agents)]

        def reward(c1: list[str], c2: list[str]) -> list[float]:
            return [float(len(a) % 5 + len(b) % 3) for a, b in zip(c1, c2, strict=True)]

        return CallbackEnvironment(
            [lambda ex: ex["prompt"], lambda ex: ex["prompt"] + " # main"], reward, transition
        )

    examples = [{"id": i, "prompt": f"def f{i}(x):"} for i in range(2)]
    params = SamplingParams(num_generations=2, max_new_tokens=10)
    rollouts = {}
    for loop in ("eager", "static"):
        agents = _agents(tiny_tokenizer, loop)
        rollout(agents, examples, env(), params, TreeSettings(num_turns=1))  # the check call
        rollouts[loop] = rollout(agents, examples, env(), params, TreeSettings(num_turns=2))
    a, b = rollouts["eager"], rollouts["static"]
    assert len(a.turns) == len(b.turns) == 2
    for ta, tb in zip(a.turns, b.turns, strict=True):
        for sa, sb in zip(ta.agents, tb.agents, strict=True):
            assert sa.texts() == sb.texts()
            assert torch.equal(sa.batch.input_ids, sb.batch.input_ids)
            m = sa.batch.completion_mask
            torch.testing.assert_close(
                sa.batch.behaviour_logprobs[m], sb.batch.behaviour_logprobs[m], rtol=0, atol=1e-5
            )


def test_tool_sampling_is_the_same_with_either_loop(tiny_tokenizer: Any) -> None:
    """sample_with_tools hands the sampler its stop hook (call detection, token budgets):
    the fixed-shape loop gives it the same tokens as the eager loop."""
    tool = Tool(
        "echo",
        "Repeat the text.",
        {"type": "object", "properties": {"text": {"type": "string"}}},
        run=lambda text="": text,
    )
    out = []
    for loop in ("eager", "static"):
        agent = _agents(tiny_tokenizer, loop)[0]
        box = ToolBox((tool,), fallback_format="python")
        prompts = ["def f(x):", "print(1"]
        params = SamplingParams(num_generations=2, max_new_tokens=12)
        sample_with_tools(agent, prompts, params, box)  # the check call
        out.append(sample_with_tools(agent, prompts, params, box))
    assert out[0].texts() == out[1].texts()
    assert torch.equal(out[0].batch.input_ids, out[1].batch.input_ids)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("fast", [True, False])
def test_on_cuda_the_graph_draws_the_eager_loops_tokens(kind: str, fast: bool) -> None:
    model = _tiny(kind).cuda()
    params = SamplingParams(num_generations=3, max_new_tokens=24, top_p=0.9)
    eager = _run(model, "eager", params, device="cuda", fast_decode=fast)
    graph = _run(model, "auto", params, device="cuda", fast_decode=fast)
    assert graph[3].decode_loop_status == "static (CUDA graph)", graph[3].graph_off
    _assert_same(eager, graph)


class _Syncing(torch.nn.Module):
    """A causal LM whose forward reads a value back to the host (``float``): a step that
    cannot be captured as a CUDA graph."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.inner = model
        self.config = model.config

    def forward(self, **kwargs: Any) -> Any:
        out = self.inner(**kwargs)
        if float(out.logits.abs().max()) < 0:  # a host read inside the step
            raise AssertionError
        return out


@pytest.mark.cuda
@needs_cuda
def test_on_cuda_a_step_that_cannot_be_captured_falls_back_and_says_why_once() -> None:
    model = _Syncing(_tiny("qwen2").cuda()).eval()
    params = SamplingParams(num_generations=2, max_new_tokens=12)
    eager = _run(model, "eager", params, device="cuda", fast_decode=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        graph = _run(model, "auto", params, device="cuda", fast_decode=False)
    assert graph[3].graph_off is not None and graph[3].graph_off.startswith("failed")
    assert sum("could not be captured" in str(w.message) for w in seen) == 1
    _assert_same(eager, graph)
