"""Small models run their CPU work on one intra-op thread (``models/threads.py``): the
context sets the calling thread's count to 1 for a small CPU model, leaves big models and
other devices alone, and restores the count on exit, also after an exception; the policy
update runs inside it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from comlrl.algos.models import threads
from comlrl.algos.models.threads import small_model_threads


@pytest.fixture
def two_threads() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_small_cpu_model_runs_on_one_thread_and_restores(two_threads: None) -> None:
    model = torch.nn.Linear(8, 8)
    with small_model_threads(model):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError, match="boom"), small_model_threads(model):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


def test_big_model_and_other_devices_keep_the_setting(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = torch.nn.Linear(8, 8)  # 72 parameters
    monkeypatch.setattr(threads, "SMALL_MODEL_PARAMS", 72)  # 72 is not below 72: big
    with small_model_threads(model):
        assert torch.get_num_threads() == 2
    monkeypatch.setattr(threads, "SMALL_MODEL_PARAMS", 73)
    with small_model_threads(model):
        assert torch.get_num_threads() == 1
    with small_model_threads(model, device="meta"):
        assert torch.get_num_threads() == 2


def test_update_policy_runs_small_models_on_one_thread(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from comlrl.algos.training.update import policy as update

    seen: list[int] = []

    def record(*args: Any, **kwargs: Any) -> dict[str, float]:
        seen.append(torch.get_num_threads())
        return {}

    monkeypatch.setattr(update, "_update", record)
    settings = update.UpdateSettings()
    update.update_policy(torch.nn.Linear(4, 4), None, [], [], settings)  # type: ignore[arg-type]
    assert seen == [1] and torch.get_num_threads() == 2
