"""The actor-critic recipes, one class (:class:`ActorCriticRecipe`): IAC (independent
critics) and MAAC (one centralised critic).

The actors are the group-baseline recipe's (:class:`~comlrl.algos.recipes.group_baseline.recipe.GroupBaselineRecipe`,
composed, not changed: its agents, data, optimizers, sampling and update); this class adds
the critics. One step (:meth:`ActorCriticRecipe.step`):

1. the next ``batch_size`` examples;
2. the actors' rollout: ``G`` completions per node per agent (``G = 1``: one trajectory per
   prompt, CoMLRL 1.4.3's setting), joint rewards per turn from the environment, the next
   turn's nodes from its feedback;
3. :func:`~comlrl.algos.recipes.actor_critic.critic.critic_inputs` +
   :func:`~comlrl.algos.recipes.actor_critic.critic.rollout_values`: the critics' values of
   every node (``critic_type="v"``) or joint action (``"q"``), without gradient, at sampling
   time: IAC gives each agent a critic that reads only that agent's prompt (and
   completion); MAAC's one critic reads every agent's prompt (and the joint action);
4. :func:`~comlrl.estimators.gae.tree_gae`: per-turn GAE advantages and lambda-return
   targets (Schulman et al. 2016) on the rollout tree; each completion is credited with the
   mean advantage of the joint actions it took part in, optionally whitened per agent;
5. the actors' update (the policy update, with the PPO clip against the behaviour
   log-probs) and the critics' (clipped value loss, their own optimizer and learning rate,
   :func:`~comlrl.algos.recipes.actor_critic.critic_updates.update_critics`). With a value
   head on the actor's own model (IAC, ``critic_mode="shared"``) both losses go into one
   backward and one optimizer step
   (:func:`~comlrl.algos.recipes.actor_critic.critic_updates.value_terms`), weighted
   ``policy + value_loss_coef * value``. Agents given one model object take one optimizer
   step on the sum of their losses (and of their heads' value losses); separate critics on
   one trunk object take one step on the sum of theirs.

Saving writes every agent and critic (value heads as ``value_head.safetensors`` beside the
Hugging Face weights); step checkpoints hold the critics and their optimizers too.
:class:`IACTrainer` and :class:`MAACTrainer` fix the method.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from comlrl.algos.models.value import Critic, ValueHead, hidden_size_of, save_value_head
from comlrl.algos.recipes.actor_critic.config import (
    ActorCriticConfig,
    Method,
    critic_placement,
    planned_agent_devices,
)
from comlrl.algos.recipes.actor_critic.critic import (
    critic_advantages,
    critic_inputs,
    rollout_values,
)
from comlrl.algos.recipes.actor_critic.critic_updates import update_critics, value_terms
from comlrl.algos.recipes.group_baseline.recipe import GroupBaselineRecipe
from comlrl.algos.rollout.agent import as_agents
from comlrl.algos.rollout.environment import Environment, Transition
from comlrl.algos.rollout.metrics import rollout_metrics
from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.loop import Collective, Schedule, StepResult, rewind_outputs, run_loop
from comlrl.algos.training.run import checkpoint as ckpt
from comlrl.algos.training.run.outputs import RunOutputs
from comlrl.algos.training.run.saving import save_agent_checkpoint
from comlrl.algos.training.update.agents import build_optimizer
from comlrl.algos.training.update.settings import UpdateSettings, update_settings
from comlrl.algos.training.update.shared_models import sharing_groups
from comlrl.core import Task
from comlrl.estimators.gae import value_loss

__all__ = ["ActorCriticRecipe", "IACTrainer", "MAACTrainer", "actor_update_settings"]


class ActorCriticRecipe:
    """Actor-critic training of ``A`` agents: IAC (a critic per agent) or MAAC (one
    centralised critic), as :attr:`method` says.

    Takes the group-baseline recipe's task or CoMLRL-style ``dataset`` + ``formatters`` +
    ``reward_func`` (+ ``transition``) arguments, an
    :class:`~comlrl.algos.recipes.actor_critic.config.ActorCriticConfig`, and optionally
    ready-made ``critics`` (:class:`~comlrl.algos.models.value.Critic`); otherwise separate
    critics load ``config.critic_model`` or the agent's model and a shared one puts a new
    value head on the actor. Critics are placed by ``critic_devices`` (else beside their
    agents; checked before any model moves); each separate critic gets an optimizer with
    ``critic_lr`` (critics on one trunk object: one optimizer over all their parameters), a
    shared head is a parameter group of its actor's optimizer with that learning rate. With
    ``G = 1`` the actors' update runs each prompt and its completion in one forward
    (:func:`actor_update_settings`).

    Raises:
        ConfigError: a config of another type, MAAC with ``critic_mode="shared"``, critics
            that do not fit (count, kind, a shared critic not on its agent's model),
            ``critic_devices`` that do not fit, or what the group-baseline recipe refuses.
    """

    #: ``"iac"`` or ``"maac"``
    method: ClassVar[Method] = "iac"
    #: the recipe's name in ``config.yaml``
    algo: ClassVar[str | None] = None

    def __init__(
        self,
        agents: Sequence[Any],
        config: ActorCriticConfig,
        *,
        critics: Sequence[Critic] | None = None,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], Any]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        transition: Transition | None = None,
        environment: Environment | None = None,
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        outputs: RunOutputs | None = None,
        record: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(config, ActorCriticConfig):
            raise ConfigError(
                f"{type(self).__name__} needs an ActorCriticConfig (it has the critic's "
                f"settings), got {type(config).__name__}; build one with the same fields but the "
                "group-baseline ones (estimator, advantage_scale, advantage_eps, "
                "advantage_stats, advantage_group, update_chunk_nodes, "
                "update_chunk_split_turns)."
            )
        method = self.method
        if method not in ("iac", "maac"):
            raise ConfigError(f"unknown actor-critic method {method!r}; use 'iac' or 'maac'.")
        if method == "maac" and config.critic_mode == "shared":
            raise ConfigError(
                "MAAC's critic is centralised (it reads every agent's prompt), so it cannot "
                "share one actor's model: set critic_mode='separate'."
            )
        self.config = config
        agents = as_agents(agents, **config.generation_options())
        # critic_devices must fit the agents' placement before any model moves
        devices = critic_placement(config, method, planned_agent_devices(config, len(agents)))
        self.critics = (
            list(critics) if critics is not None else _build_critics(agents, config, method)
        )
        _check_critics(self.critics, method, config, agents)
        # agents on one model object step together with their leader's optimizer, so every
        # value head on that model joins it (GroupBaselineRecipe's extra_param_groups)
        heads = {
            i: [{"params": list(c.head.parameters()), "lr": config.critic_lr}]
            for i, c in enumerate(self.critics)
            if c.shared
        }
        self.actors = GroupBaselineRecipe(
            agents,
            config,
            task=task,
            dataset=dataset,
            formatters=formatters,
            reward_func=reward_func,
            transition=transition,
            environment=environment,
            eval_dataset=eval_dataset,
            outputs=outputs,
            record=record,
            update=actor_update_settings(update_settings(config, agents), config.num_generations),
            extra_param_groups=heads,
            group_baseline=False,
        )
        if record is None:  # config.yaml says which method ran
            self.actors.record = {"algo": self.algo or method, **self.actors.record}
        # separate critics on one trunk share one optimizer over all their parameters
        self.critic_optimizers: list[torch.optim.Optimizer | None] = [None] * len(self.critics)
        for i, critic in enumerate(self.critics):
            critic.head.to(devices[i])
            if not critic.shared:
                critic.trunk.to(devices[i])
                critic.trunk.train()
        for group in sharing_groups([c.trunk for c in self.critics]):
            if self.critics[group[0]].shared:
                continue
            params = {id(p): p for c in group for p in self.critics[c].parameters()}
            optimizer = build_optimizer(
                list(params.values()),
                config.optimizer,
                lr=config.critic_lr,
                weight_decay=config.weight_decay,
            )
            for c in group:
                self.critic_optimizers[c] = optimizer

    # --- what the launcher asks of the recipe (comlrl.algos.recipes.launch) ------------

    @classmethod
    def inputs(cls, config: Any) -> tuple[Any, list[Any], list[Any] | None]:
        """As the group-baseline recipe's (:meth:`GroupBaselineRecipe.inputs`).

        Raises:
            ConfigError: as ``preflight``, or a ``role_format`` (one model for every role has
                no critics of its own here).
        """
        if getattr(config, "role_format", None) is not None:
            raise ConfigError(
                f"algo={cls.method} has no role_format (one model for every role); use "
                "algo=centralized_magrpo, or drop role_format."
            )
        return GroupBaselineRecipe.inputs(config)

    @classmethod
    def describe(cls, config: Any) -> str:
        """``IAC (separate v-critics), 10 steps of 4 prompts x 1 completions``."""
        what = (
            f"IAC ({config.critic_mode} {config.critic_type}-critics)"
            if cls.method == "iac"
            else f"MAAC (centralised {config.critic_type}-critic)"
        )
        s = "s" if config.num_steps != 1 else ""
        return (
            f"{what}, {config.num_steps} step{s} of {config.batch_size} prompts x "
            f"{config.num_generations} completions"
        )

    @classmethod
    def agent_options(cls, config: Any) -> dict[str, Any]:
        """The generation backend and prompt format of every agent."""
        return dict(config.generation_options())

    # --- the actors' state, for readers -------------------------------------------------

    @property
    def global_step(self) -> int:
        """Training steps taken so far."""
        return self.actors.global_step

    @property
    def agents(self) -> list[Any]:
        """The ``A`` actors."""
        return self.actors.agents

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """One optimizer per actor (a shared critic head is a parameter group of its actor's)."""
        return self.actors.optimizers

    @property
    def output_dir(self) -> Path:
        """Where metrics, samples and checkpoints go."""
        return self.actors.output_dir

    @property
    def env(self) -> Any:
        """The actors' environment."""
        return self.actors.env

    @property
    def data(self) -> Any:
        """The actors' data stream."""
        return self.actors.data

    @property
    def ref_models(self) -> list[Any] | None:
        """The actors' frozen reference models (``kl_coef > 0``), else ``None``."""
        return self.actors.ref_models

    @property
    def eval_data(self) -> Any:
        """The actors' evaluation examples (:meth:`evaluate` plays them)."""
        return self.actors.eval_data

    @eval_data.setter
    def eval_data(self, rows: Any) -> None:
        self.actors.eval_data = rows

    # --- one step -----------------------------------------------------------------------

    def step(self) -> StepResult:
        """One step: rollout, critic values, GAE, actor and critic updates; the metrics row
        and the rollout. A step that fails before the updates (the rollout, a reward
        function, the critics' values) leaves the data and random streams as the last
        completed step left them, so the checkpoint the loop driver then writes resumes to
        exactly the run that never failed."""
        cfg, actors = self.config, self.actors
        t0 = time.perf_counter()
        with actors.streams_kept_on_failure():
            examples = actors.data.next_batch(cfg.batch_size)
            ro = actors.sample(examples)
            t1 = time.perf_counter()
            per_turn_texts = [
                [critic_inputs(turn, self.method, cfg.critic_type, c) for turn in ro.turns]
                for c in range(len(self.critics))
            ]
            texts = [[s for turn in per_turn for s in turn] for per_turn in per_turn_texts]
            live: list[torch.Tensor] | None = None
            if self._can_fuse_critic_forward():
                # One forward per critic serves both the sampling-time values and the value loss.
                live = [critic.values(texts[c]) for c, critic in enumerate(self.critics)]
                values = [
                    list(torch.split(v.detach().float().cpu(), [len(x) for x in per_turn_texts[c]]))
                    for c, v in enumerate(live)
                ]
            else:
                for critic in self.critics:
                    critic.trunk.eval()
                values = rollout_values(
                    ro, self.critics, self.method, micro_batch_size=cfg.micro_batch_size
                )
                for critic in self.critics:
                    critic.trunk.train()
            adv, targets = critic_advantages(
                ro,
                values,
                self.method,
                cfg.critic_type,
                gamma=cfg.gamma,
                lam=cfg.gae_lambda,
                normalize=cfg.advantage_normalization,
                num_turns=cfg.num_turns,
                hold_terminal=cfg.hold_terminal_reward,
            )
            old = [torch.cat(v) for v in values]
            tgt = [torch.cat(t) for t in targets]
        t2 = time.perf_counter()

        # Agents on one model object take one step on the sum of their losses (with value
        # heads on that model, plus coef times the sum of their value losses), with the first
        # one's optimizer; separate critics on one trunk take one step on the sum of their
        # value losses (training.update.shared_models).
        def heads_of(a: int, members: list[int]) -> Any:
            heads = {
                m: self.critics[m]
                for m in members
                if self.method == "iac" and self.critics[m].shared
            }
            if not heads:
                return None
            extra = value_terms(
                heads, dict(enumerate(texts)), dict(enumerate(old)), dict(enumerate(tgt)),
                coef=cfg.value_loss_coef, clip_range=cfg.value_clip_range,
                micro_batch_size=actors.update_settings.micro_batch_size,
            )  # fmt: skip
            return extra, [p for c in heads.values() for p in c.head.parameters()]

        stats = actors.update(ro, adv, heads_of)
        critic_stats: dict[str, float] = {}
        if self.method == "iac":  # each agent's separate critic (critics on one trunk: one step)
            groups = {
                g[0]: g
                for g in sharing_groups([c.trunk for c in self.critics])
                if not self.critics[g[0]].shared
            }

            def critic_update(a: int) -> list[tuple[int, dict[str, float]]]:
                members = groups.get(a)
                if members is None:
                    return []
                parts = self._critic_step(members, texts, old, tgt, live)
                return list(zip(members, parts, strict=True))

            for parts in actors.update_pool.map(critic_update):
                for m, own in parts:
                    stats[m].update(own)
        else:  # MAAC's one centralised critic
            critic_stats = self._critic_step([0], texts, old, tgt, live)[0]
        t3 = time.perf_counter()
        actors.global_step += 1
        metrics = rollout_metrics(
            ro, [[per_agent[a] for a in range(len(self.agents))] for per_agent in adv]
        )
        for a, agent_stats in enumerate(stats):
            metrics.update({f"{k}/agent_{a}": v for k, v in agent_stats.items()})
        metrics.update({f"critic/{k}": v for k, v in critic_stats.items()})
        elapsed = t3 - t0
        row = {
            "step": actors.global_step,
            **metrics,
            **{f"time/{k}": v for k, v in ro.timings.items()},
            "time/critic_values_s": t2 - t1,
            "time/update_s": t3 - t2,
            "time/step_s": elapsed,
            "tokens_per_s": metrics["num_tokens"] / elapsed,
            "prompts_per_s": len(examples) / elapsed,
        }
        return StepResult(row, ro)

    def _can_fuse_critic_forward(self) -> bool:
        """Whether the critics' sampling-time values can come from the value loss's own
        forward: one critic update (``num_iterations == 1``, so the critic's weights are
        those of sampling time), all texts in one pass (``micro_batch_size`` None), separate
        critics (a shared trunk is the actor, updated together with it) and no dropout (the
        sampling-time values must not be noisy). The values are then the same numbers the
        unfused path computes (tested), and one critic forward per step is saved."""
        cfg = self.config
        return (
            cfg.num_iterations == 1
            and cfg.micro_batch_size is None
            and not any(c.shared for c in self.critics)
            and not any(_has_dropout(c.trunk) for c in self.critics)
        )

    def _critic_step(
        self,
        members: list[int],
        texts: list[list[str]],
        old: list[torch.Tensor],
        tgt: list[torch.Tensor],
        live: list[torch.Tensor] | None = None,
    ) -> list[dict[str, float]]:
        """One critic update of the separate critics ``members`` (one critic, or critics on
        one trunk: one step on the sum of their value losses, with their one optimizer);
        each member's value metrics."""
        cfg = self.config
        optimizer = self.critic_optimizers[members[0]]
        assert optimizer is not None  # value heads on an actor are stepped with the actor
        if live is not None:
            return self._fused_critic_update(members, optimizer, live, old, tgt)
        return update_critics(
            [self.critics[c] for c in members],
            optimizer,
            [texts[c] for c in members],
            [old[c] for c in members],
            [tgt[c] for c in members],
            coef=cfg.value_loss_coef,
            clip_range=cfg.value_clip_range,
            num_iterations=cfg.num_iterations,
            max_grad_norm=cfg.max_grad_norm,
            micro_batch_size=cfg.micro_batch_size,
        )

    def _fused_critic_update(
        self,
        members: list[int],
        optimizer: torch.optim.Optimizer,
        live: list[torch.Tensor],
        old: list[torch.Tensor],
        tgt: list[torch.Tensor],
    ) -> list[dict[str, float]]:
        """:func:`update_critics` with one iteration on values already computed with gradient
        (``live[c]``, ``[M_c]``: the graph of this step's forward of critic ``c``); same loss
        and metrics."""
        cfg = self.config
        optimizer.zero_grad(set_to_none=True)
        out = []
        for c in members:
            values = live[c]
            target = tgt[c].to(values.device)
            loss, stats = value_loss(
                values.unsqueeze(1).expand_as(target),
                target,
                old_values=old[c].to(values.device).unsqueeze(1).expand_as(target),
                clip_range=cfg.value_clip_range,
            )
            (loss * cfg.value_loss_coef).backward()
            out.append(stats)
        if cfg.max_grad_norm is not None:
            params = {id(p): p for c in members for p in self.critics[c].parameters()}
            norm = float(torch.nn.utils.clip_grad_norm_(list(params.values()), cfg.max_grad_norm))
            for stats in out:
                stats["critic_grad_norm"] = norm
        optimizer.step()
        return out

    # --- evaluation, saving and resuming ------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """The agents' evaluation row (the actors' :meth:`GroupBaselineRecipe.evaluate`;
        critics play no part at evaluation)."""
        return self.actors.evaluate()

    def save(self, tag: str) -> list[Path]:
        """Write every agent to ``output_dir/<tag>/agent_<i>`` (Hugging Face format,
        atomically) with, for a shared-trunk critic, its value head beside the weights;
        separate critics go to ``critic_<i>`` (IAC) or ``critic`` (MAAC), trunk and head.
        Returns the folders."""
        root = self.output_dir / tag
        out = [save_agent_checkpoint(a, root / f"agent_{i}") for i, a in enumerate(self.agents)]
        for i, critic in enumerate(self.critics):
            if critic.shared:
                save_value_head(critic.head, root / f"agent_{i}", kind=critic.kind)
            else:
                out.append(
                    critic.save(root / (f"critic_{i}" if self.method == "iac" else "critic"))
                )
        return out

    def save_final(self, path: Path) -> list[Path]:
        """Agents and critics in ``path`` (``final/``), as :meth:`save` writes them."""
        return self.save(Path(path).name)

    def _critic_state(self) -> dict[str, Any]:
        """The critics' part of ``training_state.pt``: weights and optimizer state (CPU tensors)."""
        return {
            "method": self.method,
            "kind": self.config.critic_type,
            "heads": [
                {k: v.detach().cpu() for k, v in c.head.state_dict().items()} for c in self.critics
            ],
            "trunks": [
                None if c.shared else {k: v.detach().cpu() for k, v in c.trunk.state_dict().items()}
                for c in self.critics
            ],
            "optimizers": [None if o is None else o.state_dict() for o in self.critic_optimizers],
        }

    def checkpoint(
        self, path: str | Path | None = None, *, recipe_state: Mapping[str, Any] | None = None
    ) -> Path:
        """Write the step checkpoint ``path`` (default ``output_dir/checkpoints/step-N``)
        atomically and return it. ``recipe_state``: a caller's own plain-value state, saved
        under :data:`~comlrl.algos.training.run.checkpoint.RECIPE_STATE` (``comlrl.trainers``'
        IAC/MAAC keep their epoch cursor there).

        The folder is :func:`comlrl.algos.training.run.checkpoint.write_checkpoint`'s:
        ``agent_<i>/`` (Hugging Face weights) and ``training_state.pt`` holding the actors'
        optimizers (a shared-trunk head's moments are a parameter group there), the data
        stream, every random stream, the step and, under ``"critics"``, each critic's head
        and (separate critics) trunk weights and optimizer state.
        ``torch.load(..., weights_only=True)`` reads it.

        Raises:
            ConfigError: the run is data parallel (actor-critic checkpoints are
                single-process).
        """
        actors = self.actors
        if actors.world_size > 1 or actors.syncs is not None:
            raise ConfigError(
                "actor-critic checkpoints are written by a single process; run without "
                "data_parallel to checkpoint an IAC/MAAC run."
            )
        state = actors.capture_state()
        state["critics"] = self._critic_state()
        if recipe_state is not None:
            state[ckpt.RECIPE_STATE] = dict(recipe_state)
        if path is None:
            path = ckpt.step_checkpoint_path(self.output_dir, self.global_step)
        return ckpt.write_checkpoint(path, self.agents, state)

    def resume(self, path: str | Path, *, state: Mapping[str, Any] | None = None) -> int:
        """Put the run back at the step checkpoint ``path`` written by :meth:`checkpoint`:
        actor weights and optimizers, critics (heads, separate trunks, their optimizers),
        data stream and random streams; cut ``metrics.jsonl``/``samples.jsonl``/``eval.jsonl``
        back to its step and return the step. :meth:`train` then continues as if never
        stopped. ``state``: the checkpoint's ``training_state.pt`` when the caller has read
        it already.

        Raises:
            CheckpointError: the checkpoint is incomplete, was written by another recipe (no
                critic state), or does not fit the run (method, critic kind, number of
                critics, a shared/separate mismatch, other shapes).
        """
        actors = self.actors
        if state is None:
            state = ckpt.load_training_state(path)
        saved = state.get("critics")
        if saved is None:
            raise ckpt.CheckpointError(
                f"{str(path)!r} holds no critic state (a group-baseline checkpoint?); resume "
                "it with the recipe that wrote it."
            )
        if (saved["method"], saved["kind"]) != (self.method, self.config.critic_type):
            raise ckpt.CheckpointError(
                f"{str(path)!r} was written by {saved['method'].upper()} with critic_type="
                f"{saved['kind']!r}; this run is {self.method.upper()} with critic_type="
                f"{self.config.critic_type!r}."
            )
        if len(saved["heads"]) != len(self.critics):
            raise ckpt.CheckpointError(
                f"{str(path)!r} has {len(saved['heads'])} critics but this run has "
                f"{len(self.critics)}."
            )
        for i, agent in enumerate(self.agents):
            ckpt.load_agent_weights(agent.model, Path(path) / f"agent_{i}")
        actors.global_step = ckpt.restore_state(
            state,
            optimizers=actors.optimizers,
            data=actors.data,
            rng=actors.rng,
            generators=[getattr(a, "generator", None) for a in self.agents],
        )
        for i, critic in enumerate(self.critics):
            trunk, opt_state = saved["trunks"][i], saved["optimizers"][i]
            if (trunk is None) != critic.shared or (opt_state is None) != (
                self.critic_optimizers[i] is None
            ):
                raise ckpt.CheckpointError(
                    f"critic {i} is {'shared' if critic.shared else 'separate'} in this run but "
                    f"was {'shared' if trunk is None else 'separate'} when saved; use the same "
                    "critic_mode."
                )
            try:
                critic.head.load_state_dict(saved["heads"][i])
                if trunk is not None:
                    critic.trunk.load_state_dict(trunk)
                optimizer = self.critic_optimizers[i]
                if optimizer is not None:
                    optimizer.load_state_dict(opt_state)
            except (RuntimeError, ValueError) as exc:
                raise ckpt.CheckpointError(
                    f"critic {i}'s saved state does not fit this run: {exc}"
                ) from None
        rewind_outputs(self.output_dir, actors.global_step)
        return actors.global_step

    # --- the loop -----------------------------------------------------------------------

    def schedule(self) -> Schedule:
        """The actors' schedule (:meth:`GroupBaselineRecipe.schedule`), labelled by the
        method."""
        plan = self.actors.schedule()
        return Schedule(**{**vars(plan), "desc": self.method})

    def collective(self) -> Collective:
        """One process (actor-critic runs are not data parallel)."""
        return Collective()

    def train(self, *, overwrite: bool | None = None) -> list[dict[str, float]]:
        """Run ``config.num_steps`` steps under the loop driver
        (:func:`comlrl.algos.training.loop.run_loop`), as the group-baseline recipe does:
        ``metrics.jsonl`` and ``samples.jsonl`` rows per step, ``eval.jsonl``, ``config.yaml``
        (with ``algo``: what ``comlrl train --resume`` runs), the reporters of ``report_to``,
        resumable step checkpoints (:meth:`checkpoint`) and ``final/`` (:meth:`save`). A run
        put back by :meth:`resume` continues from its step; closes the task after.

        Raises:
            ConfigError: ``output_dir`` holds another run and ``overwrite`` is False.
            TrainingInterrupted: after Ctrl-C or SIGTERM: the step in progress was finished
                and checkpointed (the exception names the checkpoint).
        """
        outputs = self.actors.outputs
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
        return self.actors.summary(history)

    def close(self) -> None:
        """Stop the worker threads and close the task (safe to call twice)."""
        self.actors.close()


class IACTrainer(ActorCriticRecipe):
    """Independent actor-critic: each agent has its own critic that sees only its own prompt
    (``critic_type="v"``) or prompt and completion (``"q"``): a separate model
    (``critic_mode="separate"``) or a value head on the agent's model (``"shared"``).
    Advantages are GAE (Schulman et al. 2016) per turn; the actor takes PPO-clipped
    policy-gradient steps (Schulman et al. 2017)."""

    method = "iac"
    algo = "iac"


class MAACTrainer(ActorCriticRecipe):
    """Multi-agent actor-critic with one centralised critic that reads every agent's prompt
    (``"v"``) and the joint action (``"q"``) — centralised training, decentralised execution
    (Lowe et al. 2017, MADDPG; Foerster et al. 2018, COMA). Same advantages and updates as
    :class:`IACTrainer`, with every agent credited from the shared critic."""

    method = "maac"
    algo = "maac"


def actor_update_settings(settings: UpdateSettings, num_generations: int) -> UpdateSettings:
    """The actors' update settings: ``settings``, with ``shared_prefix`` off when ``G = 1``.

    The shared-prefix path runs each prompt through the model once and repeats its KV cache
    for the prompt's ``G`` completions; with one completion per prompt (CoMLRL 1.4.3's
    multi-turn setting) there is nothing to share and the split costs a second decoder call
    per turn (measured on stories260k, 4 prompts, 2 turns, 1 thread: 43 -> 37 ms per agent
    forward). The single forward computes the same log-probs and gradient up to float32
    round-off (tested against the shared-prefix path).
    """
    import dataclasses

    if num_generations == 1 and settings.shared_prefix:
        return dataclasses.replace(settings, shared_prefix=False)
    return settings


def _build_critics(
    agents: Sequence[Any], config: ActorCriticConfig, method: Method
) -> list[Critic]:
    """The critics ``config`` asks for: a value head on each actor (IAC, ``shared``), else
    separate models (``critic_model`` or the agent's own; IAC one per agent, MAAC one)."""
    from comlrl.algos.models.loading import load_model_and_tokenizer

    if method == "iac" and config.critic_mode == "shared":
        return [
            Critic(
                a.model,
                a.tokenizer,
                ValueHead(hidden_size_of(a.model), config.value_head_hidden_dim),
                kind=config.critic_type,
                shared=True,
                max_length=config.critic_max_length,
            )
            for a in agents
        ]
    out = []
    for i in range(len(agents) if method == "iac" else 1):
        name = config.critic_model or config.model_for(i)
        trunk, tok = load_model_and_tokenizer(
            name,
            seed=config.seed + 7919 * (i + 1),
            dtype=config.dtype,
            trust_remote_code=config.trust_remote_code,
        )
        head = ValueHead(hidden_size_of(trunk), config.value_head_hidden_dim)
        out.append(
            Critic(trunk, tok, head, kind=config.critic_type, max_length=config.critic_max_length)
        )
    return out


def _check_critics(
    critics: Sequence[Critic], method: Method, config: ActorCriticConfig, agents: Sequence[Any]
) -> None:
    want = len(agents) if method == "iac" else 1
    if len(critics) != want:
        raise ConfigError(f"{method.upper()} needs {want} critic(s), got {len(critics)}.")
    for i, critic in enumerate(critics):
        if critic.kind != config.critic_type:
            raise ConfigError(
                f"critic {i} is of kind {critic.kind!r} but config.critic_type="
                f"{config.critic_type!r}."
            )
        if critic.shared and (method == "maac" or critic.trunk is not agents[i].model):
            raise ConfigError(
                f"critic {i} is marked shared but its trunk is not agent {i}'s model; a shared "
                "critic must sit on its own agent's model (IAC only)."
            )
        if not critic.shared and any(critic.trunk is a.model for a in agents):
            raise ConfigError(
                f"critic {i} is separate but its trunk is an agent's model, which its own "
                "optimizer would step a second time; use critic_mode='shared' (a value head "
                "on the agent's model, IAC) or give the critic its own model."
            )


def _has_dropout(model: Any) -> bool:
    """True when ``model`` drops out anything in train mode (a ``Dropout`` module with
    ``p > 0`` or a config dropout probability > 0, e.g. Llama's ``attention_dropout``)."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            return True
    config = getattr(model, "config", None)
    for key in ("attention_dropout", "hidden_dropout", "dropout", "attn_pdrop", "resid_pdrop"):
        value = getattr(config, key, 0.0)
        if isinstance(value, int | float) and value > 0:
            return True
    return False
