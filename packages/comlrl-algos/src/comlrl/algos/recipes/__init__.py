"""Training recipes: one folder per family, each an explicit loop built from the shared stages.

- :mod:`~comlrl.algos.recipes.group_baseline`: MAGRPO, MARLOO, MAReMax, MAREINFORCE.
- :mod:`~comlrl.algos.recipes.actor_critic`: IAC (a critic per agent), MAAC (one centralised critic).
- :mod:`~comlrl.algos.recipes.preference`: SFT, DPO, MADPO, MARLHF.
"""
