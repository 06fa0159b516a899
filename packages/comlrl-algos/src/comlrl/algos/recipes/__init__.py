"""Training recipes: one explicit loop per method, built from the shared stages.

- :mod:`~comlrl.algos.recipes.group_baseline`: MAGRPO, MARLOO, MAReMax, MAREINFORCE.
"""

from __future__ import annotations
