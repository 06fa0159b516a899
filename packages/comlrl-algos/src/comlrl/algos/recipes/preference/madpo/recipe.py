"""Multi-agent DPO (MADPO): per prompt each agent samples ``K`` candidates with
:func:`comlrl.algos.rollout.tree.rollout`, the reward function scores the joint actions,
:func:`preference_pairs` pairs them by reward gap, and every agent takes a step on
:func:`~comlrl.estimators.preference_losses.multi_agent_dpo_loss` against its own frozen
reference model (:func:`madpo_setup`, :func:`madpo_step`, :func:`train_madpo`).

Named axes: ``N`` prompts, ``A`` agents, ``K`` candidates (joint actions) per prompt,
``P`` pairs.

MADPO's trainer object: ``A`` agents on a task (or CoMLRL's ``dataset`` + ``formatters``
+ ``reward_func`` form), a thin front over :mod:`comlrl.algos.recipes.preference.madpo.recipe`
that checks its arguments and config when built and calls the recipe's loop in ``train``.

The end-to-end run of MADPO (``algo=madpo``): its run config (the library config plus
the agents' models, the task, the evaluation split and the outputs) and the run: check the
task, load the agents, train joint DPO on reward-gap pairs sampled online, write each
agent's final weights to ``final/agent_<i>``.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.models.logprobs import sampling_mode
from comlrl.algos.models.threads import small_model_threads
from comlrl.algos.recipes.launch import (
    RunOutputs,
    RunResult,
    announce,
    load_agents,
    load_eval_split,
    loss_summary,
    preflight,
    quiet_transformers,
    resuming_line,
    setup_errors,
    start_outputs,
)
from comlrl.algos.recipes.preference.checkpoint import (
    loop_settings,
    read_step_checkpoint,
    save_models,
    write_step_checkpoint,
)
from comlrl.algos.recipes.preference.encoding import (
    clipped_optimizer_step,
    model_device,
    sequence_logprobs,
)
from comlrl.algos.recipes.preference.inputs import as_agents, check_config, environment
from comlrl.algos.recipes.preference.madpo.config import MADPOConfig, MADPORunConfig
from comlrl.algos.recipes.preference.madpo.initial_pairs import (
    build_initial_pairs,
    rollout_pairs,
)
from comlrl.algos.recipes.preference.pairs import (
    IterPair,
    JointPreferencePairs,
    joint_pairs,
    preference_pairs,
)
from comlrl.algos.records import PolicyBatch
from comlrl.algos.rollout.environment import Environment
from comlrl.algos.rollout.tree import TreeSettings, rollout
from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.loop import (
    RecipeLoop,
    StepResult,
    run_loop,
)
from comlrl.algos.training.run.data import DataStream
from comlrl.algos.training.run.data_mixture import example_stream
from comlrl.algos.training.run.reporting import Reporter
from comlrl.algos.training.update.agents import build_optimizer, resolve_device
from comlrl.core import SamplingParams, Task
from comlrl.estimators.preference_losses import (
    multi_agent_dpo_loss,
)

__all__ = [
    "MADPORun",
    "madpo_setup",
    "madpo_pair_metrics",
    "madpo_step",
    "madpo_update",
    "madpo_evaluate",
    "madpo_checkpoint",
    "madpo_resume",
    "train_madpo",
    "MADPOTrainer",
    "run_madpo",
]


@dataclass
class MADPORun:
    """What a MADPO run holds between steps (built by :func:`madpo_setup`)."""

    config: MADPOConfig
    agents: list[Any]
    ref_models: list[Any]
    env: Environment
    data: DataStream
    optimizers: list[torch.optim.Optimizer]
    sampling: SamplingParams
    tree: TreeSettings
    rng: random.Random
    eval_pairs: JointPreferencePairs | None = None
    eval_data: Sequence[Mapping[str, Any]] | None = None
    step: int = 0
    pairs: list[IterPair] | None = None  # pair_source="initial": the pairs built at setup


def madpo_setup(
    agents: Sequence[Any],
    config: MADPOConfig,
    env: Environment,
    dataset: Sequence[Mapping[str, Any]],
    eval_dataset: Sequence[Mapping[str, Any]] | None = None,
    *,
    ref_models: Sequence[Any] | None = None,
) -> MADPORun:
    """Check agents, environment and config; freeze a reference model per agent; build
    optimizers; with ``config.pair_source="initial"``, build every training prompt's
    pairs from the initial policies (:func:`~comlrl.algos.recipes.preference.madpo.initial_pairs.build_initial_pairs`;
    ``run.pairs``; with ``num_epochs`` the run's ``config.num_steps`` becomes
    ``num_epochs * ceil(P / batch_size)``, at least 1); and, with an ``eval_dataset``,
    sample held-out pairs once from the initial policies (:func:`madpo_pair_metrics`
    measures their margin as training goes).

    ``ref_models`` defaults to a deep copy of each agent's model, made here, once; an
    entry ``None`` makes that agent's loss reference-free (``log pi_ref = 0``), as
    ``config.reference_free`` does for every agent.

    Raises:
        ConfigError: agent counts disagree, agents share one model object (each agent
            needs its own parameters and optimizer), a multi-turn environment limit below
            1, an empty dataset, ``ref_models`` of the wrong length, or ``ref_models``
            with ``reference_free``.
    """
    n = len(agents)
    if n != config.num_agents or env.num_agents != n:
        raise ConfigError(
            f"{n} agents, config.num_agents={config.num_agents}, task for {env.num_agents} agents; make them agree."
        )
    if len({id(a.model) for a in agents}) != n:
        raise ConfigError(
            "MADPO agents share a model object; give each agent its own model (e.g. load it twice)."
        )
    if ref_models is not None and config.reference_free:
        raise ConfigError(
            "ref_models were given but config.reference_free=True uses none; drop one of them."
        )
    if config.reference_free:
        ref_models = [None] * n
    if ref_models is not None and len(ref_models) != n:
        raise ConfigError(
            f"{len(ref_models)} reference models for {n} agents; give one per agent or None."
        )
    try:
        data = example_stream(dataset, seed=config.seed, task=getattr(config, "task", None))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    torch.manual_seed(config.seed)
    device = resolve_device(config.device)
    optimizers = []
    for i, agent in enumerate(agents):
        agent.model.to(device).train()
        if hasattr(agent, "seed"):
            agent.seed(config.seed * 1_000_003 + i)
        optimizers.append(
            build_optimizer(
                [p for p in agent.model.parameters() if p.requires_grad],
                config.optimizer,
                lr=config.learning_rate,
                weight_decay=config.weight_decay,
            )
        )
    refs = [copy.deepcopy(a.model) for a in agents] if ref_models is None else list(ref_models)
    for ref in refs:
        if ref is not None:  # None: no reference for that agent (log pi_ref = 0)
            ref.to(device).eval().requires_grad_(False)
    run = MADPORun(
        config=config,
        agents=list(agents),
        ref_models=refs,
        env=env,
        data=data,
        optimizers=optimizers,
        sampling=SamplingParams.from_config(config, config.num_candidates),
        tree=TreeSettings(num_turns=1, joint_mode=config.joint_mode),
        rng=random.Random(config.seed),
        eval_data=list(eval_dataset) if eval_dataset is not None else None,
    )
    if config.pair_source == "initial":
        _initial_pairs(run, list(dataset))
    if run.eval_data:
        ro = rollout(
            run.agents,
            run.eval_data,
            env,
            run.sampling,
            run.tree,
            rng=random.Random(config.seed + 1),
        )
        run.eval_pairs = preference_pairs(
            ro, min_gap=config.min_gap, pairs_per_prompt=config.pairs_per_prompt
        )
    return run


def _initial_pairs(run: MADPORun, dataset: Sequence[Mapping[str, Any]]) -> None:
    """``pair_source="initial"``: the run's pairs and the stream the steps draw them from."""
    cfg = run.config
    run.pairs = build_initial_pairs(
        run.agents, run.env, dataset, run.sampling, run.tree, batch_size=cfg.batch_size,
        selection=cfg.pair_selection, limit=cfg.pairs_per_prompt, min_gap=cfg.min_gap,
        rng=random.Random(cfg.seed + 2),
    )  # fmt: skip
    if run.pairs:  # no pair (every candidate tied): the steps only log num_pairs = 0
        run.data = DataStream(run.pairs, seed=cfg.seed)  # type: ignore[arg-type]
    if cfg.num_epochs is not None:
        steps = cfg.num_epochs * math.ceil(len(run.pairs) / cfg.batch_size)
        run.config = cfg.model_copy(update={"num_steps": max(1, steps)})


