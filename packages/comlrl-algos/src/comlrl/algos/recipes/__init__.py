"""Training recipes: one folder per family, each an explicit loop built from the shared stages.

- :mod:`~comlrl.algos.recipes.group_baseline`: MAGRPO, MARLOO, MAReMax, MAREINFORCE.
- :mod:`~comlrl.algos.recipes.actor_critic`: IAC (a critic per agent), MAAC (one centralised critic).
- :mod:`~comlrl.algos.recipes.preference`: SFT, DPO, MADPO, MARLHF, MADPO-Iter, MARLHF-Iter.
- :mod:`~comlrl.algos.recipes.centralized`: one joint policy for every role.

Each family owns its whole run: a ``run`` module with its run configs and ``run_*``
functions (task or data, models, training, every checkpoint, ``final/``; resumable), which
take one outputs argument (:class:`~comlrl.algos.recipes.launch.RunOutputs`) and are what
``comlrl train algo=NAME`` calls (:mod:`~comlrl.algos.recipes.registry` names them).
"""
