"""What a run is told: the validated RL configs and their sections
(:mod:`~comlrl.algos.training.config.rl`, :mod:`~comlrl.algos.training.config.sections`),
the task setting (:mod:`~comlrl.algos.training.config.task`), defaults by model
(:mod:`~comlrl.algos.training.config.model_defaults`) and the task built and checked against
the config before any model loads (:mod:`~comlrl.algos.training.config.task_setup`)."""
