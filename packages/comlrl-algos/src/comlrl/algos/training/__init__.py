"""Training: the validated config, the policy update, the one loop driver every recipe runs
under (metrics, samples, evaluation, reporters, step checkpoints, resume, Ctrl-C), the
checkpoint format, reporting (TensorBoard, W&B, reward curve) and the warnings for runs that
cannot learn.

Modules: :mod:`~comlrl.algos.training.config` (with its sections in
:mod:`~comlrl.algos.training.config_sections`), :mod:`~comlrl.algos.training.update`,
:mod:`~comlrl.algos.training.loop`, :mod:`~comlrl.algos.training.checkpoint`,
:mod:`~comlrl.algos.training.lifecycle`, :mod:`~comlrl.algos.training.reporting`,
:mod:`~comlrl.algos.training.diagnostics`, and the step helpers
(:mod:`~comlrl.algos.training.agents`, :mod:`~comlrl.algos.training.data`,
:mod:`~comlrl.algos.training.metrics`, :mod:`~comlrl.algos.training.saving`).
"""
