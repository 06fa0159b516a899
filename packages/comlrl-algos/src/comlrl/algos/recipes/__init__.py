"""Training recipes: one folder per family, each a ``config.py`` and a ``recipe.py`` holding
one class that the loop driver (:mod:`comlrl.algos.training.loop`) drives.

- :mod:`~comlrl.algos.recipes.group_baseline`: MAGRPO, MARLOO, MAReMax, MAREINFORCE
  (``GroupBaselineRecipe``).
- :mod:`~comlrl.algos.recipes.actor_critic`: IAC (a critic per agent), MAAC (one centralised
  critic) (``ActorCriticRecipe``).
- :mod:`~comlrl.algos.recipes.preference`: SFT, DPO, MADPO, MARLHF, MADPO-Iter, MARLHF-Iter.

:mod:`~comlrl.algos.recipes.launch` runs any of them from a config to its final checkpoint
(what ``comlrl train algo=NAME`` does); :mod:`~comlrl.algos.recipes.registry` names them.
One model for every role (``role_format``) is a setting of the configs, not a family.
"""
