"""The public API of comlrl.estimators: every name in ``__all__`` imports, and importing the
package pulls in torch and comlrl.kernels only (no transformers, no training stack)."""

from __future__ import annotations

import subprocess
import sys

import comlrl.estimators as estimators


def test_every_public_name_imports() -> None:
    for name in estimators.__all__:
        assert getattr(estimators, name) is not None, name


def test_import_loads_no_training_stack() -> None:
    code = (
        "import sys, comlrl.estimators\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('transformers', 'peft', 'pydantic', 'datasets') or m.startswith('comlrl.algos'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"comlrl.estimators imported {out.stdout.strip()}"
