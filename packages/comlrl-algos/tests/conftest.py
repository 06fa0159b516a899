from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

#: the real models and datasets beside the checkout (``../shared``; see docs/architecture.md, offline data)
SHARED = Path(__file__).resolve().parents[3].parent / "shared"


@pytest.fixture(scope="session")
def tiny_tokenizer():  # type: ignore[no-untyped-def]
    from comlrl.algos.models.loading import build_default_tokenizer

    return build_default_tokenizer()


@pytest.fixture
def tiny_model(tiny_tokenizer):  # type: ignore[no-untyped-def]
    from comlrl.algos.models.loading import build_default_model

    return build_default_model(len(tiny_tokenizer), seed=0)


@pytest.fixture(scope="session")
def stories260k() -> str:
    """The pretrained 260K-parameter Llama of ``../shared`` (a Hugging Face folder); skips
    the test where it is absent."""
    path = SHARED / "models" / "stories260k"
    if not (path / "config.json").is_file():
        pytest.skip(
            f"pretrained stories260k model not found at {path} (../shared beside the checkout)"
        )
    return str(path)


class RecordingSGD(torch.optim.SGD):
    """SGD at ``lr=0`` (the weights stay) that keeps a copy of the gradients of its last
    step in :attr:`seen`: the update frees the gradients once the optimizer has stepped,
    so a test reads them here."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.0)
        self.seen: dict[torch.nn.Parameter, torch.Tensor] = {}

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        self.seen = {
            p: p.grad.detach().clone()
            for group in self.param_groups
            for p in group["params"]
            if p.grad is not None
        }
        return super().step(closure)

    def grads(self, params: Any) -> list[torch.Tensor]:
        """The gradient of each of ``params`` at the last step (zeros where it had none)."""
        return [self.seen[p] if p in self.seen else torch.zeros_like(p) for p in params]


@pytest.fixture
def recording_sgd() -> type[RecordingSGD]:
    """:class:`RecordingSGD`, the optimizer of tests that compare an update's gradient."""
    return RecordingSGD
