"""A run's bookkeeping: the order it sees its examples in
(:mod:`~comlrl.algos.training.run.data`, :mod:`~comlrl.algos.training.run.data_mixture`),
step checkpoints (:mod:`~comlrl.algos.training.run.checkpoint`,
:mod:`~comlrl.algos.training.run.saving`), its output folder, interrupts and resume
(:mod:`~comlrl.algos.training.run.lifecycle`), reporters
(:mod:`~comlrl.algos.training.run.reporting`), the metrics read back and the closing line
(:mod:`~comlrl.algos.training.run.summary`), the warnings for runs that cannot learn
(:mod:`~comlrl.algos.training.run.diagnostics`) and the host memory a step freed, given
back (:mod:`~comlrl.algos.training.run.host_memory`)."""
