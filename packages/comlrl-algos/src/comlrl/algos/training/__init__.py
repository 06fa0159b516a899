"""Training, by concept, between the recipes above and the rollouts below:

- :mod:`~comlrl.algos.training.config`: what a run is told (the validated RL configs, their
  sections, the task setting, defaults by model, the task checked before models load);
- :mod:`~comlrl.algos.training.run`: a run's bookkeeping (its data order, step checkpoints,
  output folder, interrupts and resume, reporters, the closing summary, the warnings for runs
  that cannot learn);
- :mod:`~comlrl.algos.training.update`: the policy update (shared models, the node-chunk
  schedule, optimizers and agent pools);
- :mod:`~comlrl.algos.training.loop`: the one loop driver every recipe runs under (metrics,
  samples, evaluation, reporters, step checkpoints, resume, Ctrl-C).
"""
