"""Step checkpoints of MADPO-Iter and MARLHF-Iter (:mod:`.recipe`) in the one
format (:mod:`comlrl.algos.training.run.checkpoint`), and exact resume from them.

A checkpoint holds what MADPO's (:func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_checkpoint`)
or the group-baseline recipe's (:func:`comlrl.algos.recipes.group_baseline.recipe.checkpoint`)
holds (weights, optimizers, data stream, random streams) and, under
:data:`~comlrl.algos.training.run.checkpoint.RECIPE_STATE`, the iterative state:

- ``recipe``: ``"madpo_iter"`` or ``"marlhf_iter"`` (a checkpoint of another recipe is refused);
- ``rounds``: :meth:`~comlrl.algos.recipes.preference.iterative.rounds.IterativeRounds.state_dict`:
  the pairing and ordering streams, the round rows, the replay of every round's pairs,
  the comparator's history snapshots and its frozen agents' sampling streams;
- ``round``: the round in progress (:class:`RoundState`: its row and, MADPO-Iter, the
  training pairs its remaining steps take);
- MARLHF-Iter also: the rounds' prompt stream, the reward model's weights as last
  fitted, whether it was fitted, its fit rows (``reward_model_metrics.jsonl``) and a
  fingerprint of its initial weights (every round refits from those; setup rebuilds them,
  and a resume whose reward model starts elsewhere is refused).

The reward model's optimizer is not saved: every round's fit builds a fresh one (and
reseeds torch) inside one step, so none outlives a step boundary.

MADPO-Iter and MARLHF-Iter under the one loop driver (:mod:`comlrl.algos.training.loop`).

Both run ``num_steps`` optimizer steps in rounds of ``steps_per_round``
(:class:`~comlrl.algos.recipes.preference.iterative.config.IterativeSection`). The first step of a
round starts it (:meth:`~comlrl.algos.recipes.preference.iterative.rounds.IterativeRounds.begin`):
``round_prompts`` prompts from the training stream, current vs comparator candidates,
pairs, replay. Then:

- **MADPO-Iter** (:func:`madpo_iter_step`): the round's training pairs, shuffled once,
  are spread over its ``steps_per_round`` steps; each step is one joint DPO update
  (:func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_update`: Rafailov et al. 2023,
  eq. 7, every agent on its own term of the joint log-ratio) against the frozen initial
  policy. A step without pairs logs and does not update (``num_pairs = 0``).
- **MARLHF-Iter** (:func:`marlhf_iter_step`): the round refits the joint reward model
  from its initial weights on the round's training pairs (Bradley-Terry), then each step
  is a group-baseline RL step (:func:`comlrl.algos.recipes.group_baseline.recipe.step`)
  on that model's reward. Pairs are ordered by the task reward, or (``scoring_reward=
  "reward_model"``) by the previous round's reward model once one exists.

Every step's row carries its round's ``iter/*`` keys and ``iteration`` (1-based).
Evaluation rows go to ``eval.jsonl``. Step checkpoints hold
the weights and optimizers and the rounds (replay, comparator snapshots, the round in
progress, the reward model): a run put back by :func:`madpo_iter_resume` /
:func:`marlhf_iter_resume` continues exactly as if never stopped.

The end-to-end runs of the iterative preference recipes (``algo=madpo_iter``,
``algo=marlhf_iter``): their run configs and the runs, rounds of fresh pairs against a
comparator policy (:mod:`comlrl.algos.recipes.preference.iterative.recipe`), from config to
final checkpoint and resumable, from Python as from ``comlrl train``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.recipes.group_baseline import recipe as group_baseline_state
from comlrl.algos.recipes.launch import (
    RunOutputs,
    RunResult,
    announce,
    load_agents,
    load_eval_split,
    load_model,
    loss_summary,
    preflight,
    quiet_transformers,
    resuming_line,
    setup_errors,
)
from comlrl.algos.recipes.preference.checkpoint import loop_settings, save_models
from comlrl.algos.recipes.preference.iterative.comparator import Comparator
from comlrl.algos.recipes.preference.iterative.config import (
    IterativeMADPOConfig,
    IterativeSection,
    MADPOIterRunConfig,
    MARLHFIterRunConfig,
)
from comlrl.algos.recipes.preference.iterative.replay import PreferenceReplay
from comlrl.algos.recipes.preference.iterative.rounds import IterativeRounds
from comlrl.algos.recipes.preference.madpo.recipe import (
    MADPORun,
    madpo_checkpoint,
    madpo_evaluate,
    madpo_resume,
    madpo_update,
)
from comlrl.algos.recipes.preference.marlhf.reward_model import train_reward_model
from comlrl.algos.recipes.preference.pairs import IterPair, joint_pairs
from comlrl.algos.rollout.environment import Environment
from comlrl.algos.training.loop import RecipeLoop, StepResult, run_loop
from comlrl.algos.training.run import checkpoint as ckpt
from comlrl.algos.training.run.checkpoint import cpu_state_dict
from comlrl.algos.training.run.data import DataStream
from comlrl.algos.training.run.reporting import Reporter
from comlrl.core import SamplingParams

__all__ = [
    "RoundState",
    "madpo_iter_checkpoint",
    "madpo_iter_resume",
    "marlhf_iter_checkpoint",
    "marlhf_iter_resume",
    "build_rounds",
    "MADPOIterRun",
    "madpo_iter_step",
    "train_madpo_iter",
    "MARLHFIterRun",
    "fit_fresh_reward_model",
    "refit_reward_model",
    "marlhf_iter_step",
    "train_marlhf_iter",
    "run_madpo_iter",
    "run_marlhf_iter",
]


@dataclass
class RoundState:
    """The round in progress: its row and its training pairs, one chunk per step."""

    row: dict[str, float] = field(default_factory=dict)
    chunks: list[list[IterPair]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        """Plain values (the pairs as :meth:`IterPair.to_state`)."""
        return {
            "row": dict(self.row),
            "chunks": [[p.to_state() for p in chunk] for chunk in self.chunks],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RoundState:
        """The round :meth:`state_dict` saved."""
        return cls(
            {str(k): float(v) for k, v in state["row"].items()},
            [[IterPair.from_state(p) for p in chunk] for chunk in state["chunks"]],
        )


def _fingerprint(weights: Mapping[str, torch.Tensor]) -> float:
    """The float64 sum of ``|w|`` over ``weights``: equal for the same weights, almost
    surely different for others (a cheap check, not a hash)."""
    return float(sum(t.detach().double().abs().sum() for t in weights.values()))


def _iterative_state(state: Mapping[str, Any], path: str | Path, recipe: str) -> dict[str, Any]:
    saved = state.get(ckpt.RECIPE_STATE)
    if not isinstance(saved, Mapping) or saved.get("recipe") != recipe:
        found = saved.get("recipe") if isinstance(saved, Mapping) else None
        raise ckpt.CheckpointError(
            f"{str(path)!r} holds no {recipe} rounds (its recipe state: {found!r}); resume "
            f"it with the recipe that wrote it, or start a new algo={recipe} run."
        )
    return dict(saved)


def _load_rounds(run: Any, saved: Mapping[str, Any]) -> None:
    try:
        run.rounds.load_state_dict(saved["rounds"])
    except ValueError as exc:
        raise ckpt.CheckpointError(str(exc)) from None
    run.round = RoundState.from_state(saved["round"])


def madpo_iter_checkpoint(run: MADPOIterRun, path: str | Path) -> Path:
    """Write a MADPO-Iter step checkpoint at ``path`` (the MADPO run's, plus the rounds
    and the round in progress); returns the folder."""
    recipe_state = {
        "recipe": "madpo_iter",
        "rounds": run.rounds.state_dict(),
        "round": run.round.state_dict(),
    }
    return madpo_checkpoint(run.madpo, path, recipe_state=recipe_state)


def madpo_iter_resume(
    run: MADPOIterRun, path: str | Path, output_dir: str | Path | None = None
) -> int:
    """Put a freshly built MADPO-Iter ``run`` (the initial weights, rounds not begun) back
    at the step checkpoint ``path`` and return its step; with ``output_dir`` its logs are
    cut back to the step. The run then continues as if never stopped.

    Raises:
        CheckpointError: the checkpoint is incomplete, is not MADPO-Iter's, or does not
            fit the run (agents, optimizers, reference models, comparator).
    """
    state = ckpt.load_training_state(path)
    saved = _iterative_state(state, path, "madpo_iter")
    step = madpo_resume(run.madpo, path, output_dir, state=state)
    _load_rounds(run, saved)
    return step


def marlhf_iter_checkpoint(run: MARLHFIterRun, path: str | Path) -> Path:
    """Write a MARLHF-Iter step checkpoint at ``path`` (the RL run's, plus the rounds,
    the round in progress, the prompt stream and the reward model); returns the folder."""
    recipe_state = {
        "recipe": "marlhf_iter",
        "rounds": run.rounds.state_dict(),
        "round": run.round.state_dict(),
        "data": run.data.state_dict(),
        "fitted": run.fitted,
        "reward_model": ckpt.cpu_state_dict(run.reward_model),
        "reward_init_fingerprint": _fingerprint(run.reward_init),
        "reward_model_rows": [dict(row) for row in run.reward_model_rows],
    }
    return group_baseline_state.checkpoint(run.rl, path, recipe_state=recipe_state)


def marlhf_iter_resume(run: MARLHFIterRun, path: str | Path) -> int:
    """Put a freshly built MARLHF-Iter ``run`` (the initial weights and reward model,
    rounds not begun) back at the step checkpoint ``path`` and return its step; the logs
    in the RL run's ``output_dir`` are cut back to the step.

    Raises:
        CheckpointError: the checkpoint is incomplete, is not MARLHF-Iter's, or does not
            fit the run (agents, optimizers, comparator, the reward model's initial
            weights or shape, the prompt data).
    """
    state = ckpt.load_training_state(path)
    saved = _iterative_state(state, path, "marlhf_iter")
    now = _fingerprint(run.reward_init)
    was = float(saved["reward_init_fingerprint"])
    if abs(now - was) > 1e-9 * max(1.0, abs(was)):
        raise ckpt.CheckpointError(
            f"the reward model starts from other weights than the saved run's (fingerprint "
            f"{was} when saved, {now} now); resume with the reward_model the run started with."
        )
    step = group_baseline_state.resume(run.rl, path, state=state)
    try:
        run.reward_model.load_state_dict(dict(saved["reward_model"]), strict=True)
        run.data.load_state_dict(saved["data"])
    except (RuntimeError, ValueError) as exc:
        raise ckpt.CheckpointError(f"the saved reward model or data do not fit: {exc}") from None
    run.fitted = bool(saved["fitted"])
    run.reward_model_rows = [dict(row) for row in saved["reward_model_rows"]]
    _load_rounds(run, saved)
    return step


def build_rounds(
    section: IterativeSection,
    agents: Sequence[Any],
    sampling: SamplingParams,
    *,
    pairs_per_prompt: int | None,
    num_rounds: int | None,
    seed: int,
    load: Callable[[str], Any] | None = None,
) -> IterativeRounds:
    """The :class:`IterativeRounds` of ``section``: the comparator (``load`` reads
    ``comparator_models`` names), the replay and the comparator's sampling (``sampling``
    with ``comparator_num_candidates``)."""
    comparator = Comparator(
        section.comparator,
        agents,
        sources=section.comparator_models,
        load=load,
        history_k=section.comparator_history_k,
        num_rounds=num_rounds,
        seed=seed + 7919,
        api=_api_client(section) if section.comparator == "api" else None,
    )
    replay = PreferenceReplay(
        section.replay_mode,
        section.replay_k,
        section.replay_lambda,
        section.replay_sample_size,
        random.Random(seed + 1),
        shard_dir=section.replay_dir,
    )
    k_cmp = section.comparator_num_candidates or sampling.num_generations
    return IterativeRounds(
        comparator,
        replay,
        sampling=sampling,
        comparator_sampling=dataclasses.replace(sampling, num_generations=k_cmp),
        pair_selection=section.pair_selection,
        pairs_per_prompt=pairs_per_prompt,
        seed=seed,
    )


def _api_client(section: IterativeSection) -> Any:
    """The HTTP comparator of ``comparator=api``."""
    from comlrl.algos.recipes.preference.iterative.api_comparator import (
        ApiComparatorClient,
        ApiComparatorConfig,
    )

    return ApiComparatorClient(
        ApiComparatorConfig(
            url=str(section.comparator_api_url),
            format=section.comparator_api_format,
            model=section.comparator_api_model,
            api_key_env=section.comparator_api_key_env,
        )
    )


def _round_prompts(section: IterativeSection, batch_size: int) -> int:
    return section.round_prompts or batch_size * section.steps_per_round


def _pad_ids(agents: Sequence[Any]) -> list[int]:
    return [int(a.tokenizer.pad_token_id) for a in agents]


@dataclass
class MADPOIterRun:
    """A MADPO-Iter run: the MADPO run (agents, references, optimizers, data stream) and
    its rounds."""

    madpo: MADPORun
    rounds: IterativeRounds
    round: RoundState = field(default_factory=RoundState)


def madpo_iter_step(run: MADPOIterRun) -> dict[str, float]:
    """One MADPO-Iter step (see the module docstring); its metrics row: ``step``,
    ``iteration``, the round's ``iter/*`` keys, ``reward_mean`` (the round's current
    policy candidates), ``num_pairs`` and, with pairs, :func:`madpo_update`'s keys."""
    mr, cfg = run.madpo, run.madpo.config
    assert isinstance(cfg, IterativeSection)
    spr = cfg.steps_per_round
    r, k = divmod(mr.step, spr)
    if k == 0:
        if r > 0:
            run.rounds.finish(r - 1)
        examples = mr.data.next_batch(_round_prompts(cfg, cfg.batch_size))
        pairs, row = run.rounds.begin(r, mr.env, examples, cfg.batch_size)
        run.round = RoundState(row, run.rounds.split(pairs, spr))
    chunk = run.round.chunks[k]
    mr.step += 1
    out: dict[str, float] = {
        "step": mr.step,
        "iteration": float(r + 1),
        "reward_mean": run.round.row["iter/current_reward_mean"],
        **run.round.row,
        "num_pairs": len(chunk),
    }
    if chunk:
        out.update(madpo_update(mr, joint_pairs(chunk, _pad_ids(mr.agents))))
    return out


