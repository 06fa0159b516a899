from __future__ import annotations

from pathlib import Path

import pytest

#: the real models and datasets beside the checkout (``../shared``; see docs/architecture.md, offline data)
SHARED = Path(__file__).resolve().parents[3].parent / "shared"


@pytest.fixture(scope="session")
def tiny_tokenizer():  # type: ignore[no-untyped-def]
    from comlrl.algos import build_default_tokenizer

    return build_default_tokenizer()


@pytest.fixture
def tiny_model(tiny_tokenizer):  # type: ignore[no-untyped-def]
    from comlrl.algos import build_default_model

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
