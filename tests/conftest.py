from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the checkout (real data and the stories260k model)."""
    if not SHARED.is_dir():
        pytest.skip(f"shared test data not found at {SHARED} (it sits beside the checkout in CI)")
    return SHARED


@pytest.fixture(scope="session")
def stories260k() -> Path:
    """The pretrained stories260k model's folder: the copy comlrl-algos ships as package
    data (``builtin:stories260k``), so these tests need nothing beside the checkout."""
    from comlrl.algos.models.loading import builtin_model_path

    return builtin_model_path()
