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
def stories260k(shared_dir: Path) -> Path:
    path = shared_dir / "models" / "stories260k"
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"pretrained stories260k model not found at {path}")
    return path