def train_madpo_iter(
    run: MADPOIterRun,
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
    """Run :func:`madpo_iter_step` s up to ``config.num_steps`` under the loop driver
    (outputs as :func:`~comlrl.algos.recipes.preference.madpo.recipe.train_madpo`; evaluation,
    :func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_evaluate`, in ``eval.jsonl``),
    from the run's step: ``resume_from`` (a step checkpoint of this run, loaded when the
    run is at step 0 with :func:`madpo_iter_resume`) continues exactly.

    Raises:
        CheckpointError: ``resume_from`` does not fit the run.
    """
    cfg = run.madpo.config
    assert isinstance(cfg, IterativeMADPOConfig)
    settings = loop_settings(
        cfg,
        output_dir=output_dir,
        save_every=save_every,
        keep_last=keep_last,
        record=record,
        progress=progress,
        desc="madpo_iter",
        overwrite=overwrite,
        reporters=reporters,
    )
    if resume_from is not None and run.madpo.step == 0:
        madpo_iter_resume(run, resume_from, output_dir)
    loop = RecipeLoop(
        step=lambda: StepResult(madpo_iter_step(run)),
        checkpoint=lambda path: madpo_iter_checkpoint(run, path),
        save_final=lambda path: save_models(
            path, [(a.model, a.tokenizer) for a in run.madpo.agents]
        ),
        evaluate=(lambda: madpo_evaluate(run.madpo)) if run.madpo.eval_data else None,
        start_step=run.madpo.step,
    )
    return run_loop(loop, settings)


@dataclass
class MARLHFIterRun:
    """A MARLHF-Iter run.

    Attributes:
        rl: the group-baseline run whose reward is ``reward_model`` (its ``env``), its
            evaluation scored by the task (its ``eval_env``).
        rounds: the rounds (current agents: ``rl.agents``).
        task_env: the task's environment (pairs are scored in it).
        reward_env: the environment that scores with the reward model (``rl.env``).
        reward_model, reward_tokenizer, reward_config: MARLHF's joint reward model and
            how it is fitted; :attr:`reward_init` holds its initial weights (every round
            refits from them).
        data: the stream the rounds' prompts come from.
        scoring_reward: ``task`` or ``reward_model`` (see the module docstring).
    """

    rl: Any
    rounds: IterativeRounds
    task_env: Environment
    reward_env: Environment
    reward_model: Any
    reward_tokenizer: Any
    reward_config: Any
    data: DataStream
    section: IterativeSection
    batch_size: int
    scoring_reward: str = "task"
    reward_init: dict[str, torch.Tensor] = field(default_factory=dict)
    fitted: bool = False
    round: RoundState = field(default_factory=RoundState)
    reward_model_rows: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.reward_init:
            self.reward_init = cpu_state_dict(self.reward_model)


def fit_fresh_reward_model(
    model: Any,
    tokenizer: Any,
    config: Any,
    initial: Mapping[str, torch.Tensor],
    pairs: Sequence[IterPair],
    pad_ids: Sequence[int],
    round_index: int,
) -> list[dict[str, float]]:
    """Load ``initial`` into the reward model and fit it on ``pairs`` (Bradley-Terry,
    :func:`~comlrl.algos.recipes.preference.marlhf.reward_model.train_reward_model` with
    ``config``); returns the fit's rows, each with ``iteration`` (``round_index + 1``)."""
    model.load_state_dict(dict(initial))
    rows = train_reward_model(model, tokenizer, [joint_pairs(pairs, pad_ids)], config)
    for row in rows:
        row["iteration"] = float(round_index + 1)
    return rows


def refit_reward_model(
    run: MARLHFIterRun, pairs: Sequence[IterPair], round_index: int
) -> dict[str, float]:
    """:func:`fit_fresh_reward_model` on the run's reward model; returns the fit's last
    row as ``reward_model/*`` keys (every row goes to ``run.reward_model_rows``)."""
    rows = fit_fresh_reward_model(
        run.reward_model,
        run.reward_tokenizer,
        run.reward_config,
        run.reward_init,
        pairs,
        _pad_ids(run.rl.agents),
        round_index,
    )
    run.fitted = True
    run.reward_model_rows.extend(rows)
    return {f"reward_model/{k}": float(v) for k, v in rows[-1].items() if k != "iteration"}


def marlhf_iter_step(run: MARLHFIterRun) -> StepResult:
    """One MARLHF-Iter step (see the module docstring): at a round's first step, pairs and
    the reward model's refit (a round without pairs keeps the previous fit); then one RL
    step. The row: the RL step's, ``iteration``, the round's ``iter/*`` keys and the
    latest fit's ``reward_model/*`` keys."""
    spr = run.section.steps_per_round
    r, k = divmod(run.rl.step, spr)
    if k == 0:
        if r > 0:
            run.rounds.finish(r - 1)
        learned = run.scoring_reward == "reward_model" and run.fitted
        env = run.reward_env if learned else run.task_env
        examples = run.data.next_batch(_round_prompts(run.section, run.batch_size))
        pairs, row = run.rounds.begin(r, env, examples, run.batch_size)
        fit = refit_reward_model(run, pairs, r) if pairs else {}
        previous = {key: v for key, v in run.round.row.items() if key.startswith("reward_model/")}
        run.round = RoundState({**row, **(fit or previous)})
    result = group_baseline.step(run.rl)
    result.row.update({"iteration": float(r + 1), **run.round.row})
    return result


def train_marlhf_iter(
    run: MARLHFIterRun,
    *,
    record: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    save_final: Callable[[Path], Any] | None = None,
) -> list[dict[str, float]]:
    """Run :func:`marlhf_iter_step` s up to the RL config's ``num_steps`` under the loop
    driver, with the group-baseline recipe's outputs (``output_dir``, ``eval.jsonl``
    scored by the task, reporters, ``samples.jsonl``); ``save_final(folder)`` also runs
    when ``final/`` is written (e.g. to save the reward model). A run put back by
    :func:`marlhf_iter_resume` continues from its step."""

    def final(path: Path) -> None:
        group_baseline.save(run.rl, path.name)
        if save_final is not None:
            save_final(path)

    loop = RecipeLoop(
        step=lambda: marlhf_iter_step(run),
        checkpoint=lambda path: marlhf_iter_checkpoint(run, path),
        save_final=final,
        evaluate=(lambda: group_baseline.evaluate(run.rl)) if run.rl.eval_data else None,
        start_step=run.rl.step,
    )
    if run.rl.step == 0:
        torch.manual_seed(run.rl.config.seed)
    try:
        settings = group_baseline.loop_settings(
            run.rl.config,
            record=dict(record) if record else None,
            desc="marlhf_iter",
            overwrite=overwrite,
        )
        return run_loop(loop, settings, group_baseline.collective(run.rl))
    finally:
        run.rl.close()


def _loader(config: Any) -> Any:
    """``name -> model`` for ``comparator_models`` (frozen, loaded as the agents are)."""
    return lambda name: load_model(name, config, config.seed + 7919)[0]


#: ``task -> (formatters, reward)`` of one joint policy (the centralized recipes)
JointInputs = Callable[[Any], tuple[list[Any], Any]]


def run_madpo_iter(
    config: MADPOIterRunConfig,
    outputs: RunOutputs | None = None,
    *,
    algo: str = "madpo_iter",
    num_models: int | None = None,
    joint: JointInputs | None = None,
    policy_config: Any = None,
) -> RunResult:
    """``algo=madpo_iter``: MADPO-Iter on ``config.task``
    (:func:`~comlrl.algos.recipes.preference.iterative.recipe.train_madpo_iter`); with
    ``outputs.resume_from`` it continues that step checkpoint (rounds, replay and
    comparator included).

    ``algo=centralized_madpo_iter`` loads ``num_models`` (1) models, takes the one joint
    policy's ``(formatters, reward)`` from ``joint(task)`` instead of the task's own, and
    builds its MADPO run with ``policy_config`` (the policy's one-agent config).

    Raises:
        ConfigError: a bad config, task, model name, a model that does not load, a
            folder that holds another run (without ``outputs.overwrite``), or a checkpoint
            that does not fit, all before training.
        TrainingInterrupted: Ctrl-C, after the step checkpoint.
    """
    from comlrl.algos.recipes.preference.iterative.recipe import (
        MADPOIterRun,
        build_rounds,
        madpo_iter_resume,
        train_madpo_iter,
    )
    from comlrl.algos.recipes.preference.madpo.recipe import MADPOTrainer
    from comlrl.algos.training.run.reporting import reporters_for

    outputs = outputs if outputs is not None else RunOutputs.of(config)
    config = outputs.apply(config)
    outputs.check_folder()
    task, examples = preflight(
        config,
        [*config.models, *(config.comparator_models or [])],
        refuse_tools="madpo_iter",
    )
    try:
        with setup_errors():
            eval_examples = None
            if config.eval_split is not None:
                eval_examples = load_eval_split(task, config.eval_split, config.eval_limit)
            quiet_transformers()
            announce(
                config,
                len(examples),
                f"MADPO-Iter against the {config.comparator} comparator, "
                f"{config.num_rounds(config.num_steps)} rounds of {config.steps_per_round} steps",
                _who(config, num_models),
            )
            agents = load_agents(config, num_models, prompt_format=config.prompt_format)
            madpo = MADPOTrainer(
                agents,
                policy_config or config,
                dataset=examples,
                eval_dataset=eval_examples,
                **_task_inputs(task, joint),
            ).run
            rounds = build_rounds(
                config,
                madpo.agents,
                SamplingParams.from_config(config, config.num_candidates),
                pairs_per_prompt=config.pairs_per_prompt,
                num_rounds=config.num_rounds(config.num_steps),
                seed=config.seed,
                load=_loader(config),
            )
            run = MADPOIterRun(madpo, rounds)
            if outputs.resume_from is not None:
                step = madpo_iter_resume(run, outputs.resume_from, outputs.output_dir)
                print(
                    resuming_line(outputs.output_dir, step, config.num_steps, outputs.resume_from)
                )
    except BaseException:
        task.close()
        raise
    try:  # a bug from here on keeps its traceback
        history = train_madpo_iter(
            run,
            **outputs.loop_arguments({"algo": algo, **config.model_dump()}),
            overwrite=outputs.overwrite,
            reporters=lambda out: reporters_for(
                out,
                report_to=list(outputs.report_to),
                reward_curve=outputs.reward_curve,
                title=f"{config.task.name} - {', '.join(config.models)} - MADPO-Iter",
                wandb_project=outputs.wandb_project,
                record=config.model_dump(),
            ),
        )
    finally:
        task.close()
    out = outputs.output_dir
    return RunResult(history, loss_summary(history, out, "reward_mean"), out)


def _who(config: Any, num_models: int | None) -> str:
    """Who trains, for the run's first line: the agents, or one policy for the roles."""
    if num_models is None or num_models == config.num_agents:
        return f"{config.num_agents} agents"
    return f"{num_models} policy for {config.num_agents} roles"


def _task_inputs(task: Any, joint: JointInputs | None) -> dict[str, Any]:
    """The trainer's task arguments: the task itself, or a joint policy's formatters and
    reward on it."""
    if joint is None:
        return {"task": task}
    return dict(zip(("formatters", "reward_func"), joint(task), strict=True))


def run_marlhf_iter(
    config: MARLHFIterRunConfig,
    outputs: RunOutputs | None = None,
    *,
    algo: str = "marlhf_iter",
    num_models: int | None = None,
    joint: JointInputs | None = None,
    policy_config: Any = None,
) -> RunResult:
    """``algo=marlhf_iter``: MARLHF-Iter on ``config.task``
    (:func:`~comlrl.algos.recipes.preference.iterative.recipe.train_marlhf_iter`); the
    reward model's fit rows in ``reward_model_metrics.jsonl``, its last fit in
    ``final/reward_model``; with ``outputs.resume_from`` it continues that step checkpoint.
    ``algo=centralized_marlhf_iter`` as :func:`run_madpo_iter`'s centralized form: one
    joint policy, its RL steps with ``policy_config``.

    Raises:
        ConfigError: as :func:`run_madpo_iter`.
        TrainingInterrupted: Ctrl-C, after the step checkpoint.
        RewardFunctionError: the reward function failed.
    """
    import torch
    from comlrl.algos.recipes.preference.iterative.recipe import (
        MARLHFIterRun,
        build_rounds,
        marlhf_iter_resume,
        train_marlhf_iter,
    )
    from comlrl.algos.recipes.preference.madpo.config import MADPOConfig
    from comlrl.algos.recipes.preference.marlhf.recipe import MARLHFTrainer, save_reward_model
    from comlrl.algos.training.run import lifecycle
    from comlrl.algos.training.run.data import JsonlWriter
    from comlrl.algos.training.run.data_mixture import example_stream
    from comlrl.algos.training.run.summary import summary_line

    outputs = outputs if outputs is not None else RunOutputs.of(config)
    config = outputs.apply(config)
    if policy_config is not None:
        policy_config = outputs.apply(policy_config)
    outputs.check_folder()
    backbone_name = config.reward_model or config.model_for(0)
    task, examples = preflight(
        config,
        [*config.models, backbone_name, *(config.comparator_models or [])],
        refuse_tools="marlhf_iter",
    )
    try:
        with setup_errors():
            eval_examples = None
            if config.eval_every:
                eval_examples = load_eval_split(task, config.eval_split, config.eval_limit)
            quiet_transformers()
            announce(
                config,
                len(examples),
                f"MARLHF-Iter against the {config.comparator} comparator, "
                f"{config.num_rounds(config.num_steps)} rounds of a reward-model fit and "
                f"{config.steps_per_round} steps of estimator {config.estimator}",
                _who(config, num_models),
            )
            torch.manual_seed(config.seed)
            agents = load_agents(config, num_models, **config.generation_options())
            n_models = len(agents)
            backbone, backbone_tok = load_model(backbone_name, config, config.seed + 104_729)
            marlhf = MARLHFTrainer(
                agents,
                MADPOConfig(num_agents=n_models, seed=config.seed, device=config.device),
                reward_backbone=backbone,
                reward_tokenizer=backbone_tok,
                reward_config=config.reward,
                dataset=examples,
                **_task_inputs(task, joint),
            )
            rl = marlhf.rl_trainer(policy_config or config, eval_dataset=eval_examples)
            run = MARLHFIterRun(
                rl=rl.run,
                rounds=build_rounds(
                    config,
                    rl.run.agents,
                    SamplingParams.from_config(config, config.num_candidates),
                    pairs_per_prompt=config.pairs_per_prompt,
                    num_rounds=config.num_rounds(config.num_steps),
                    seed=config.seed,
                    load=_loader(config),
                ),
                task_env=marlhf.env,
                reward_env=rl.env,
                reward_model=marlhf.reward_model,
                reward_tokenizer=marlhf.reward_tokenizer,
                reward_config=config.reward,
                data=example_stream(examples, seed=config.seed + 1, task=config.task),
                section=config,
                batch_size=config.batch_size,
                scoring_reward=config.scoring_reward,
            )
            if outputs.resume_from is not None:
                step = marlhf_iter_resume(run, outputs.resume_from)
                print(
                    resuming_line(outputs.output_dir, step, config.num_steps, outputs.resume_from)
                )
    except BaseException:
        task.close()
        raise
    if outputs.overwrite and outputs.resume_from is None:
        lifecycle.clear_run_outputs(outputs.output_dir)
    out = rl.run.output_dir
    try:  # a bug from here on keeps its traceback
        history = train_marlhf_iter(
            run,
            record=lifecycle.run_record(config, algo=algo, task=task),
            save_final=lambda path: save_reward_model(marlhf, path / "reward_model"),
        )
    finally:
        task.close()
        if run.reward_model_rows:  # all of the run's fits (a resumed run's saved ones too)
            (out / "reward_model_metrics.jsonl").unlink(missing_ok=True)
            writer = JsonlWriter(out / "reward_model_metrics.jsonl")
            try:
                for row in run.reward_model_rows:
                    writer.write(row)
            finally:
                writer.close()
    line = summary_line(history, out) + " (reward: the learned reward model's)"
    return RunResult(history, line, out)
