"""Generation backends: the native backend through the interface, and the vLLM backend's
contract checked on CPU with a fake engine (vLLM-shaped outputs built from dataclasses).

The fake engine has the methods :class:`VLLMBackend` calls on ``vllm.LLM``
(``generate`` and the four weight-transfer methods) and returns ``RequestOutput`` /
``CompletionOutput`` / ``Logprob``-shaped records. A real engine is exercised only where
vLLM and a CUDA GPU are present (the last test).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from comlrl.algos.models.logprobs import completion_logprobs
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.sampling.backends import GenerationBackend, NativeBackend
from comlrl.algos.rollout.sampling.collate import policy_batch
from comlrl.algos.rollout.sampling.draw import filtered_scores, sample_next
from comlrl.algos.rollout.sampling.vllm_api import (
    VLLMApi,
    assemble_outputs,
    vllm_unavailable_reason,
)
from comlrl.algos.rollout.sampling.vllm_backend import VLLMBackend
from comlrl.algos.rollout.sampling.vllm_weights import EngineSyncClient
from comlrl.core import SamplingParams
from hypothesis import given, settings
from hypothesis import strategies as st

PROMPTS = ["Once upon a time", "The cat sat"]  # different token lengths: left padding


# --- vLLM-shaped records ----------------------------------------------------------------
@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: None
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclass
class FakeSamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    logprobs: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    load_inplace: bool = False


FAKE_API = VLLMApi(sampling_params=FakeSamplingParams, lora_request=FakeLoRARequest)


class ModelEngine:
    """A fake ``vllm.LLM`` that samples from its own copy of a model (full forward per
    token, the tempered softmax, the native sampler's top-k/top-p), stops on
    ``stop_token_ids`` and returns ``n`` completions per prompt in *reversed* index order
    (the backend must order them). Weight updates replace its copy's parameters. Its
    log-probs are vLLM's ``processed_logprobs``: those of the distribution after
    temperature, top-k and top-p, renormalised over the kept tokens."""

    def __init__(self, model: Any) -> None:
        self.model = copy.deepcopy(model).eval()
        self.calls: list[tuple[list[dict[str, Any]], list[FakeSamplingParams], Any]] = []
        self.transfer_log: list[str] = []
        self._pending: dict[str, torch.Tensor] = {}

    # weight transfer (the LLM methods EngineSyncClient forwards to)
    def init_weight_transfer_engine(self, request: dict[str, Any]) -> None:
        self.transfer_log.append(f"init:{sorted(request['init_info'])}")

    def start_weight_update(self) -> None:
        self.transfer_log.append("start")

    def update_weights(self, request: dict[str, Any]) -> None:
        info = request["update_info"]
        self._pending.update(zip(info["names"], info["tensors"], strict=True))
        self.transfer_log.append("update")

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.model.load_state_dict(self._pending, strict=False)
        self._pending = {}
        self.transfer_log.append("finish")

    @torch.no_grad()
    def generate(self, prompts, sampling_params, *, use_tqdm=True, lora_request=None):  # type: ignore[no-untyped-def]
        self.calls.append((prompts, sampling_params, lora_request))
        outs = []
        for r, (prompt, sp) in enumerate(zip(prompts, sampling_params, strict=True)):
            completions = []
            for g in range(sp.n):
                gen = torch.Generator().manual_seed((sp.seed or 0) + g)
                ids = list(prompt["prompt_token_ids"])
                toks, lps = [], []
                for _ in range(sp.max_tokens):
                    logits = self.model(input_ids=torch.tensor([ids])).logits[:, -1].float()
                    params = SamplingParams(
                        temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k
                    )
                    tok = int(sample_next(logits, params, gen))
                    lp = torch.log_softmax(filtered_scores(logits, params), -1)[0, tok]
                    toks.append(tok)
                    lps.append({tok: Logprob(float(lp), rank=1)})
                    ids.append(tok)
                    if tok in sp.stop_token_ids:
                        break
                completions.append(
                    CompletionOutput(
                        index=g,
                        text="",
                        token_ids=toks,
                        cumulative_logprob=None,
                        logprobs=lps if sp.logprobs is not None else None,
                        finish_reason="stop" if toks[-1] in sp.stop_token_ids else "length",
                    )
                )
            outs.append(
                RequestOutput(
                    str(r), None, list(prompt["prompt_token_ids"]), None, completions[::-1]
                )
            )
        return outs


def state_dict_sender(engine: Any, model: Any):  # type: ignore[no-untyped-def]
    """A weight sender speaking vLLM's trainer-side client protocol (CPU tensors, not IPC)."""
    client = EngineSyncClient(engine)
    client.init_weight_transfer_engine({"packed": False})

    def push() -> None:
        client.start_weight_update()
        names, tensors = zip(
            *[(n, p.detach().clone()) for n, p in model.named_parameters()], strict=True
        )
        client.update_weights({"names": list(names), "tensors": list(tensors)})
        client.finish_weight_update()

    return push


def vllm_agent(model, tokenizer, **kwargs):  # type: ignore[no-untyped-def]
    engine = ModelEngine(model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos = [int(tokenizer.eos_token_id)]
    backend = VLLMBackend(
        model,
        pad_token_id=int(tokenizer.pad_token_id),
        eos_token_ids=eos,
        engine=engine,
        api=FAKE_API,
        weight_sender=state_dict_sender,
        **kwargs,
    )
    return HFAgent(model, tokenizer, eos_token_ids=eos, backend=backend), engine


# --- native backend through the interface -----------------------------------------------
def test_native_backend_object_gives_the_same_samples_as_the_default_agent(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(num_generations=3, max_new_tokens=10)
    default = HFAgent(tiny_model, tiny_tokenizer)
    default.seed(7)
    a = default.sample(PROMPTS, params).batch
    backend = NativeBackend(
        tiny_model,
        pad_token_id=int(tiny_tokenizer.pad_token_id),
        eos_token_ids=default.eos_token_ids,
    )
    assert isinstance(backend, GenerationBackend)
    explicit = HFAgent(tiny_model, tiny_tokenizer, backend=backend)
    explicit.seed(7)
    b = explicit.sample(PROMPTS, params).batch
    assert (
        explicit.backend == "native" and explicit.fast_decode_status == default.fast_decode_status
    )
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(
        a.completion_mask, b.completion_mask
    )
    # same model, same random stream, same kernels: bit-identical log-probs
    torch.testing.assert_close(a.behaviour_logprobs, b.behaviour_logprobs, rtol=0, atol=0)


# --- vLLM contract (fake engine) ----------------------------------------------------------
def _scripted(token_ids: list[list[list[int]]], with_logprobs: bool = True) -> list[RequestOutput]:
    """Request outputs with completion ``g`` of prompt ``p`` = ``token_ids[p][g]``, log-prob
    of token ``i`` = ``-(10 p + g) - i / 100``, given in reversed index order."""
    outs = []
    for p, group in enumerate(token_ids):
        comps = [
            CompletionOutput(
                index=g,
                text="",
                token_ids=ids,
                cumulative_logprob=None,
                logprobs=[{t: Logprob(-(10 * p + g) - i / 100)} for i, t in enumerate(ids)]
                if with_logprobs
                else None,
            )
            for g, ids in enumerate(group)
        ]
        outs.append(RequestOutput(str(p), None, [1], None, comps[::-1]))
    return outs


def test_assembled_outputs_follow_the_native_padding_and_eos_conventions() -> None:
    eos, pad = [2, 5], 0
    outputs = _scripted([[[7, 8, 2], [9, 9, 9, 9], [5]], [[3, 2, 4, 4], [6, 5], [8, 8, 2]]])
    ids, logp = assemble_outputs(
        outputs, 3, eos_token_ids=eos, pad_token_id=pad, with_logprobs=True, max_tokens=4
    )
    expected = torch.tensor(
        [[7, 8, 2, 0], [9, 9, 9, 9], [5, 0, 0, 0], [3, 2, 0, 0], [6, 5, 0, 0], [8, 8, 2, 0]]
    )  # node-major, ordered by index, cut after the first EOS, pad id after a row's end
    assert torch.equal(ids, expected)
    batch = policy_batch(torch.tensor([[1], [1]]), torch.ones(2, 1), ids, logp, eos, 3)
    mask = torch.tensor(
        [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]]
    ).bool()
    assert torch.equal(batch.completion_mask, mask)
    want = torch.tensor([[-(10 * (r // 3) + r % 3) - i / 100 for i in range(4)] for r in range(6)])
    # exact: the values are copied from the outputs (float32 of the same doubles)
    torch.testing.assert_close(
        batch.behaviour_logprobs, want.masked_fill(~mask, 0.0), rtol=0, atol=0
    )


def test_assembled_outputs_reject_missing_completions_and_logprobs() -> None:
    with pytest.raises(ValueError, match="expected G=3"):
        assemble_outputs(
            _scripted([[[1], [1]]]), 3, eos_token_ids=[2], pad_token_id=0, with_logprobs=True
        )
    with pytest.raises(ValueError, match="logprobs=0"):
        assemble_outputs(
            _scripted([[[1], [1]]], with_logprobs=False),
            2,
            eos_token_ids=[2],
            pad_token_id=0,
            with_logprobs=True,
        )
    with pytest.raises(ValueError, match="after 2 of 4 tokens without EOS"):
        assemble_outputs(
            _scripted([[[7, 8]]]),
            1,
            eos_token_ids=[2],
            pad_token_id=0,
            with_logprobs=True,
            max_tokens=4,
        )


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.integers(1, 3).flatmap(
        lambda g: st.tuples(
            st.just(g),
            st.lists(
                st.lists(
                    st.lists(st.integers(0, 6), min_size=0, max_size=6), min_size=g, max_size=g
                ),
                min_size=1,
                max_size=3,
            ),
        )
    )
)
def test_assembled_rows_equal_a_per_completion_loop(
    case: tuple[int, list[list[list[int]]]],
) -> None:
    g, groups = case
    eos, pad = [2, 5], 0
    ids, _ = assemble_outputs(
        _scripted(groups), g, eos_token_ids=eos, pad_token_id=pad, with_logprobs=True
    )
    rows = []
    for group in groups:
        for toks in group:
            cut = next((i + 1 for i, t in enumerate(toks) if t in eos), len(toks))
            rows.append(toks[:cut])
    length = max([1, *(len(r) for r in rows)])
    assert ids.shape == (len(rows), length)
    for i, r in enumerate(rows):
        assert ids[i].tolist() == r + [pad] * (length - len(r))


def test_vllm_backend_sends_token_prompts_and_the_agents_stopping_rule(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    agent, engine = vllm_agent(tiny_model, tiny_tokenizer)
    agent.seed(3)
    params = SamplingParams(num_generations=3, max_new_tokens=6, temperature=0.8, top_k=20)
    samples = agent.sample(PROMPTS, params)
    prompts, sampling, lora = engine.calls[-1]
    enc = tiny_tokenizer(PROMPTS)
    assert [p["prompt_token_ids"] for p in prompts] == enc["input_ids"]  # no padding
    sp = sampling[0]
    # top_k: the engine's log-probs would be the truncated distribution's; not asked
    assert (sp.n, sp.max_tokens, sp.temperature, sp.top_k, sp.logprobs) == (3, 6, 0.8, 20, None)
    assert sp.stop_token_ids == agent.eos_token_ids and sp.ignore_eos and lora is None
    assert sampling[1].seed == sampling[0].seed + 3  # distinct seeds per prompt and completion
    batch = samples.batch
    assert batch.input_ids.shape[0] == 6 and batch.group_size == 3
    assert [len(group) for group in samples.completions] == [3, 3]


def test_vllm_engine_logprobs_match_the_training_model_once_weights_are_pushed(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    agent, engine = vllm_agent(tiny_model, tiny_tokenizer)
    with torch.no_grad():  # the engine's copy is now stale: the first sample must push
        for p in tiny_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    agent.seed(0)
    batch = agent.sample(PROMPTS, SamplingParams(num_generations=3, max_new_tokens=8)).batch
    assert agent.generation_backend.num_weight_pushes == 1
    ref = completion_logprobs(tiny_model, batch, slice(0, 2), temperature=1.0).masked_fill(
        ~batch.completion_mask, 0
    )
    # float32 forwards of the same weights (full sequence vs. KV cache): ~1e-6 apart
    torch.testing.assert_close(batch.behaviour_logprobs, ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "filters", [{"top_p": 0.6}, {"top_k": 5}, {"top_p": 0.8, "top_k": 20}], ids=str
)
def test_vllm_behaviour_logprobs_under_top_p_top_k_are_the_updates_distribution(
    tiny_model, tiny_tokenizer, filters: dict[str, Any]
) -> None:  # type: ignore[no-untyped-def]
    # The engine's processed log-probs are of the truncated, renormalised distribution
    # (log(p / Z), Z <= 1 the kept mass): against the update's full tempered softmax the
    # PPO ratio would be Z on every token. Under a filter the engine is not asked and the
    # training model's full tempered log-probs are used, so the first ratio is 1.
    agent, engine = vllm_agent(tiny_model, tiny_tokenizer)
    agent.seed(2)
    params = SamplingParams(num_generations=3, max_new_tokens=8, temperature=0.9, **filters)
    batch = agent.sample(PROMPTS, params).batch
    assert engine.calls[-1][1][0].logprobs is None
    ref = completion_logprobs(tiny_model, batch, slice(0, 2), temperature=0.9)
    ref = ref.masked_fill(~batch.completion_mask, 0)
    torch.testing.assert_close(batch.behaviour_logprobs, ref, rtol=0, atol=1e-4)
    # without a filter the engine's own log-probs are used (they are the full softmax's)
    agent.sample(PROMPTS, SamplingParams(num_generations=3, max_new_tokens=8, temperature=0.9))
    assert engine.calls[-1][1][0].logprobs == 0


def test_the_fake_engines_filtered_logprobs_are_above_the_full_softmaxs(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    # the premise of the test above: at top_p = 0.6 processed log-probs exceed the full
    # softmax's by -log Z > 0 wherever the filter dropped mass
    logits = tiny_model(input_ids=torch.tensor([[5, 6, 7]])).logits[:, -1].detach()
    params = SamplingParams(top_p=0.6)
    full = torch.log_softmax(logits.float(), -1)
    kept = torch.log_softmax(filtered_scores(logits, params), -1)
    finite = torch.isfinite(kept)
    assert bool((kept[finite] - full[finite] > 0.1).all())


@pytest.mark.parametrize("filters", [{"top_p": 0.6}, {"top_k": 5}], ids=str)
def test_native_behaviour_logprobs_under_top_p_top_k_are_the_full_tempered_softmaxs(
    tiny_model, tiny_tokenizer, filters: dict[str, Any]
) -> None:  # type: ignore[no-untyped-def]
    agent = HFAgent(tiny_model, tiny_tokenizer)
    agent.seed(4)
    params = SamplingParams(num_generations=3, max_new_tokens=8, temperature=0.9, **filters)
    batch = agent.sample(PROMPTS, params).batch
    ref = completion_logprobs(tiny_model, batch, slice(0, 2), temperature=0.9)
    ref = ref.masked_fill(~batch.completion_mask, 0)
    torch.testing.assert_close(
        batch.behaviour_logprobs.masked_fill(~batch.completion_mask, 0), ref, rtol=0, atol=1e-4
    )


def test_vllm_weights_are_pushed_after_an_optimizer_step_and_only_then(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    agent, engine = vllm_agent(tiny_model, tiny_tokenizer)
    backend = agent.generation_backend
    params = SamplingParams(num_generations=2, max_new_tokens=4)
    agent.sample(PROMPTS, params)
    agent.sample(PROMPTS, params)
    assert backend.num_weight_pushes == 1  # the initial push; unchanged weights are not re-sent
    opt = torch.optim.RAdam(tiny_model.parameters(), lr=1e-2)
    batch = agent.sample(PROMPTS, params).batch
    completion_logprobs(tiny_model, batch, slice(0, 2)).sum().backward()
    opt.step()
    agent.sample(PROMPTS, params)
    assert backend.num_weight_pushes == 2
    assert engine.transfer_log == ["init:['packed']"] + ["start", "update", "finish"] * 2
    for (name, p), q in zip(tiny_model.named_parameters(), engine.model.parameters(), strict=True):
        assert torch.equal(p.detach(), q), name
    agent.after_update()  # an explicit hook forces a push (writes through .data are invisible)
    agent.sample(PROMPTS, params)
    assert backend.num_weight_pushes == 3


def test_vllm_recompute_option_gives_the_training_models_logprobs(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    agent, engine = vllm_agent(tiny_model, tiny_tokenizer, behaviour_logprobs="recompute")
    agent.seed(1)
    params = SamplingParams(num_generations=2, max_new_tokens=6, temperature=0.7)
    samples = agent.sample(PROMPTS, params)
    assert engine.calls[-1][1][0].logprobs is None  # not asked of the engine
    batch = samples.batch
    ref = completion_logprobs(tiny_model, batch, slice(0, 2), temperature=0.7)
    ref = ref.masked_fill(~batch.completion_mask, 0)
    # the same forward on the same batch: equal up to float32 summation order
    torch.testing.assert_close(batch.behaviour_logprobs, ref, rtol=0, atol=1e-5)
    flat = [c for group in samples.completions for c in group]
    assert all(torch.isfinite(c.logprobs).all() for c in flat)


def test_vllm_lora_model_gets_its_adapter_as_a_lora_request(
    tiny_model, tiny_tokenizer, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # A peft-shaped model: ``peft_config`` and ``save_pretrained`` are all the backend reads;
    # only the trainable parameters (the adapter) are watched for updates.
    tiny_model.peft_config = {"default": SimpleNamespace(r=4, base_model_name_or_path="base")}
    params_ = list(tiny_model.parameters())
    for p in params_:
        p.requires_grad_(p is params_[-1])
    agent, engine = vllm_agent(tiny_model, tiny_tokenizer, adapter_dir=tmp_path / "adapter")
    params = SamplingParams(num_generations=2, max_new_tokens=3)
    agent.sample(PROMPTS, params)
    first = engine.calls[-1][2]
    assert isinstance(first, FakeLoRARequest) and first.load_inplace
    assert first.lora_path == str(tmp_path / "adapter") and (tmp_path / "adapter").is_dir()
    agent.sample(PROMPTS, params)
    assert not engine.calls[-1][2].load_inplace  # unchanged adapter: not reloaded
    with torch.no_grad():
        next(p for p in tiny_model.parameters() if p.requires_grad).add_(1.0)
    agent.sample(PROMPTS, params)
    assert engine.calls[-1][2].load_inplace and engine.calls[-1][2].lora_int_id == first.lora_int_id
    assert engine.transfer_log == []  # base weights are not pushed for a LoRA model


def test_vllm_backend_rejects_bad_settings(tiny_model, tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="behaviour_logprobs='sampler'"):
        vllm_agent(tiny_model, tiny_tokenizer, behaviour_logprobs="sampler")
    with pytest.raises(ValueError, match="gpu_memory_utilization=1.5"):
        vllm_agent(tiny_model, tiny_tokenizer, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="vllm_options were given but backend='native'"):
        HFAgent(tiny_model, tiny_tokenizer, vllm_options={"gpu_memory_utilization": 0.5})


@pytest.mark.skipif(
    vllm_unavailable_reason(need_cuda=False) is None, reason="vLLM is installed here"
)
def test_vllm_requested_without_vllm_fails_early_with_the_install_hint(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    from comlrl.algos.training.config.rl import ConfigError, build_config

    with pytest.raises(RuntimeError, match=r"pip install 'comlrl-algos\[vllm\]'"):
        HFAgent(tiny_model, tiny_tokenizer, backend="vllm")
    with pytest.raises(ConfigError, match=r"generation_backend='vllm' but vLLM is not installed"):
        build_config({"generation_backend": "vllm"})
    opts = build_config({"vllm": {"gpu_memory_utilization": 0.5}}).generation_options()
    assert opts == {"backend": "native", "prompt_format": "auto"}


@pytest.mark.skipif(vllm_unavailable_reason() is not None, reason=str(vllm_unavailable_reason()))
def test_real_vllm_engine_samples_and_follows_weight_updates() -> None:  # pragma: no cover - GPU
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(__file__).resolve().parents[4] / "shared" / "models" / "stories260k"
    if not path.is_dir():
        pytest.skip(f"{path} (the shared stories260k checkpoint) is absent")
    model = AutoModelForCausalLM.from_pretrained(path).cuda()
    tok = AutoTokenizer.from_pretrained(path)
    agent = HFAgent(
        model,
        tok,
        backend="vllm",
        vllm_options={"gpu_memory_utilization": 0.2, "engine_kwargs": {"enforce_eager": True}},
    )
    params = SamplingParams(num_generations=4, max_new_tokens=16)
    batch = agent.sample(PROMPTS, params).batch
    ref = completion_logprobs(model, batch, slice(0, 2)).masked_fill(~batch.completion_mask, 0)
    # engine kernels vs. the training forward, same float32 weights: close, not equal
    torch.testing.assert_close(batch.behaviour_logprobs, ref, rtol=0, atol=5e-2)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.5)
    batch = agent.sample(PROMPTS, params).batch
    ref = completion_logprobs(model, batch, slice(0, 2)).masked_fill(~batch.completion_mask, 0)
    torch.testing.assert_close(batch.behaviour_logprobs, ref, rtol=0, atol=5e-2)