def _pair_logps(model: Any, batch: PolicyBatch, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if model is None:  # no reference model (reference-free DPO): log pi_ref = 0
        zeros = torch.zeros(batch.input_ids.shape[0] // 2, device=batch.input_ids.device)
        return zeros, zeros
    batch = batch.to(model_device(model))
    with torch.set_grad_enabled(grad), sampling_mode(model):  # no dropout, as sampled
        seq, _ = sequence_logprobs(model, batch)
    return seq[0::2], seq[1::2]


def madpo_pair_metrics(run: MADPORun, pairs: JointPreferencePairs) -> dict[str, float]:
    """MADPO loss, joint margin (nats) and accuracy of the current policies on ``pairs``,
    without gradients (see :func:`~comlrl.estimators.preference_losses.multi_agent_dpo_loss`).
    Returns ``{}`` for no pairs."""
    if len(pairs) == 0:
        return {}
    parts = []
    for a, agent in enumerate(run.agents):
        was_training = agent.model.training
        agent.model.eval()
        try:
            parts.append(
                (
                    *_pair_logps(agent.model, pairs.batches[a], False),
                    *_pair_logps(run.ref_models[a], pairs.batches[a], False),
                )
            )
        finally:
            agent.model.train(was_training)
    stacked = [torch.stack([p[i].cpu() for p in parts]) for i in range(4)]
    losses, m = multi_agent_dpo_loss(*stacked, beta=run.config.beta)
    return {"loss": float(losses.mean()), **m}


def madpo_step(run: MADPORun) -> dict[str, float]:
    """One MADPO step: sample ``K`` candidates per agent for ``batch_size`` prompts, score
    the joint actions, pair them by reward gap, and step every agent on its own term of
    :func:`~comlrl.estimators.preference_losses.multi_agent_dpo_loss`.

    Every agent's log-probs keep their graph until the joint loss is formed (``A`` graphs
    at once; use fewer prompts per step for large models). A step whose prompts give no
    pair (every joint action ties or gaps are below ``min_gap``) samples and logs but
    takes no optimizer step (``num_pairs = 0``). With ``pair_source="initial"`` the step
    samples nothing: it trains on the next ``batch_size`` of the pairs built at setup.

    Returns:
        The metrics row: ``reward_mean``/``reward_max`` of all sampled joint actions,
        ``num_pairs``, ``reward_gap_mean``, and with pairs ``loss``, ``loss/agent_<i>``,
        ``margin`` (mean joint log-ratio margin before the step, nats), ``accuracy``,
        ``margin/agent_<i>``, ``grad_norm/agent_<i>``.
    """
    cfg = run.config
    if run.pairs is not None:
        return _initial_pairs_step(run)
    examples = run.data.next_batch(cfg.batch_size)
    ro = rollout(run.agents, examples, run.env, run.sampling, run.tree, rng=run.rng)
    if cfg.pair_selection == "random":
        found = rollout_pairs(
            ro, selection="random", limit=cfg.pairs_per_prompt, min_gap=cfg.min_gap, rng=run.rng
        )
        pairs = joint_pairs(found, _pad_ids(run)) if found else None
    else:
        pairs = preference_pairs(ro, min_gap=cfg.min_gap, pairs_per_prompt=cfg.pairs_per_prompt)
    rewards = ro.turns[0].rewards
    run.step += 1
    row: dict[str, float] = {
        "step": run.step,
        "reward_mean": float(rewards.mean()),
        "reward_max": float(rewards.max()),
        "num_pairs": len(pairs) if pairs is not None else 0,
    }
    if pairs is None or len(pairs) == 0:
        return row
    row.update(madpo_update(run, pairs))
    return row


def _pad_ids(run: MADPORun) -> list[int]:
    return [int(a.tokenizer.pad_token_id) for a in run.agents]


def _initial_pairs_step(run: MADPORun) -> dict[str, float]:
    """A ``pair_source="initial"`` step: the next ``batch_size`` of the pairs built at
    setup (the last ones of a pass and the first of the next may share a step)."""
    chunk: list[Any] = run.data.next_batch(run.config.batch_size) if run.pairs else []
    run.step += 1
    row: dict[str, float] = {"step": run.step, "num_pairs": len(chunk)}
    if chunk:
        rewards = [r for p in chunk for r in (p.chosen_reward, p.rejected_reward)]
        row["reward_mean"] = sum(rewards) / len(rewards)
        row.update(madpo_update(run, joint_pairs(chunk, _pad_ids(run))))
    return row


def madpo_update(run: MADPORun, pairs: JointPreferencePairs) -> dict[str, float]:
    """One optimizer step of every agent on its own term of
    :func:`~comlrl.estimators.preference_losses.multi_agent_dpo_loss` over ``pairs`` (``P >= 1``
    pairs from any source: :func:`madpo_step`'s rollout, or pairs built elsewhere, e.g.
    against a comparator policy).

    Returns:
        ``reward_gap_mean``, ``loss``, ``loss/agent_<i>``, ``margin``, ``accuracy``,
        ``margin/agent_<i>``, ``grad_norm/agent_<i>`` (see :func:`madpo_step`).

    Raises:
        ValueError: ``pairs`` is empty.
    """
    if len(pairs) == 0:
        raise ValueError("madpo_update needs at least one preference pair, got 0")
    row: dict[str, float] = {}
    row["reward_gap_mean"] = float((pairs.chosen_reward - pairs.rejected_reward).mean())
    with small_model_threads(run.agents[0].model):  # small models: one intra-op thread
        return _madpo_update(run, pairs, row)


def _madpo_update(
    run: MADPORun, pairs: JointPreferencePairs, row: dict[str, float]
) -> dict[str, float]:
    cfg = run.config
    parts = []
    for a, agent in enumerate(run.agents):
        chosen, rejected = _pair_logps(agent.model, pairs.batches[a], True)
        ref_c, ref_r = _pair_logps(run.ref_models[a], pairs.batches[a], False)
        parts.append((chosen, rejected, ref_c.to(chosen.device), ref_r.to(chosen.device)))
    # Agents may sit on different devices: the cross-agent sums are detached, so gather
    # the per-agent rows on the first agent's device.
    dev = parts[0][0].device
    stacked = [torch.stack([p[i].to(dev) for p in parts]) for i in range(4)]
    losses, metrics = multi_agent_dpo_loss(*stacked, beta=cfg.beta)
    for opt in run.optimizers:
        opt.zero_grad(set_to_none=True)
    losses.sum().backward()  # agent i's parameters only see L_i
    for a, agent in enumerate(run.agents):
        row[f"grad_norm/agent_{a}"] = clipped_optimizer_step(
            agent.model, run.optimizers[a], cfg.max_grad_norm
        )
        row[f"loss/agent_{a}"] = float(losses[a].detach())
    row["loss"] = float(losses.detach().mean())
    row.update(metrics)
    return row


def madpo_evaluate(run: MADPORun) -> dict[str, float]:
    """Held-out metrics: the mean reward of ``eval_num_samples`` sampled joint actions per
    held-out prompt (:func:`comlrl.algos.rollout.evaluate.evaluate`), and the MADPO loss, margin
    and accuracy on the held-out pairs sampled at setup. ``{}`` without an eval set."""
    from comlrl.algos.rollout import evaluate as evaluation

    if not run.eval_data:
        return {}
    cfg = run.config
    params = SamplingParams.from_config(cfg, cfg.eval_num_samples)
    row, _ = evaluation.evaluate(
        run.agents,
        run.env,
        run.eval_data,
        params,
        run.tree,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
    )
    out = {"eval/reward_mean": float(row["reward_mean"])}
    if run.eval_pairs is not None:
        out.update({f"eval/{k}": v for k, v in madpo_pair_metrics(run, run.eval_pairs).items()})
    return out


def madpo_checkpoint(
    run: MADPORun, path: str | Path, *, recipe_state: Mapping[str, Any] | None = None
) -> Path:
    """Write the step checkpoint ``path`` for the run's step, atomically, in the one format
    (:func:`comlrl.algos.training.run.checkpoint.write_checkpoint`): every agent's weights,
    optimizers, the data stream, the run's, torch's, Python's and each agent's random
    streams, and a fingerprint of the frozen reference models (not saved:
    :func:`madpo_setup` rebuilds them from the initial weights); ``recipe_state``: a
    recipe's own state on top (MADPO-Iter's rounds). Returns the folder."""
    return write_step_checkpoint(
        Path(path),
        run.step,
        [(a.model, a.tokenizer) for a in run.agents],
        run.optimizers,
        run.data,
        run.rng,
        [getattr(a, "generator", None) for a in run.agents],
        run.ref_models,
        recipe_state,
    )


def madpo_resume(
    run: MADPORun,
    path: str | Path,
    output_dir: str | Path | None = None,
    *,
    state: Mapping[str, Any] | None = None,
) -> int:
    """Put a freshly set-up ``run`` (:func:`madpo_setup` on the initial weights) back at the
    step checkpoint ``path`` of :func:`madpo_checkpoint` and return its step;
    :func:`train_madpo` then continues as if never stopped. With ``output_dir``, its
    logs are cut back to the step and half-written checkpoints are removed. ``state``:
    the checkpoint's ``training_state.pt`` when the caller has read it already.

    Raises:
        CheckpointError: the checkpoint is incomplete, does not fit the run (agents,
            optimizers), or the reference models differ from the saved run's.
    """
    run.step = read_step_checkpoint(
        path,
        output_dir,
        [a.model for a in run.agents],
        run.optimizers,
        run.data,
        run.rng,
        [getattr(a, "generator", None) for a in run.agents],
        run.ref_models,
        state,
    )
    return run.step


def train_madpo(
    run: MADPORun,
    *,
    output_dir: str | Path | None = None,
    save_every: int = 0,
    keep_last: int | None = None,
    resume_from: str | Path | None = None,
    record: Mapping[str, Any] | None = None,
    progress: bool = False,
    overwrite: bool = False,
    reporters: Callable[[Path], list[Reporter]] | None = None,
) -> list[dict[str, float]]:
    """Run :func:`madpo_step` s up to ``config.num_steps`` (from ``run.step``: a run put
    back by :func:`madpo_resume` continues); :func:`madpo_evaluate` before the first
    (``step`` 0), every ``eval_every`` steps and after the last, one row each in
    ``output_dir/eval.jsonl``.

    Run outputs (the loop driver, :func:`comlrl.algos.training.loop.run_loop`): with
    ``output_dir``, ``metrics.jsonl``, ``config.yaml`` (``record``, when given), step
    checkpoints every ``save_every`` steps and at the last (0: only on Ctrl-C; the newest
    ``keep_last`` kept) and ``final/agent_<i>`` are written there, and Ctrl-C stops at a
    step boundary after a checkpoint (``reporters``, built in ``output_dir``, get every
    row: TensorBoard, W&B, the reward curve); ``resume_from`` (a step checkpoint of this run)
    continues from its step exactly as if never stopped. A fresh run refuses an
    ``output_dir`` that holds another run unless ``overwrite``. (``resume_from`` is loaded when ``run.step`` is 0.)

    Raises:
        CheckpointError: ``resume_from`` does not fit the run.
        TrainingInterrupted: Ctrl-C (with ``output_dir``), after the checkpoint.
    """
    settings = loop_settings(
        run.config,
        output_dir=output_dir,
        save_every=save_every,
        keep_last=keep_last,
        record=record,
        progress=progress,
        desc="madpo",
        overwrite=overwrite,
        reporters=reporters,
    )
    if resume_from is not None and run.step == 0:
        madpo_resume(run, resume_from, output_dir)
    loop = RecipeLoop(
        step=lambda: StepResult(madpo_step(run)),
        checkpoint=lambda path: madpo_checkpoint(run, path),
        save_final=lambda path: save_models(path, [(a.model, a.tokenizer) for a in run.agents]),
        evaluate=lambda: madpo_evaluate(run),
        start_step=run.step,
    )
    return run_loop(loop, settings)


class MADPOTrainer:
    """Multi-agent DPO (:func:`comlrl.algos.recipes.preference.madpo.recipe.madpo_step`): each step
    samples ``K`` candidates per agent, pairs joint actions by reward gap and steps every
    agent on its own term of the joint DPO loss, against a frozen reference per agent.
    CoMLRL 1.4.3's MADPO (``comlrl.trainers.MADPOTrainer``, the same algorithm with 1.4.3's
    arguments) is this trainer with ``pair_source="initial"``, ``num_epochs`` and
    ``reference_free=True`` (:class:`MADPOConfig`).

    Args:
        agents: ``A`` :class:`~comlrl.algos.HFAgent` s or ``(model, tokenizer)`` pairs,
            each with its own model object.
        config: a :class:`MADPOConfig`.
        task: a single-turn use of a :class:`comlrl.core.Task` (its ``train`` split unless
            ``dataset`` is given); or ``dataset`` + ``formatters`` + ``reward_func``.
        eval_dataset: held-out examples (reward and held-out pair margin).
        ref_models: one frozen reference per agent (default: copies made at setup).

    Raises:
        ConfigError: as :func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_setup`, or a
            missing task / formatters / reward function.
    """

    def __init__(
        self,
        agents: Sequence[Any],
        config: MADPOConfig,
        *,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], str]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        ref_models: Sequence[Any] | None = None,
    ) -> None:
        check_config(config, MADPOConfig)
        self.config = config
        self.agents = as_agents(agents)
        self.env, data = environment(len(self.agents), task, dataset, formatters, reward_func)
        self.run = madpo_setup(
            self.agents, config, self.env, data, eval_dataset, ref_models=ref_models
        )

    def train_step(self) -> dict[str, float]:
        """One step; its metrics row."""
        return madpo_step(self.run)

    def evaluate(self) -> dict[str, float]:
        """Held-out reward and pair metrics."""
        return madpo_evaluate(self.run)

    def train(self, **outputs: Any) -> list[dict[str, float]]:
        """Run the steps up to ``config.num_steps`` (from the resumed step, if any);
        ``outputs`` (``output_dir``, ``save_every``, ``keep_last``, ``resume_from``,
        ``record``, ``progress``) as in
        :func:`~comlrl.algos.recipes.preference.madpo.recipe.train_madpo`."""
        return train_madpo(self.run, **outputs)

    def checkpoint(self, path: str | Path) -> Path:
        """Write a resumable step checkpoint now at ``path``
        (:func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_checkpoint`); returns it."""
        return madpo_checkpoint(self.run, path)

    def resume(self, checkpoint: str | Path, output_dir: str | Path | None = None) -> int:
        """Continue from a step checkpoint (agents, optimizers, data and random streams;
        :func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_resume`); returns its step. Build
        the trainer on the run's initial weights first: the reference models are copies
        of them.

        Raises:
            CheckpointError: the checkpoint is incomplete or does not fit this run.
        """
        return madpo_resume(self.run, checkpoint, output_dir)


