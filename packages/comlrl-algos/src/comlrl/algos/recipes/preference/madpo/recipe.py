"""Multi-agent DPO (MADPO), one class (:class:`MADPORecipe`): per prompt each agent samples
``K`` candidates with :func:`comlrl.algos.rollout.tree.rollout`, the reward function scores
the joint actions, :func:`~comlrl.algos.recipes.preference.pairs.preference_pairs` pairs them
by reward gap, and every agent takes a step on
:func:`~comlrl.estimators.preference_losses.multi_agent_dpo_loss` against its own frozen
reference model (:meth:`MADPORecipe.update`).

Named axes: ``N`` prompts, ``A`` agents, ``K`` candidates (joint actions) per prompt,
``P`` pairs.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from comlrl.algos.models.logprobs import sampling_mode
from comlrl.algos.models.threads import small_model_threads
from comlrl.algos.recipes.launch import load_eval_split, preflight
from comlrl.algos.recipes.preference.checkpoint import (
    read_step_checkpoint,
    save_models,
    write_step_checkpoint,
)
from comlrl.algos.recipes.preference.encoding import (
    clipped_optimizer_step,
    model_device,
    sequence_logprobs,
)
from comlrl.algos.recipes.preference.madpo.config import MADPOConfig
from comlrl.algos.recipes.preference.madpo.initial_pairs import build_initial_pairs, rollout_pairs
from comlrl.algos.recipes.preference.pairs import (
    IterPair,
    JointPreferencePairs,
    joint_pairs,
    preference_pairs,
)
from comlrl.algos.records import PolicyBatch
from comlrl.algos.rollout import evaluate as evaluation
from comlrl.algos.rollout.agent import as_agents
from comlrl.algos.rollout.environment import Environment, Transition, build_environment
from comlrl.algos.rollout.tree import TreeSettings, rollout
from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.loop import Collective, Schedule, StepResult, run_loop
from comlrl.algos.training.run.checkpoint import streams_kept_on_failure
from comlrl.algos.training.run.data import DataStream
from comlrl.algos.training.run.data_mixture import example_stream
from comlrl.algos.training.run.lifecycle import run_record
from comlrl.algos.training.run.outputs import RunOutputs
from comlrl.algos.training.run.summary import loss_summary
from comlrl.algos.training.update.agents import build_optimizer, resolve_device
from comlrl.core import SamplingParams, Task
from comlrl.estimators.preference_losses import multi_agent_dpo_loss

__all__ = ["MADPORecipe", "MADPOTrainer"]


class MADPORecipe:
    """Multi-agent DPO: each step samples ``K`` candidates per agent, pairs joint actions by
    reward gap and steps every agent on its own term of the joint DPO loss, against a frozen
    reference per agent. CoMLRL 1.4.3's MADPO (``comlrl.trainers.MADPOTrainer``, the same
    algorithm with 1.4.3's arguments) is this recipe with ``pair_source="initial"``,
    ``num_epochs`` and ``reference_free=True``.

    The constructor checks agents, environment and config; freezes a reference model per
    agent; builds optimizers; with ``config.pair_source="initial"``, builds every training
    prompt's pairs from the initial policies
    (:func:`~comlrl.algos.recipes.preference.madpo.initial_pairs.build_initial_pairs`; with
    ``num_epochs`` the run's ``config.num_steps`` becomes ``num_epochs * ceil(P / batch_size)``,
    at least 1); and,
    with an evaluation set, samples held-out pairs once from the initial policies
    (:meth:`pair_metrics` measures their margin as training goes).

    Args:
        agents: ``A`` :class:`~comlrl.algos.HFAgent` s or ``(model, tokenizer)`` pairs, each
            with its own model object.
        config: a :class:`~comlrl.algos.recipes.preference.madpo.config.MADPOConfig`.
        task, dataset, formatters, reward_func, transition, environment: the environment
            and examples (:func:`~comlrl.algos.rollout.environment.build_environment`; a
            single-turn use of a task, its ``task.split`` unless ``dataset`` is given).
        eval_dataset: held-out examples (reward and held-out pair margin).
        ref_models: one frozen reference per agent (default: copies made here, once); an
            entry ``None`` makes that agent's loss reference-free (``log pi_ref = 0``), as
            ``config.reference_free`` does for every agent.
        outputs, record: where the run writes and what ``config.yaml`` holds.

    Raises:
        ConfigError: agent counts disagree, agents share one model object (each agent
            needs its own parameters and optimizer), a missing task / formatters / reward
            function, an empty dataset, ``ref_models`` of the wrong length, or
            ``ref_models`` with ``reference_free``.
    """

    algo: ClassVar[str] = "madpo"

    def __init__(
        self,
        agents: Sequence[Any],
        config: MADPOConfig,
        *,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], Any]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        transition: Transition | None = None,
        environment: Environment | None = None,
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        ref_models: Sequence[Any] | None = None,
        outputs: RunOutputs | None = None,
        record: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(config, MADPOConfig):
            raise ConfigError(
                f"expected a MADPOConfig, got {type(config).__name__}; build it with "
                "MADPOConfig.build(...)"
            )
        self.config = config
        self.agents = as_agents(agents, prompt_format=config.prompt_format)
        self.task = task
        n = len(self.agents)
        try:
            self.env, examples = build_environment(
                n, task=task, dataset=dataset, formatters=formatters, reward_func=reward_func,
                transition=transition, environment=environment, split=config.task.split,
            )  # fmt: skip
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.outputs = outputs if outputs is not None else RunOutputs.of(config)
        self.record = self.outputs.record(
            record
            if record is not None
            else run_record(config, algo=self.algo, task=task, reward_func=reward_func)
        )
        if n != config.num_agents or self.env.num_agents != n:
            raise ConfigError(
                f"{n} agents, config.num_agents={config.num_agents}, task for "
                f"{self.env.num_agents} agents; make them agree."
            )
        if len({id(a.model) for a in self.agents}) != n:
            raise ConfigError(
                "MADPO agents share a model object; give each agent its own model (e.g. load "
                "it twice)."
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
            self.data: DataStream = example_stream(examples, seed=config.seed, task=config.task)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        torch.manual_seed(config.seed)
        device = resolve_device(config.device)
        self.optimizers = []
        for i, agent in enumerate(self.agents):
            agent.model.to(device).train()
            if hasattr(agent, "seed"):
                agent.seed(config.seed * 1_000_003 + i)
            self.optimizers.append(
                build_optimizer(
                    [p for p in agent.model.parameters() if p.requires_grad],
                    config.optimizer,
                    lr=config.learning_rate,
                    weight_decay=config.weight_decay,
                )
            )
        self.ref_models = (
            [copy.deepcopy(a.model) for a in self.agents]
            if ref_models is None
            else list(ref_models)
        )
        for ref in self.ref_models:
            if ref is not None:  # None: no reference for that agent (log pi_ref = 0)
                ref.to(device).eval().requires_grad_(False)
        self.sampling = SamplingParams.from_config(config, config.num_generations)
        self.tree = TreeSettings(num_turns=1, joint_mode=config.joint_mode)
        self.rng = random.Random(config.seed)
        self.eval_data = list(eval_dataset) if eval_dataset is not None else None
        self.eval_pairs: JointPreferencePairs | None = None
        self.global_step = 0
        #: ``pair_source="initial"``: the pairs built here, which the steps draw from
        self.pairs: list[IterPair] | None = None
        if config.pair_source == "initial":
            self.pairs = build_initial_pairs(
                self.agents, self.env, list(examples), self.sampling, self.tree,
                batch_size=config.batch_size, selection=config.pair_selection,
                limit=config.pairs_per_prompt, min_gap=config.min_gap,
                rng=random.Random(config.seed + 2),
            )  # fmt: skip
            if self.pairs:  # no pair (every candidate tied): the steps only log num_pairs = 0
                self.data = DataStream(self.pairs, seed=config.seed)  # type: ignore[arg-type]
            if config.num_epochs is not None:
                steps = config.num_epochs * math.ceil(len(self.pairs) / config.batch_size)
                self.config = config.model_copy(update={"num_steps": max(1, steps)})
        if self.eval_data:
            ro = rollout(
                self.agents,
                self.eval_data,
                self.env,
                self.sampling,
                self.tree,
                rng=random.Random(config.seed + 1),
            )
            self.eval_pairs = preference_pairs(
                ro, min_gap=config.min_gap, pairs_per_prompt=config.pairs_per_prompt
            )

    # --- what the launcher asks of the recipe (comlrl.algos.recipes.launch) ------------

    @classmethod
    def inputs(cls, config: Any) -> tuple[Any, list[Any], list[Any] | None]:
        """The task and its examples, and the ``eval_split`` (first ``eval_limit``), checked
        before any model loads; a task whose agents call tools is refused."""
        models = [*config.models, *cls.more_models(config)]
        task, examples = preflight(config, models, refuse_tools=cls.algo)
        try:
            evals = (
                load_eval_split(task, config.eval_split, config.eval_limit)
                if config.eval_split is not None
                else None
            )
        except BaseException:
            task.close()
            raise
        return task, examples, evals

    @classmethod
    def more_models(cls, config: Any) -> list[str]:
        """Models the run loads besides the agents' (none)."""
        return []

    @classmethod
    def describe(cls, config: Any) -> str:
        """``MADPO, 60 steps of 4 prompts x 4 candidates`` (with ``role_format``:
        ``centralized MADPO (one joint policy, sentences role format), ...``)."""
        label = "MADPO"
        if config.role_format is not None:
            label = f"centralized MADPO (one joint policy, {config.role_format} role format)"
        return (
            f"{label}, {config.num_steps} steps of {config.batch_size} prompts x "
            f"{config.num_generations} candidates"
        )

    @classmethod
    def agent_options(cls, config: Any) -> dict[str, Any]:
        """The prompt format of every agent."""
        return {"prompt_format": config.prompt_format}

    @property
    def output_dir(self) -> Path:
        """Where metrics, evaluation rows and checkpoints go."""
        return self.outputs.output_dir

    # --- one step -----------------------------------------------------------------------

    def step(self) -> StepResult:
        """One MADPO step: sample ``K`` candidates per agent for ``batch_size`` prompts, score
        the joint actions, pair them by reward gap, and step every agent on its own term of
        :func:`~comlrl.estimators.preference_losses.multi_agent_dpo_loss` (:meth:`update`).

        A step whose prompts give no pair (every joint action ties or gaps are below
        ``min_gap``) samples and logs but takes no optimizer step (``num_pairs = 0``). With
        ``pair_source="initial"`` the step samples nothing: it trains on the next
        ``batch_size`` of the pairs built at setup. A step that fails before the update (a
        reward function) leaves the data and random streams as they were.

        The row: ``reward_mean``/``reward_max`` of all sampled joint actions, ``num_pairs``,
        ``reward_gap_mean``, and with pairs ``loss``, ``loss/agent_<i>``, ``margin`` (mean
        joint log-ratio margin before the step, nats), ``accuracy``, ``margin/agent_<i>``,
        ``grad_norm/agent_<i>``.
        """
        cfg = self.config
        if self.pairs is not None:
            return StepResult(self._initial_pairs_step())
        with streams_kept_on_failure(self.data, self.rng, self.generators()):
            examples = self.data.next_batch(cfg.batch_size)
            ro = rollout(self.agents, examples, self.env, self.sampling, self.tree, rng=self.rng)
            if cfg.pair_selection == "random":
                found = rollout_pairs(
                    ro, selection="random", limit=cfg.pairs_per_prompt, min_gap=cfg.min_gap,
                    rng=self.rng,
                )  # fmt: skip
                pairs = joint_pairs(found, self.pad_ids()) if found else None
            else:
                pairs = preference_pairs(
                    ro, min_gap=cfg.min_gap, pairs_per_prompt=cfg.pairs_per_prompt
                )
        rewards = ro.turns[0].rewards
        self.global_step += 1
        row: dict[str, float] = {
            "step": self.global_step,
            "reward_mean": float(rewards.mean()),
            "reward_max": float(rewards.max()),
            "num_pairs": len(pairs) if pairs is not None else 0,
        }
        if pairs is not None and len(pairs) > 0:
            row.update(self.update(pairs))
        return StepResult(row)

    def _initial_pairs_step(self) -> dict[str, float]:
        """A ``pair_source="initial"`` step: the next ``batch_size`` of the pairs built at
        setup (the last ones of a pass and the first of the next may share a step)."""
        chunk: list[Any] = self.data.next_batch(self.config.batch_size) if self.pairs else []
        self.global_step += 1
        row: dict[str, float] = {"step": self.global_step, "num_pairs": len(chunk)}
        if chunk:
            rewards = [r for p in chunk for r in (p.chosen_reward, p.rejected_reward)]
            row["reward_mean"] = sum(rewards) / len(rewards)
            row.update(self.update(joint_pairs(chunk, self.pad_ids())))
        return row

    def pad_ids(self) -> list[int]:
        """Each agent's pad token id."""
        return [int(a.tokenizer.pad_token_id) for a in self.agents]

    def update(self, pairs: JointPreferencePairs) -> dict[str, float]:
        """One optimizer step of every agent on its own term of
        :func:`~comlrl.estimators.preference_losses.multi_agent_dpo_loss` over ``pairs``
        (``P >= 1`` pairs from any source: a rollout's, or pairs built elsewhere, e.g.
        against a comparator policy). Every agent's log-probs keep their graph until the
        joint loss is formed (``A`` graphs at once; use fewer prompts per step for large
        models).

        Returns:
            ``reward_gap_mean``, ``loss``, ``loss/agent_<i>``, ``margin``, ``accuracy``,
            ``margin/agent_<i>``, ``grad_norm/agent_<i>``.

        Raises:
            ValueError: ``pairs`` is empty.
        """
        if len(pairs) == 0:
            raise ValueError("the MADPO update needs at least one preference pair, got 0")
        row: dict[str, float] = {}
        row["reward_gap_mean"] = float((pairs.chosen_reward - pairs.rejected_reward).mean())
        with small_model_threads(self.agents[0].model):  # small models: one intra-op thread
            parts = []
            for a, agent in enumerate(self.agents):
                chosen, rejected = _pair_logps(agent.model, pairs.batches[a], True)
                ref_c, ref_r = _pair_logps(self.ref_models[a], pairs.batches[a], False)
                parts.append((chosen, rejected, ref_c.to(chosen.device), ref_r.to(chosen.device)))
            # Agents may sit on different devices: the cross-agent sums are detached, so
            # gather the per-agent rows on the first agent's device.
            dev = parts[0][0].device
            stacked = [torch.stack([p[i].to(dev) for p in parts]) for i in range(4)]
            losses, metrics = multi_agent_dpo_loss(*stacked, beta=self.config.beta)
            for opt in self.optimizers:
                opt.zero_grad(set_to_none=True)
            losses.sum().backward()  # agent i's parameters only see L_i
            for a, agent in enumerate(self.agents):
                row[f"grad_norm/agent_{a}"] = clipped_optimizer_step(
                    agent.model, self.optimizers[a], self.config.max_grad_norm
                )
                row[f"loss/agent_{a}"] = float(losses[a].detach())
            row["loss"] = float(losses.detach().mean())
            row.update(metrics)
        return row

    def pair_metrics(self, pairs: JointPreferencePairs) -> dict[str, float]:
        """MADPO loss, joint margin (nats) and accuracy of the current policies on ``pairs``,
        without gradients (see :func:`~comlrl.estimators.preference_losses.multi_agent_dpo_loss`).
        Returns ``{}`` for no pairs."""
        if len(pairs) == 0:
            return {}
        parts = []
        for a, agent in enumerate(self.agents):
            was_training = agent.model.training
            agent.model.eval()
            try:
                parts.append(
                    (
                        *_pair_logps(agent.model, pairs.batches[a], False),
                        *_pair_logps(self.ref_models[a], pairs.batches[a], False),
                    )
                )
            finally:
                agent.model.train(was_training)
        stacked = [torch.stack([p[i].cpu() for p in parts]) for i in range(4)]
        losses, m = multi_agent_dpo_loss(*stacked, beta=self.config.beta)
        return {"loss": float(losses.mean()), **m}

    # --- evaluation, saving and resuming ------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics: the mean reward of ``eval_num_samples`` sampled joint actions per
        held-out prompt (:func:`comlrl.algos.rollout.evaluate.evaluate`), and the MADPO loss,
        margin and accuracy on the held-out pairs sampled at setup. ``{}`` without an
        evaluation set."""
        if not self.eval_data:
            return {}
        cfg = self.config
        params = SamplingParams.from_config(cfg, cfg.eval_num_samples)
        row, _ = evaluation.evaluate(
            self.agents, self.env, self.eval_data, params, self.tree,
            batch_size=cfg.batch_size, seed=cfg.seed,
        )  # fmt: skip
        out = {"eval/reward_mean": float(row["reward_mean"])}
        if self.eval_pairs is not None:
            out.update({f"eval/{k}": v for k, v in self.pair_metrics(self.eval_pairs).items()})
        return out

    def generators(self) -> list[torch.Generator | None]:
        """Each agent's own sampling stream (``None`` where it draws from torch's)."""
        return [getattr(a, "generator", None) for a in self.agents]

    def checkpoint(
        self, path: str | Path, *, recipe_state: Mapping[str, Any] | None = None
    ) -> Path:
        """Write the step checkpoint ``path`` for the run's step, atomically, in the one
        format (:func:`comlrl.algos.training.run.checkpoint.write_checkpoint`): every agent's
        weights, optimizers, the data stream, the run's, torch's, Python's and each agent's
        random streams, and a fingerprint of the frozen reference models (not saved: the
        constructor rebuilds them from the initial weights); ``recipe_state``: a recipe's own
        state on top (MADPO-Iter's rounds). Returns the folder."""
        return write_step_checkpoint(
            Path(path), self.global_step, [(a.model, a.tokenizer) for a in self.agents],
            self.optimizers, self.data, self.rng, self.generators(), self.ref_models,
            recipe_state,
        )  # fmt: skip

    def resume(self, path: str | Path, *, state: Mapping[str, Any] | None = None) -> int:
        """Put the recipe (built on the initial weights) back at the step checkpoint
        ``path`` and return its step; :meth:`train` then continues as if never stopped. Its
        logs in ``output_dir`` are cut back to the step. ``state``: the checkpoint's
        ``training_state.pt`` when the caller has read it already.

        Raises:
            CheckpointError: the checkpoint is incomplete, does not fit the run (agents,
                optimizers), or the reference models differ from the saved run's.
        """
        self.global_step = read_step_checkpoint(
            path, self.output_dir, [a.model for a in self.agents], self.optimizers, self.data,
            self.rng, self.generators(), self.ref_models, state,
        )  # fmt: skip
        return self.global_step

    def save_final(self, path: Path) -> None:
        """Each agent's model and tokenizer in ``path/agent_<i>``."""
        save_models(Path(path), [(a.model, a.tokenizer) for a in self.agents])

    # --- the loop -----------------------------------------------------------------------

    def schedule(self) -> Schedule:
        """The run's steps; evaluation (with an evaluation set) before the first step, every
        ``eval_every`` steps and after the last, one row each in ``eval.jsonl``."""
        cfg = self.config
        return Schedule(
            num_steps=cfg.num_steps,
            evaluates=bool(self.eval_data),
            eval_every=cfg.eval_every,
            eval_on_start=True,
            eval_at_end=True,
            desc=self.algo,
            prompts_per_step=cfg.batch_size,
            record=self.record,
            title=f"{cfg.task.name} - {', '.join(cfg.models)} - {self.algo.upper()}",
        )

    def collective(self) -> Collective:
        """One process."""
        return Collective()

    def train(self) -> list[dict[str, float]]:
        """Run the steps up to the run's ``num_steps`` under the loop driver (from the
        resumed step, if any); closes the task after.

        Raises:
            ConfigError: ``output_dir`` holds another run (without ``outputs.overwrite``).
            TrainingInterrupted: Ctrl-C or SIGTERM, after the checkpoint.
        """
        try:
            return run_loop(self, self.outputs)
        finally:
            self.close()

    def summary(self, history: Sequence[Mapping[str, Any]]) -> str:
        """``done: N steps, reward_mean first quarter a -> last quarter b; outputs in ...``."""
        return loss_summary(history, self.output_dir, "reward_mean")

    def close(self) -> None:
        """Close the task (safe to call twice)."""
        if self.task is not None:
            self.task.close()


class MADPOTrainer(MADPORecipe):
    """The MADPO recipe (:class:`MADPORecipe`) under its public name."""


def _pair_logps(model: Any, batch: PolicyBatch, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if model is None:  # no reference model (reference-free DPO): log pi_ref = 0
        zeros = torch.zeros(batch.input_ids.shape[0] // 2, device=batch.input_ids.device)
        return zeros, zeros
    batch = batch.to(model_device(model))
    with torch.set_grad_enabled(grad), sampling_mode(model):  # no dropout, as sampled
        seq, _ = sequence_logprobs(model, batch)
    return seq[0::2], seq[1::2]
