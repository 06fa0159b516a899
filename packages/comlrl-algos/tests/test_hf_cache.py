"""The KV-cache argument's name follows the model: ``cache`` (transformers >= 5.24) or
``past_key_values`` (earlier releases, remote-code models)."""

from __future__ import annotations

from typing import Any

from comlrl.algos.models.hf_cache import cache_kwargs, output_cache


class _Old:
    def forward(self, input_ids: Any = None, past_key_values: Any = None) -> None: ...


class _New:
    def forward(self, input_ids: Any = None, cache: Any = None) -> None: ...


class _Wrapper:
    def __call__(self, *args: Any, **kwargs: Any) -> None: ...


def test_the_name_comes_from_the_models_forward() -> None:
    assert cache_kwargs(_Old(), "C") == {"past_key_values": "C"}
    assert cache_kwargs(_New(), "C") == {"cache": "C"}


def test_a_wrapper_without_the_argument_gets_the_installed_transformers_name() -> None:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    new = "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {})
    assert cache_kwargs(_Wrapper(), "C") == {"cache" if new else "past_key_values": "C"}


def test_the_returned_cache_is_read_under_either_name(tiny_model) -> None:  # type: ignore[no-untyped-def]
    import torch

    out = tiny_model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
    cache = output_cache(out)
    assert cache is not None and cache.get_seq_length() == 3
    step = tiny_model(
        input_ids=torch.tensor([[4]]), use_cache=True, **cache_kwargs(tiny_model, cache)
    )
    assert output_cache(step).get_seq_length() == 4
