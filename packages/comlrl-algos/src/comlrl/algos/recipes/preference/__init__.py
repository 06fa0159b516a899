"""Preference and supervised recipes: SFT, DPO, MADPO, MARLHF's joint reward model, and their
iterative variants (MADPO-Iter, MARLHF-Iter).

Every recipe reads its log-probs through the shared path
(:func:`comlrl.algos.models.logprobs.completion_logprobs`, which reduces logits with
:func:`comlrl.kernels.token_logprobs`) and its losses from
:mod:`comlrl.estimators.preference_losses`. Each recipe is one class whose step reads top to
bottom:

- :mod:`~comlrl.algos.recipes.preference.supervised.recipe`: supervised fine-tuning on
  ``prompt``/``completion`` rows (``SFTRecipe``; token-mean NLL of the completion tokens)
  and DPO (Rafailov et al. 2023) on ``prompt``/``chosen``/``rejected`` rows against a frozen
  reference model (``DPORecipe``).
- :mod:`~comlrl.algos.recipes.preference.madpo.recipe`: multi-agent DPO. Per prompt each
  agent samples ``K`` candidates, the reward function scores the joint actions,
  :func:`~comlrl.algos.recipes.preference.pairs.preference_pairs` pairs them by reward gap,
  and every agent takes a step on
  :func:`~comlrl.estimators.preference_losses.multi_agent_dpo_loss` against its own
  frozen reference model.
- :mod:`~comlrl.algos.recipes.preference.marlhf.recipe`: MARLHF: its joint reward model
  (:mod:`~comlrl.algos.recipes.preference.marlhf.reward_model`: LM backbone + linear head on
  the last token of the joint response), trained with the Bradley-Terry loss on the same
  pairs, then the group-baseline recipe on its reward.
- :mod:`~comlrl.algos.recipes.preference.iterative.recipe`: MADPO-Iter and MARLHF-Iter,
  pairs refreshed against a comparator each round, with a replay of earlier rounds.

Shared by the methods: :mod:`.config` (the shared config base and the ``iterative``
section), :mod:`.encoding` (rows as tensors, log-probs, one clipped optimizer step),
:mod:`.checkpoint` (step checkpoints with the reference models' fingerprint), :mod:`.pairs`
(joint-action preference pairs). Each method's config and recipe live in its folder
(``supervised/``, ``madpo/``, ``marlhf/``: ``config.py`` and ``recipe.py``; ``iterative/``:
``recipe.py``, the rounds, the comparator and the replay).

Named axes: ``N`` prompts, ``A`` agents, ``K`` candidates (joint actions) per prompt,
``P`` pairs, ``B`` sequences, ``S`` padded prompt tokens, ``L`` completion tokens, ``H``
hidden size.
"""
