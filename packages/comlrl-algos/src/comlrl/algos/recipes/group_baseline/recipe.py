"""The group-baseline recipe: MAGRPO, MARLOO, MAReMax and MAREINFORCE, one class
(:class:`GroupBaselineRecipe`) read top to bottom.

Its constructor is the setup (agents, environment and config checked; LoRA, devices,
reference models, data parallel wrapping, optimizers and agent pools). One step
(:meth:`GroupBaselineRecipe.step`): the next ``batch_size`` examples; the rollout
(:meth:`~GroupBaselineRecipe.sample`: ``G`` completions per agent per node, joint actions
scored, multi-turn feedback opening the next turn's nodes, returns discounted down the
tree); the advantages
(:func:`~comlrl.algos.recipes.group_baseline.advantages.group_advantages`: each completion
credited with the mean return of its joint actions, less ``kl_coef`` times its
:meth:`~GroupBaselineRecipe.reward_kl` with ``kl_mode="reward"``, and compared with its
group by the estimator); every agent's update (:meth:`~GroupBaselineRecipe.update`); the
metrics (with ``grad_norm_ratio``, the largest agent's pre-clip gradient norm over the
median agent's).

The four methods differ only in ``config.estimator``; ``advantage_stats`` and
``advantage_group`` pick whose returns and which completions each baseline is taken over; :class:`MAGRPOTrainer`,
:class:`MARLOOTrainer`, :class:`MAReMaxTrainer` and :class:`MAREINFORCETrainer` fix it. The
loop driver (:func:`comlrl.algos.training.loop.run_loop`) drives the class; under data
parallelism every rank calls its methods and rank 0 writes. The actor-critic recipes
compose its sampling and update.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from comlrl.algos.models.gradient_sync import (
    GradientSync,
    full_state_dicts,
    full_weights,
    wrap_model,
)
from comlrl.algos.models.ranks import (
    all_reduce_flag,
    barrier,
    gather_objects,
    rank_and_world,
    shard_bounds,
)
from comlrl.algos.recipes.group_baseline.advantages import group_advantages, reward_kl
from comlrl.algos.recipes.launch import load_eval_split, preflight
from comlrl.algos.records import Rollout
from comlrl.algos.rollout import evaluate as evaluation
from comlrl.algos.rollout.agent import as_agents
from comlrl.algos.rollout.environment import (
    Environment,
    Transition,
    build_environment,
    check_environment,
)
from comlrl.algos.rollout.metrics import merge_summaries, rollout_summary, summary_metrics
from comlrl.algos.rollout.tree import TreeSettings, derive_seed, rollout
from comlrl.algos.training.config.rl import ConfigError, RLConfig, TrainConfig
from comlrl.algos.training.loop import Collective, Schedule, StepResult, rewind_outputs, run_loop
from comlrl.algos.training.run import checkpoint as ckpt
from comlrl.algos.training.run.data_mixture import example_stream
from comlrl.algos.training.run.diagnostics import (
    EarlyEndWatch,
    LearningSignalWatch,
    warn_if_cannot_learn,
)
from comlrl.algos.training.run.lifecycle import run_record
from comlrl.algos.training.run.outputs import RunOutputs
from comlrl.algos.training.run.saving import save_agent_checkpoint
from comlrl.algos.training.run.summary import summary_line
from comlrl.algos.training.update.agents import build_optimizer
from comlrl.algos.training.update.grad_norms import grad_norm_ratio
from comlrl.algos.training.update.metric_sums import split_terms
from comlrl.algos.training.update.node_chunks import update_in_node_chunks
from comlrl.algos.training.update.placement import agent_pools, agent_seed, place_agents
from comlrl.algos.training.update.settings import UpdateSettings, update_settings
from comlrl.algos.training.update.shared_models import (
    adapter_groups,
    sharing_groups,
    update_adapter_group,
    update_sharers,
)
from comlrl.core import SamplingParams, Task
from comlrl.estimators.registry import ESTIMATORS

__all__ = [
    "GroupBaselineRecipe",
    "MultiAgentTrainer",
    "MAGRPOTrainer",
    "MARLOOTrainer",
    "MAReMaxTrainer",
    "MAREINFORCETrainer",
]

#: ``extra(a, members) -> (extra_loss, extra_params)`` for the update of the agents
#: ``members`` that share agent ``a``'s model: a loss term added to theirs and the
#: parameters it reaches (the actor-critic recipes' value heads), or ``None``.
ExtraLoss = Callable[
    [int, list[int]],
    tuple[Callable[[], Mapping[str, float]] | None, list[torch.nn.Parameter]] | None,
]


class GroupBaselineRecipe:
    """Train ``A`` cooperating causal-LM agents with a group-baseline policy gradient.

    Give the environment in one form (:func:`~comlrl.algos.rollout.environment.build_environment`):
    a ``task`` (a :class:`comlrl.core.Task`: examples, per-agent prompts, batched joint
    reward, and for ``num_turns > 1`` its feedback), a ready ``environment`` with
    ``dataset``, or ``dataset`` + ``formatters`` + ``reward_func`` (CoMLRL's form:
    ``reward_func(completions_agent1, ..., completions_agentA) -> list[float]``) and, for
    ``num_turns > 1``, ``transition`` (CoMLRL's ``external_transition``).

    Args:
        agents: ``A`` agents: :class:`~comlrl.algos.HFAgent` objects, ``(model, tokenizer)``
            pairs, or your own :class:`comlrl.core.Agent` with ``model`` and ``tokenizer``.
        config: a validated :class:`~comlrl.algos.training.config.rl.TrainConfig`;
            ``config.estimator`` picks the baseline (a subclass's :attr:`estimator` wins).
        task, dataset, formatters, reward_func, transition, environment: the environment
            and the training examples (with a task, ``task.load(config.task.split)`` unless
            ``dataset`` is given).
        eval_dataset: examples for evaluation (``config.eval_every``, :meth:`evaluate`);
            with a task and ``config.eval_every > 0`` it defaults to
            ``task.load(config.eval_split)``; cut to ``config.eval_limit``.
        eval_env: the environment evaluation plays and scores in (default: the training
            one), e.g. the task's true reward while training on a learned reward model.
        outputs: where the run writes (default ``RunOutputs.of(config)``).
        record: what ``config.yaml`` holds (default: the config with the task or reward
            function and the models really trained, :func:`~comlrl.algos.training.run.lifecycle.run_record`).
        update: the agents' update settings (default :func:`update_settings` of the config).
        extra_param_groups: per agent index, parameter groups its optimizer also steps
            (the actor-critic recipes' value heads on the agent's model); agents on one
            model object: the first one's optimizer steps them.
        group_baseline: ``False`` when the caller's baseline is not ``config.estimator``
            (the actor-critic recipes compose this class), so no warning about it.

    Under ``torch.distributed`` with ``K > 1`` ranks (every rank builds the recipe alike)
    gradients are averaged (:mod:`comlrl.algos.models.gradient_sync`,
    ``config.data_parallel``), each rank rolls out ``batch_size / K`` prompts per step and
    agents are updated one after another.

    Raises:
        ConfigError: when the agents, environment, dataset and config disagree, evaluation
            is on without an evaluation set, ``eval_env`` is for another number of agents,
            or ``batch_size`` is not a multiple of the number of ranks (before any training
            work starts).
    """

    #: the estimator this class fixes (``None``: ``config.estimator``)
    estimator: ClassVar[str | None] = None
    #: the recipe's name in ``config.yaml`` (``None``: not recorded)
    algo: ClassVar[str | None] = None

    def __init__(
        self,
        agents: Sequence[Any],
        config: RLConfig,
        *,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], Any]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        transition: Transition | None = None,
        environment: Environment | None = None,
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        eval_env: Environment | None = None,
        outputs: RunOutputs | None = None,
        record: Mapping[str, Any] | None = None,
        update: UpdateSettings | None = None,
        extra_param_groups: Mapping[int, Sequence[dict[str, Any]]] | None = None,
        group_baseline: bool = True,
    ) -> None:
        config = self._with_estimator(config)
        self.config = config
        self.agents = as_agents(agents, **config.generation_options())
        n = len(self.agents)
        self.task = task
        try:
            self.env, dataset = build_environment(
                n, task=task, dataset=dataset, formatters=formatters, reward_func=reward_func,
                transition=transition, environment=environment, split=config.task.split,
            )  # fmt: skip
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if task is not None and eval_dataset is None and config.eval_every:
            try:
                eval_dataset = list(task.load(config.eval_split))
            except ValueError as exc:
                raise ConfigError(f"eval_split={config.eval_split!r}: {exc}") from None
        self.outputs = outputs if outputs is not None else RunOutputs.of(config)
        self.record = self.outputs.record(
            record
            if record is not None
            else run_record(
                config, algo=self.algo, task=task, reward_func=reward_func, agents=self.agents
            )
        )
        self.global_step = 0

        # --- the agents, environment, data and config agree -------------------------------
        if n != config.num_agents:
            raise ConfigError(
                f"{n} agents were given but config.num_agents={config.num_agents}; make them agree."
            )
        try:
            check_environment(self.env, n, config.num_turns, eval_env)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        try:
            # task.mixture: each prompt's task drawn by weight
            self.data = example_stream(
                dataset, seed=config.seed, shuffle=config.shuffle, task=config.task
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if eval_dataset is not None:
            eval_dataset = list(eval_dataset)[: config.eval_limit]
            if not eval_dataset:
                raise ConfigError(
                    f"the evaluation set is empty (eval_split={config.eval_split!r}); give problems."
                )
        elif config.eval_every:
            raise ConfigError(
                f"eval_every={config.eval_every} but no evaluation set was given: pass "
                "eval_dataset= (or a task with an eval_split), or set eval_every=0."
            )
        self.eval_data = eval_dataset
        #: the environment whose reward scores :meth:`evaluate` (None: ``env``; MARLHF
        #: trains on a learned reward and evaluates on the task's own)
        self.eval_env = eval_env
        self.rank, self.world_size = rank_and_world()
        if self.world_size > 1:
            try:
                shard_bounds(config.batch_size, self.rank, self.world_size)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            if (
                config.kl_mode == "reward"
                and config.kl_coef > 0
                and config.data_parallel == "fsdp2"
            ):
                raise ConfigError(
                    "kl_mode='reward' is not supported with data_parallel=fsdp2 (its KL pass "
                    "runs each rank's own forward); use data_parallel=ddp or kl_mode=loss."
                )
            if isinstance(config, TrainConfig) and config.update_chunk_nodes is not None:
                raise ConfigError(
                    f"update_chunk_nodes={config.update_chunk_nodes} is not supported under "
                    "torchrun data parallelism (each rank's share of the trees would cut into "
                    "different chunks); run one process or leave it unset."
                )
        warn_if_cannot_learn(config, self.agents, self.env, dataset, group_baseline=group_baseline)

        # --- LoRA, devices, reference models, data parallel wrapping, optimizers ----------
        devices, self.ref_models = place_agents(self.agents, config, self.rank, self.world_size)
        # the reference copies are taken from the whole models, before any sharding; the
        # optimizers are built after it (fsdp2 replaces the parameters by sharded ones)
        self.syncs: list[GradientSync] | None = None
        if self.world_size > 1:
            by_model: dict[int, GradientSync] = {}  # one wrapper per model object
            self.syncs = [
                by_model.setdefault(id(a.model), wrap_model(a.model, config.data_parallel))
                for a in self.agents
            ]
        self.optimizers = [
            build_optimizer(
                [p for p in a.model.parameters() if p.requires_grad],
                config.optimizer,
                lr=config.learning_rate,
                weight_decay=config.weight_decay,
            )
            for a in self.agents
        ]
        # agents on one model object step together with their leader's optimizer
        leader = {a: g[0] for g in sharing_groups([a.model for a in self.agents]) for a in g}
        for i, groups in (extra_param_groups or {}).items():
            for group in groups:
                self.optimizers[leader[i]].add_param_group(group)

        # --- sampling, the rollout tree, the update, the agent pools -----------------------
        self.sampling = SamplingParams.from_config(config, config.num_generations)
        self.tree = TreeSettings(
            num_turns=config.num_turns,
            gamma=config.gamma,
            joint_mode=config.joint_mode,
            early_termination_threshold=config.early_termination_threshold,
            termination_scope=config.termination_scope,
            max_branches=config.max_branches,
            branch_select=config.branch_select,
            hold_terminal_reward=config.hold_terminal_reward,
        )
        self.update_settings = (
            update if update is not None else update_settings(config, self.agents)
        )
        self.sample_pool, self.update_pool = agent_pools(
            self.agents, devices, parallel=config.parallel_agents, world_size=self.world_size
        )
        self.rng = random.Random(config.seed)

    @classmethod
    def _with_estimator(cls, config: RLConfig) -> RLConfig:
        """``config`` with the estimator :attr:`estimator` fixes (a copy), or as it is.

        Raises:
            ConfigError: the config sets another estimator explicitly.
        """
        if (
            cls.estimator is None
            or not isinstance(config, TrainConfig)
            or ESTIMATORS[config.estimator].name == cls.estimator
        ):
            return config
        if "estimator" in config.model_fields_set:
            raise ConfigError(
                f"{cls.__name__} uses estimator={cls.estimator!r} but "
                f"config.estimator={config.estimator!r}; use MultiAgentTrainer for other estimators."
            )
        return config.model_copy(update={"estimator": cls.estimator})

    # --- what the launcher asks of the recipe (comlrl.algos.recipes.launch) ------------

    @classmethod
    def inputs(cls, config: Any) -> tuple[Any, list[Any], list[Any] | None]:
        """The task, its training examples and (``eval_every > 0``) its ``eval_split``,
        checked before any model loads (:func:`~comlrl.algos.recipes.launch.preflight`).
        One model for every role (``role_format``) cannot call tools.

        Raises:
            ConfigError: as ``preflight``, or an ``eval_split`` the task does not have.
        """
        roles = getattr(config, "role_format", None) is not None
        task, examples = preflight(
            config, config.models, refuse_tools="centralized_magrpo" if roles else None
        )
        try:
            evals = load_eval_split(task, config.eval_split) if config.eval_every else None
        except BaseException:
            task.close()
            raise
        return task, examples, evals

    @classmethod
    def describe(cls, config: Any) -> str:
        """``estimator grpo, 160 steps of 4 prompts x 4 completions`` (with ``role_format``:
        ``centralized MAGRPO (one joint policy, sentences role format), ...``)."""
        s = "s" if config.num_steps != 1 else ""
        label = f"estimator {config.estimator}"
        if getattr(config, "role_format", None) is not None:
            name = "MAGRPO" if config.estimator == "grpo" else label
            label = f"centralized {name} (one joint policy, {config.role_format} role format)"
        return (
            f"{label}, {config.num_steps} step{s} of "
            f"{config.batch_size} prompts x {config.num_generations} completions"
        )

    @classmethod
    def agent_options(cls, config: Any) -> dict[str, Any]:
        """The generation backend and prompt format of every agent."""
        return dict(config.generation_options())

    @property
    def is_main(self) -> bool:
        """True on the rank that writes logs, samples and checkpoints (rank 0)."""
        return self.rank == 0

    @property
    def output_dir(self) -> Path:
        """Where metrics, samples and checkpoints go."""
        return self.outputs.output_dir

    # --- one step -----------------------------------------------------------------------

    def step(self) -> StepResult:
        """One step: rollout, advantages, every agent's update; returns the metrics row and
        the rollout (for ``samples.jsonl``).

        A step that fails before the update (in the rollout: sampling, a reward function,
        the task's feedback) leaves the data and random streams as the last completed step
        left them, and the weights and optimizers untouched, so the checkpoint the loop
        driver writes on the way out resumes exactly.

        Data parallel (every rank calls this together): this rank rolls out its share of
        the global batch, the update averages gradients over the ranks, and the returned
        metrics (rewards, advantages, lengths, losses, KL, clip fractions, tokens) are those
        of the global batch; timings are this rank's.
        """
        cfg = self.config
        if not isinstance(cfg, TrainConfig):
            raise TypeError(
                "the group-baseline step needs a TrainConfig (estimator, advantage scaling), "
                f"got {type(cfg).__name__}"
            )
        t0 = time.perf_counter()
        with self.streams_kept_on_failure():
            examples = self.data.next_batch(cfg.batch_size)  # the same global batch on every rank
            ro = self.sample(examples)
            kl = self.reward_kl(ro)
            adv = group_advantages(
                ro, estimator=cfg.estimator, scale=cfg.advantage_scale, eps=cfg.advantage_eps,
                penalties=[[cfg.kl_coef * k for k in per] for per in kl] if kl else None,
                stats=cfg.advantage_stats, group=cfg.advantage_group,
            )  # fmt: skip
        t1 = time.perf_counter()
        stats = self.update(ro, adv)
        t2 = time.perf_counter()
        self.global_step += 1
        summary = rollout_summary(
            ro, [[per_agent[a] for a in range(len(self.agents))] for per_agent in adv]
        )
        metrics = summary_metrics(merge_summaries(gather_objects(summary)))
        for a, agent_stats in enumerate(stats):
            metrics.update({f"{k}/agent_{a}": v for k, v in agent_stats.items()})
        ratio = grad_norm_ratio([s["grad_norm"] for s in stats if "grad_norm" in s])
        if ratio is not None:
            metrics["grad_norm_ratio"] = ratio
        for a in range(len(self.agents) if kl else 0):  # each agent's mean KL and its penalty
            mean = float(torch.cat([per[a] for per in kl]).mean())  # type: ignore[union-attr]
            metrics[f"reward_kl/agent_{a}"] = mean
            metrics[f"reward_kl_penalty/agent_{a}"] = cfg.kl_coef * mean
        elapsed = t2 - t0
        row = {
            "step": self.global_step,
            **metrics,
            **{f"time/{k}": v for k, v in ro.timings.items()},
            "time/update_s": t2 - t1,
            "time/step_s": elapsed,
            "tokens_per_s": metrics["num_tokens"] / elapsed,
            "prompts_per_s": len(examples) / elapsed,
        }
        return StepResult(row, ro)

    def train_step(self) -> dict[str, float]:
        """The metrics row of one :meth:`step` (for callers that do not log samples)."""
        return self.step().row

    def reward_kl(self, ro: Rollout) -> list[list[torch.Tensor]] | None:
        """With ``kl_mode="reward"`` (and ``kl_coef > 0``) each completion's summed KL to its
        agent's reference model, per turn and agent (:func:`~comlrl.algos.recipes.group_baseline.advantages.reward_kl`,
        before the update); None otherwise."""
        cfg = self.config
        if cfg.kl_mode != "reward" or self.ref_models is None:
            return None
        models = [agent.model for agent in self.agents]
        return reward_kl(models, self.ref_models, ro, self.update_settings, cfg.kl_estimator)

    def streams_kept_on_failure(self) -> Any:
        """:func:`~comlrl.algos.training.run.checkpoint.streams_kept_on_failure` of this
        run's data and random streams."""
        return ckpt.streams_kept_on_failure(self.data, self.rng, self.generators())

    def sample(self, examples: Sequence[Mapping[str, Any]]) -> Rollout:
        """The rollout of this rank's share of ``examples`` (the global batch), with
        ``sampling_rng="prompt"`` each prompt's completions drawn from its own seed."""
        cfg = self.config
        keys = (
            [derive_seed(cfg.seed, self.global_step, j) for j in range(len(examples))]
            if cfg.sampling_rng == "prompt"
            else None
        )
        lo, hi = shard_bounds(len(examples), self.rank, self.world_size)
        with full_weights(self.syncs):  # fsdp2: whole weights for sampling, resharded after
            return rollout(
                self.agents,
                examples[lo:hi],
                self.env,
                self.sampling,
                self.tree,
                map_agents=self.sample_pool.map,
                rng=self.rng,
                sample_keys=keys[lo:hi] if keys is not None else None,
            )

    def update(
        self,
        ro: Rollout,
        adv: Sequence[Sequence[torch.Tensor]],
        extra: ExtraLoss | None = None,
    ) -> list[dict[str, float]]:
        """Every agent's update on ``ro`` with advantages ``adv`` (per turn, per agent);
        returns each agent's metrics. Agents that share one model object take one step on
        the sum of their losses (one set of optimizer moments, the first sharer's
        optimizer); each reports that step's loss and grad norm and its own completions'
        KL/clip/ratio (:mod:`comlrl.algos.training.update.shared_models`); LoRA adapters
        of one batching base take one forward and backward per micro-batch together, each
        stepping its own optimizer. ``extra`` adds a loss term to a sharing group's step
        (:data:`ExtraLoss`)."""
        cfg = self.config
        chunk_nodes = cfg.update_chunk_nodes if isinstance(cfg, TrainConfig) else None
        models = [agent.model for agent in self.agents]
        groups = {g[0]: g for g in sharing_groups(models)}
        together = chunk_nodes is None and self.syncs is None and extra is None
        batched = {g[0]: g for g in adapter_groups(models)} if together else {}
        in_batch = {m for g in batched.values() for m in g[1:]}
        # no reference in the update when the KL is in the reward
        refs = self.ref_models if self.update_settings.kl_coef > 0 else None

        def update(a: int) -> dict[int, dict[str, float]]:
            if a in batched:
                return update_adapter_group(
                    models, self.optimizers, ro, adv, batched[a], self.update_settings,
                    ref_models=refs,
                )  # fmt: skip
            members = groups.get(a)
            if members is None or a in in_batch:  # another agent's update steps this model
                return {}
            ref_model = refs[a] if refs is not None else None
            sync = self.syncs[a] if self.syncs is not None else None
            if chunk_nodes is not None:  # 1.4.3's schedule: chunks of tree nodes
                assert isinstance(cfg, TrainConfig)
                return split_terms(
                    update_in_node_chunks(
                        self.agents[a].model, self.optimizers[a], ro, adv, members,
                        self.update_settings, chunk_nodes,
                        split_turns=cfg.update_chunk_split_turns, ref_model=ref_model, sync=sync,
                    ),
                    members,
                )  # fmt: skip
            extra_loss, extra_params = (extra(a, members) if extra is not None else None) or (
                None,
                [],
            )
            return update_sharers(
                self.agents[a].model, self.optimizers[a], ro, adv, members,
                self.update_settings, ref_model=ref_model, sync=sync,
                extra_loss=extra_loss, extra_params=extra_params,
            )  # fmt: skip

        stats: list[dict[str, float]] = [{} for _ in self.agents]
        for per_member in self.update_pool.map(update):
            for m, own in per_member.items():
                stats[m] = own
        return stats

    # --- evaluation ---------------------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """The ``eval.jsonl`` row of the agents on the evaluation set (the training
        rollout, greedy or sampled, no update, scored in ``eval_env`` when set;
        :mod:`comlrl.algos.rollout.evaluate`). Raises ConfigError without an evaluation
        set."""
        row, _ = self.evaluate_rollouts()
        return row

    def evaluate_rollouts(
        self, progress: Callable[[int], None] | None = None
    ) -> tuple[dict[str, float], list[Rollout]]:
        """:meth:`evaluate`'s row and the evaluation rollouts themselves (``comlrl eval``
        writes their joint actions); ``progress`` is called with the examples done after
        each batch.

        Raises:
            ConfigError: the run has no evaluation set.
        """
        cfg = self.config
        if self.eval_data is None:
            raise ConfigError("this run has no evaluation set; pass eval_dataset=.")
        params = evaluation.eval_sampling(
            cfg.eval_num_samples,
            cfg.max_new_tokens,
            greedy=cfg.eval_greedy,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
        )
        row, rollouts = evaluation.evaluate(
            self.agents,
            self.env if self.eval_env is None else self.eval_env,
            self.eval_data,
            params,
            self.tree,
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            map_agents=self.sample_pool.map,
            progress=progress,
        )  # fsdp2: called inside full_weights (the loop's collective), so no collective runs here
        return {"step": self.global_step, **row}, rollouts

    # --- saving and resuming ------------------------------------------------------------

    def save(self, tag: str) -> list[Path]:
        """Write every agent to ``output_dir/<tag>/agent_<i>`` (Hugging Face format,
        atomically). Data parallel: every rank calls this (``fsdp2`` gathers the weights to
        rank 0); rank 0 writes, the others return ``[]``."""
        states = full_state_dicts(self.syncs, len(self.agents))
        if not self.is_main:
            return []
        return [
            save_agent_checkpoint(agent, self.output_dir / tag / f"agent_{i}", state_dict=states[i])
            for i, agent in enumerate(self.agents)
        ]

    def save_final(self, path: Path) -> list[Path]:
        """The trained agents in ``path`` (``final/``), as :meth:`save` writes them."""
        return self.save(Path(path).name)

    def generators(self) -> list[torch.Generator | None]:
        """Each agent's own sampling stream (``None`` where it draws from torch's)."""
        return [getattr(a, "generator", None) for a in self.agents]

    def capture_state(self) -> dict[str, Any]:
        """The training state a step checkpoint holds besides the weights
        (:func:`~comlrl.algos.training.run.checkpoint.capture_state`: optimizers, data
        stream, random streams, the step). Data parallel: every rank calls this (``fsdp2``
        gathers the optimizer state)."""
        optimizer_states = (
            [
                sync.optimizer_state_dict(opt)
                for sync, opt in zip(self.syncs, self.optimizers, strict=True)
            ]
            if self.syncs is not None
            else None
        )
        return ckpt.capture_state(
            step=self.global_step,
            optimizers=self.optimizers,
            data=self.data,
            rng=self.rng,
            generators=self.generators(),
            optimizer_states=optimizer_states,
        )

    def checkpoint(
        self, path: str | Path | None = None, *, recipe_state: Mapping[str, Any] | None = None
    ) -> Path:
        """Write the step checkpoint ``path`` (default ``output_dir/checkpoints/step-N``):
        agents + training state, atomically; returns the folder. (The loop driver prunes to
        ``keep_last``.) ``recipe_state``: a recipe's own state, saved under
        :data:`~comlrl.algos.training.run.checkpoint.RECIPE_STATE` (MARLHF-Iter's rounds).

        Data parallel: every rank calls this (``fsdp2`` gathers weights and optimizer state
        to rank 0); rank 0 writes and every rank gets the folder's path back.
        """
        path = (
            Path(path)
            if path is not None
            else ckpt.step_checkpoint_path(self.output_dir, self.global_step)
        )
        models = full_state_dicts(self.syncs, len(self.agents))
        state = self.capture_state()
        if not self.is_main:
            return path
        if recipe_state is not None:
            state[ckpt.RECIPE_STATE] = dict(recipe_state)
        return ckpt.write_checkpoint(path, self.agents, state, state_dicts=models)

    def resume(self, path: str | Path, *, state: Mapping[str, Any] | None = None) -> int:
        """Put the run back at the step checkpoint ``path`` (weights, optimizers, data
        stream, random streams), cut the logs in ``output_dir`` back to its step, and return
        the step: :meth:`train` then continues as if never stopped. ``state``: the
        checkpoint's ``training_state.pt`` when the caller has read it already.

        Raises:
            CheckpointError: the checkpoint is incomplete or does not fit the run.
        """
        if state is None:
            state = ckpt.load_training_state(path)
        for i, agent in enumerate(self.agents):
            sync = self.syncs[i] if self.syncs is not None else None
            ckpt.load_agent_weights(
                agent.model,
                Path(path) / f"agent_{i}",
                load_state_dict=sync.load_model_state_dict if sync is not None else None,
            )
        self.global_step = ckpt.restore_state(
            state,
            optimizers=self.optimizers,
            data=self.data,
            rng=self.rng,
            generators=self.generators(),
            load_optimizer=(
                [sync.load_optimizer_state_dict for sync in self.syncs]
                if self.syncs is not None
                else None
            ),
        )
        if self.world_size > 1:
            # The checkpoint holds rank 0's streams; other ranks need their own. (With
            # sampling_rng="prompt" the streams are unused and the run continues exactly on
            # any number of ranks.)
            for i, agent in enumerate(self.agents):
                if self.rank > 0 and hasattr(agent, "seed"):
                    agent.seed(agent_seed(self.config.seed, i, self.rank, self.global_step))
        if self.is_main:
            rewind_outputs(self.output_dir, self.global_step)
        barrier()
        return self.global_step

    # --- the loop -----------------------------------------------------------------------

    def schedule(self) -> Schedule:
        """What the config asks of the loop driver: ``num_steps``, evaluation rows in
        ``eval.jsonl`` every ``eval_every`` steps (and at step 0 with ``eval_on_start``),
        ``log_samples`` joint actions per step, ``config.yaml``, and the warnings of runs
        that cannot learn (:class:`~comlrl.algos.training.run.diagnostics.LearningSignalWatch`,
        :class:`~comlrl.algos.training.run.diagnostics.EarlyEndWatch`)."""
        cfg = self.config
        task = (self.record.get("task") or {}).get("name", cfg.task.name)
        models = self.record.get("models") or cfg.models
        return Schedule(
            num_steps=cfg.num_steps,
            evaluates=self.eval_data is not None,
            eval_every=cfg.eval_every,
            eval_on_start=cfg.eval_on_start and bool(cfg.eval_every),
            log_samples=cfg.log_samples,
            desc=self.algo or "train",
            record=self.record,
            title=f"{task} - {', '.join(str(m) for m in models)} - {cfg.baseline_label}",
            watches=lambda: [
                LearningSignalWatch(),
                EarlyEndWatch(cfg.num_turns, cfg.early_termination_threshold, cfg.gamma),
            ],
        )

    def collective(self) -> Collective:
        """How the ranks of this run agree (one process: the defaults)."""
        return Collective(
            is_main=self.is_main,
            any_rank=all_reduce_flag,
            barrier=barrier,
            full_weights=lambda: full_weights(self.syncs),
            world_size=self.world_size,
        )

    def train(self, *, overwrite: bool | None = None) -> list[dict[str, float]]:
        """Run ``config.num_steps`` steps under the loop driver
        (:func:`comlrl.algos.training.loop.run_loop`) and return their metrics rows; closes
        the task and the agent pools after.

        Writes ``metrics.jsonl``, ``samples.jsonl``, ``eval.jsonl``, ``config.yaml``, step
        checkpoints and ``final/`` in ``output_dir`` and every row to the reporters. A run put
        back by :meth:`resume` continues from its step. A fresh run refuses an ``output_dir``
        that holds another run unless ``overwrite`` (default: the outputs' own). Data
        parallel: every rank calls this; rank 0 alone writes.

        Raises:
            ConfigError: ``output_dir`` holds another run and ``overwrite`` is False.
            TrainingInterrupted: after Ctrl-C or SIGTERM: the step in progress was finished
                and checkpointed (the exception names the checkpoint).
        """
        outputs = self.outputs
        if overwrite is not None and overwrite != outputs.overwrite:
            outputs = RunOutputs(**{**vars(outputs), "overwrite": overwrite})
        if self.global_step == 0:  # a resumed run has its random streams back
            torch.manual_seed(self.config.seed)
        try:
            return run_loop(self, outputs)
        finally:
            self.close()

    def summary(self, history: Sequence[Mapping[str, Any]]) -> str:
        """The closing line of a run (reward first -> last quarter, where the outputs are)."""
        return summary_line(history, self.output_dir)

    def close(self) -> None:
        """Stop the worker threads and close the task (safe to call twice)."""
        self.sample_pool.close()
        self.update_pool.close()
        if self.task is not None:
            self.task.close()


class MultiAgentTrainer(GroupBaselineRecipe):
    """The group-baseline recipe with ``config.estimator`` (:class:`GroupBaselineRecipe`)."""


class MAGRPOTrainer(MultiAgentTrainer):
    """Multi-agent GRPO: group-mean baseline, divided by the group std (Shao et al. 2024, eq. 3)."""

    estimator = "grpo"


class MARLOOTrainer(MultiAgentTrainer):
    """Multi-agent RLOO: leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024)."""

    estimator = "rloo"


class MAReMaxTrainer(MultiAgentTrainer):
    """Multi-agent ReMax: the best return of the other samples as the baseline (after Li et
    al. 2023; leave-one-out, so unbiased)."""

    estimator = "remax"


class MAREINFORCETrainer(MultiAgentTrainer):
    """Multi-agent REINFORCE: no baseline (Williams 1992)."""

    estimator = "reinforce"
