from __future__ import annotations

import importlib

import comlrl.core
import pytest


@pytest.mark.parametrize("name", comlrl.core.__all__)
def test_every_exported_name_imports(name: str) -> None:
    assert getattr(importlib.import_module("comlrl.core"), name) is not None


def test_comlrl_is_a_namespace_package() -> None:
    import comlrl

    # PEP 420: no __init__.py, so no __file__ and a namespace __path__.
    assert getattr(comlrl, "__file__", None) is None
    assert type(comlrl.__path__).__name__ == "_NamespacePath"