def run_madpo(
    config: MADPORunConfig,
    outputs: RunOutputs | None = None,
    *,
    algo: str = "madpo",
    label: str = "MADPO",
    num_models: int | None = None,
    build: Callable[..., Any] | None = None,
) -> RunResult:
    """``algo=madpo``: :class:`~comlrl.algos.MADPOTrainer` on ``config.task``; each agent's
    final weights in ``final/agent_<i>``. ``num_models`` models are loaded (default
    ``config.num_agents``) and ``build(agents, config, task, examples, eval_examples)``
    makes the trainer (default: ``MADPOTrainer(agents, config, task=task, ...)``);
    ``algo=centralized_madpo`` passes one model and its joint-policy trainer.

    Raises:
        ConfigError: a bad config, task, model name, a model that does not load, a
            folder that holds another run (without ``outputs.overwrite``), or a checkpoint
            that does not fit, all before training.
        TrainingInterrupted: Ctrl-C, after the step checkpoint.
    """
    from comlrl.algos.recipes.preference.madpo.recipe import MADPOTrainer
    from comlrl.algos.training.run.reporting import reporters_for

    outputs = outputs if outputs is not None else RunOutputs.of(config)
    config = outputs.apply(config)
    outputs.check_folder()
    task, examples = preflight(config, config.models, refuse_tools=algo)
    n_models = config.num_agents if num_models is None else num_models
    who = f"{config.num_agents} agents"
    if n_models != config.num_agents:
        who = f"{n_models} policy for {config.num_agents} roles"
    try:
        with setup_errors():
            eval_examples = None
            if config.eval_split is not None:
                eval_examples = load_eval_split(task, config.eval_split, config.eval_limit)
            quiet_transformers()
            announce(
                config,
                len(examples),
                f"{label}, {config.num_steps} steps of {config.batch_size} prompts x "
                f"{config.num_candidates} candidates",
                who,
            )
            agents = load_agents(config, n_models, prompt_format=config.prompt_format)
            if build is None:
                trainer = MADPOTrainer(
                    agents, config, task=task, dataset=examples, eval_dataset=eval_examples
                )
            else:
                trainer = build(agents, config, task, examples, eval_examples)
            out = start_outputs(config, algo, outputs)
            if outputs.resume_from is not None:
                step = trainer.resume(outputs.resume_from, out)
                print(resuming_line(out, step, config.num_steps, outputs.resume_from))
    except BaseException:
        task.close()
        raise
    try:  # a bug from here on keeps its traceback (and the run its last checkpoint)
        history = trainer.train(
            **outputs.loop_arguments({"algo": algo, **config.model_dump()}),
            reporters=lambda out: reporters_for(
                out,
                report_to=list(outputs.report_to),
                reward_curve=outputs.reward_curve,
                title=f"{config.task.name} - {', '.join(config.models)} - {label}",
                wandb_project=outputs.wandb_project,
                record=config.model_dump(),
            ),
        )
    finally:
        task.close()
    return RunResult(history, loss_summary(history, out, "reward_mean"), out)
