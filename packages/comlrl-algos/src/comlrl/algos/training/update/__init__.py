"""The update: one agent's policy-gradient step over a rollout
(:mod:`~comlrl.algos.training.update.policy`; LoRA agents of one base in one forward and
backward: ``update_adapters``), agents that share a model or a base
(:mod:`~comlrl.algos.training.update.shared_models`), the node-chunk schedule
(:mod:`~comlrl.algos.training.update.node_chunks`), the spread of the agents' gradient norms
(:mod:`~comlrl.algos.training.update.grad_norms`), optimizers and agent pools
(:mod:`~comlrl.algos.training.update.agents`, :mod:`~comlrl.algos.training.update.flat_radam`)."""
