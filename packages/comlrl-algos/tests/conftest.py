from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer():  # type: ignore[no-untyped-def]
    from comlrl.algos.models.loading import build_default_tokenizer

    return build_default_tokenizer()


@pytest.fixture
def tiny_model(tiny_tokenizer):  # type: ignore[no-untyped-def]
    from comlrl.algos.models.loading import build_default_model

    return build_default_model(len(tiny_tokenizer), seed=0)
