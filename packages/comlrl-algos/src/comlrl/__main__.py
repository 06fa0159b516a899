"""``python -m comlrl``: the ``comlrl`` command line (:func:`comlrl.algos.cli.main.main`).

Also the form ``torchrun`` launches: ``torchrun --nproc-per-node=K -m comlrl train ...``.
This module sits in the ``comlrl`` namespace folder of the comlrl-algos distribution;
there is no ``comlrl/__init__.py`` (PEP 420).
"""

from __future__ import annotations

from comlrl.algos.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
