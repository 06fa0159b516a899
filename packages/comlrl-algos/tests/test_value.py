"""Value heads and critics: save/load round trip, reading at the last token, config checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from comlrl.algos.models.value import (
    MAX_PADDING_FRACTION,
    Critic,
    ValueHead,
    _length_buckets,
    load_value_head,
    save_value_head,
)
from comlrl.algos.recipes.actor_critic.config import ActorCriticConfig
from comlrl.algos.recipes.actor_critic.critic import joint_prompt
from hypothesis import given, settings
from hypothesis import strategies as st


def test_a_new_head_predicts_zero_and_its_output_is_float32() -> None:
    head = ValueHead(8, hidden_dim=4)
    out = head(torch.randn(3, 5, 8, dtype=torch.bfloat16))
    assert out.shape == (3, 5) and out.dtype == torch.float32
    assert bool((out == 0).all())


@pytest.mark.parametrize("hidden_dim", [None, 6])
def test_value_head_save_load_round_trip(tmp_path: Path, hidden_dim: int | None) -> None:
    torch.manual_seed(0)
    head = ValueHead(8, hidden_dim)
    for p in head.parameters():
        torch.nn.init.normal_(p)
    save_value_head(head, tmp_path, kind="q")
    loaded = load_value_head(tmp_path, hidden_size=8)
    x = torch.randn(4, 8)
    # Same weights, same float32 ops: the outputs are bit-identical.
    torch.testing.assert_close(loaded(x), head(x), atol=0, rtol=0)
    with pytest.raises(ValueError, match="hidden size 8 but the trunk has 16"):
        load_value_head(tmp_path, hidden_size=16)
    with pytest.raises(FileNotFoundError, match="no value head"):
        load_value_head(tmp_path / "missing")


def test_critic_reads_the_last_token_whatever_the_padding(
    tiny_model, tiny_tokenizer, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    head = ValueHead(tiny_model.config.hidden_size)
    torch.nn.init.normal_(head.out.weight)
    critic = Critic(tiny_model, tiny_tokenizer, head, kind="v")
    texts = ["def f(x): return x", "a much longer prompt with many more words in it"]
    with torch.no_grad():
        both = critic.values(texts)
        alone = torch.cat([critic.values([t]) for t in texts])
    # Left padding with the attention mask and position ids: a row's value does not depend
    # on its batch mates up to float32 round-off in attention (~1e-6 on values of order 1).
    torch.testing.assert_close(both, alone, atol=1e-4, rtol=1e-4)
    critic.save(tmp_path / "critic")
    again = Critic.load(tmp_path / "critic")
    with torch.no_grad():
        torch.testing.assert_close(again.values(texts), both, atol=1e-5, rtol=1e-5)
    assert again.kind == "v" and not again.shared


def test_joint_prompt_names_every_agent_and_the_joint_action() -> None:
    text = joint_prompt(["p1", "p2"], ["c1", "c2"])
    assert text.index("p1") < text.index("p2") < text.index("c1") < text.index("c2")
    assert "Agent 2 response: c2" in text


def test_bad_actor_critic_configs_fail_early() -> None:
    with pytest.raises(ValueError, match="critic_mode='shared'"):
        ActorCriticConfig(critic_mode="shared", critic_model="x")
    with pytest.raises(ValueError, match="gae_lambda"):
        ActorCriticConfig(gae_lambda=1.5)
    with pytest.raises(ValueError, match="critic_type"):
        ActorCriticConfig(critic_type="w")  # type: ignore[arg-type]
    assert ActorCriticConfig(learning_rate=1e-4).critic_lr == 1e-4


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=40),
    max_rows=st.one_of(st.none(), st.integers(1, 8)),
)
def test_length_buckets_partition_in_order_within_the_padding_bound(
    lengths: list[int], max_rows: int | None
) -> None:
    lengths = sorted(lengths)
    buckets = _length_buckets(lengths, max_rows)
    assert [k for b in buckets for k in b] == list(range(len(lengths)))
    for b in buckets:
        width = lengths[b[-1]]
        padding = sum(width - lengths[k] for k in b)
        # A bucket of one row has no padding; otherwise the bound held when its last row joined.
        assert padding <= MAX_PADDING_FRACTION * len(b) * width
        assert max_rows is None or len(b) <= max_rows


def test_critic_values_come_back_in_input_order_across_length_buckets(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    head = ValueHead(tiny_model.config.hidden_size)
    torch.nn.init.normal_(head.out.weight)
    critic = Critic(tiny_model, tiny_tokenizer, head, kind="q")
    texts = ["a " * 40, "b", "c c c " * 20, "d d", "e " * 5, "b"]
    with torch.no_grad():
        together = critic.values(texts)
        capped = critic.values(texts, micro_batch_size=2)
        alone = torch.cat([critic.values([t]) for t in texts])
    # Same rows, other batch mates: float32 round-off in attention only (see above).
    torch.testing.assert_close(together, alone, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(capped, alone, atol=1e-4, rtol=1e-4)
    assert together[1] == together[5]  # identical texts, one bucket: identical values
    with pytest.raises(ValueError, match="micro_batch_size must be >= 1"):
        critic.values(texts, micro_batch_size=0)
