"""Training: the validated config, the policy update, the run loop's parts (data order, metrics,
samples), step checkpoints and resume, reporting (TensorBoard, W&B, reward curve) and the
warnings for runs that cannot learn.

Modules: :mod:`~comlrl.algos.training.config`, :mod:`~comlrl.algos.training.update`,
:mod:`~comlrl.algos.training.steps`, :mod:`~comlrl.algos.training.checkpoint`,
:mod:`~comlrl.algos.training.lifecycle`, :mod:`~comlrl.algos.training.reporting`,
:mod:`~comlrl.algos.training.diagnostics`.
"""
