"""LoRA agents (comlrl.algos.models.lora): reference log-probs, adapter isolation on a shared
base, memory, checkpoints, config errors. Uses the built-in stories260k (package data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from comlrl.algos import HFAgent, TrainConfig, load_model_and_tokenizer
from comlrl.algos.models.loading import STORIES260K
from comlrl.algos.models.logprobs import completion_logprobs
from comlrl.algos.training.config.rl import ConfigError, build_config
from comlrl.core import SamplingParams

pytest.importorskip("peft", reason="LoRA needs peft: pip install 'comlrl-algos[lora]'")

from comlrl.algos.models.lora import (  # noqa: E402
    LoraSettings,
    attach_lora,
    is_lora_policy,
    model_key,
    reference_model,
    unique_parameter_bytes,
)
from comlrl.algos.models.lora_policy import BASE_RECORD, LoraPolicy  # noqa: E402
from comlrl.algos.training.run import checkpoint as ckpt  # noqa: E402
from comlrl.algos.training.run.saving import save_agent_checkpoint

IDS = torch.tensor([[1, 403, 261, 21, 300, 77]])


def _agents(n: int = 2, **lora: object) -> list[HFAgent]:
    torch.manual_seed(0)
    agents = [HFAgent(*load_model_and_tokenizer(STORIES260K), name=f"a{i}") for i in range(n)]
    attach_lora(agents, LoraSettings(**lora), seed=0)  # type: ignore[arg-type]
    return agents


def _perturb(policy: LoraPolicy, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))


def _logits(model: object) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits  # type: ignore[operator]


def test_reference_logprobs_equal_the_base_models_exactly() -> None:
    agents = _agents()
    base, tok = load_model_and_tokenizer(STORIES260K)
    base.eval()
    _perturb(agents[0].model, 1)  # the adapter now changes the policy
    samples = agents[0].sample(
        ["Once upon a time"], SamplingParams(num_generations=3, max_new_tokens=6)
    )
    ref = reference_model(agents[0].model)
    agents[0].model.eval()
    with torch.no_grad():
        got = completion_logprobs(ref, samples.batch, slice(0, 1))
        # the same (fused) path as the LoRA reference, whose decoder runs with the adapters
        # off, so equality is exact
        want = completion_logprobs(base, samples.batch, slice(0, 1))
        policy = completion_logprobs(agents[0].model, samples.batch, slice(0, 1))
    # exact: the disabled adapter adds nothing and the base weights are the loaded ones
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.allclose(policy, want)
    # the reference left the adapter trainable and active
    assert all(p.requires_grad for p in agents[0].model.parameters())
    assert not torch.allclose(_logits(agents[0].model), _logits(base))  # adapter back on


def test_agents_on_a_shared_base_use_only_their_own_adapter() -> None:
    a, b = (x.model for x in _agents())
    assert a.shared is b.shared and model_key(a) == model_key(b)
    base = _logits(reference_model(a))
    torch.testing.assert_close(_logits(a), base, rtol=0, atol=0)  # B starts at zero
    _perturb(b, 2)
    torch.testing.assert_close(_logits(a), base, rtol=0, atol=0)
    assert not torch.allclose(_logits(b), base)
    # parameters() are the agent's adapter only, disjoint between agents, all trainable
    pa, pb = {id(p) for p in a.parameters()}, {id(p) for p in b.parameters()}
    assert pa and pb and not pa & pb
    assert all(p.requires_grad for p in [*a.parameters(), *b.parameters()])
    assert not any(p.requires_grad for p in a.shared.hf_model.parameters() if id(p) not in pa | pb)


def test_an_update_of_one_agent_leaves_the_other_and_the_base_unchanged() -> None:
    a, b = (x.model for x in _agents())
    before_b = [p.detach().clone() for p in b.parameters()]
    base_before = _logits(reference_model(a))
    opt = torch.optim.SGD(a.parameters(), lr=1.0)
    _perturb(a, 3)
    a(input_ids=IDS).logits.square().mean().backward()
    opt.step()
    for p, q in zip(b.parameters(), before_b, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    torch.testing.assert_close(_logits(reference_model(a)), base_before, rtol=0, atol=0)


def test_shared_base_memory_is_one_base_plus_adapters() -> None:
    base, _ = load_model_and_tokenizer(STORIES260K)
    one_base = unique_parameter_bytes([base])
    shared = [x.model for x in _agents(3)]
    own = [x.model for x in _agents(3, shared_base=False)]
    adapters = sum(p.numel() * p.element_size() for m in shared for p in m.parameters())
    assert 0 < adapters < one_base
    assert unique_parameter_bytes(shared) == one_base + adapters
    assert unique_parameter_bytes(own) == 3 * one_base + adapters


def test_checkpoint_saves_adapter_and_merged_weights_that_reload(tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    agents = _agents(merge_adapters=True)
    _perturb(agents[1].model, 4)
    agents[1].model.eval()
    folder = save_agent_checkpoint(agents[1], tmp_path / "agent_1")
    assert (folder / "adapter_model.safetensors").is_file()
    assert (folder / "adapter_config.json").is_file()
    assert not (folder / "model.safetensors").exists()  # no copy of the base
    want = _logits(agents[1].model)
    fresh, _ = load_model_and_tokenizer(STORIES260K)
    reloaded = PeftModel.from_pretrained(fresh, str(folder)).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(folder / "merged")).eval()
    # float32: x(W + sBA) vs xW + s(xA)B differ by round-off only; logits are O(10)
    torch.testing.assert_close(_logits(reloaded), want, rtol=0, atol=1e-4)
    torch.testing.assert_close(_logits(merged), want, rtol=0, atol=1e-4)
    # resume path: the adapter loads back in place into another agent's adapter
    other = _agents()[1]
    ckpt.load_agent_weights(other.model, folder)
    other.model.eval()
    torch.testing.assert_close(_logits(other.model), want, rtol=0, atol=0)
    # --model FOLDER (comlrl eval, a next run): the recorded base with the adapter merged,
    # a plain model whose every weight trains
    assert json.loads((folder / BASE_RECORD).read_text())["model"] == STORIES260K
    model, tokenizer = load_model_and_tokenizer(str(folder))
    assert not is_lora_policy(model) and all(p.requires_grad for p in model.parameters())
    torch.testing.assert_close(_logits(model.eval()), want, rtol=0, atol=1e-4)
    assert model.comlrl_source["model"] == str(folder.resolve())


def test_an_adapter_whose_base_is_unknown_fails_naming_what_loads_it(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model, tokenizer = load_model_and_tokenizer(STORIES260K)
    built = AutoModelForCausalLM.from_config(model.config)  # not loaded by comlrl: no source
    agent = HFAgent(built, tokenizer, name="a0")
    attach_lora([agent], LoraSettings(), seed=0)
    folder = save_agent_checkpoint(agent, tmp_path / "agent_0")
    assert (folder / "adapter_config.json").is_file() and not (folder / BASE_RECORD).exists()
    with pytest.raises(OSError, match="LoRA adapter without comlrl_base.json.*PeftModel"):
        load_model_and_tokenizer(str(folder))


def test_loading_an_adapter_of_another_rank_fails_clearly(tmp_path: Path) -> None:
    folder = save_agent_checkpoint(_agents(r=4)[0], tmp_path / "agent_0")
    with pytest.raises(ckpt.CheckpointError, match="rank or target_modules"):
        ckpt.load_agent_weights(_agents(r=8)[0].model, folder)


def test_lora_agents_decode_through_the_fast_step_with_their_own_adapter() -> None:
    """The fast decode step applies the agent's adapter (peft's forward is the check): the
    same tokens as decoding through the model's forward, log-probs to float rounding."""
    from comlrl.algos.rollout.sampling.native import NativeSampler

    agents = _agents()
    _perturb(agents[0].model, 1)
    _perturb(agents[1].model, 2)
    ids = torch.tensor([[0, 0, 403, 261, 21], [1, 403, 261, 21, 300]])
    params = SamplingParams(num_generations=3, max_new_tokens=12)
    out = {}
    for fast in (True, False):
        sampler = NativeSampler(
            agents[0].model, pad_token_id=0, eos_token_ids=[2], fast_decode=fast
        )
        out[fast] = sampler.sample(ids, (ids != 0).long(), params, torch.Generator().manual_seed(3))
        assert sampler.fast_decode_status == ("on" if fast else "off: fast_decode=False")
    assert torch.equal(out[True][0], out[False][0])
    torch.testing.assert_close(out[True][1], out[False][1], rtol=0, atol=1e-5)


def test_lora_config_is_validated_early(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="lora.r"):
        build_config({"lora": {"r": 0}})
    with pytest.raises(ConfigError, match="target_modules"):
        build_config({"lora": {"target_modules": []}})
    with pytest.raises(ConfigError, match="one base model for all agents"):
        build_config({"models": ["a", "b"], "lora": {}})
    with pytest.raises(ConfigError, match="LoRA agent's reference"):
        build_config({"lora": {}, "kl_coef": 0.1, "reference_devices": ["cpu", "cpu"]})
    assert TrainConfig(lora={"shared_base": False}, models=["a", "b"]).lora is not None
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"comlrl-algos\[lora\]"):
        build_config({"lora": {}})
