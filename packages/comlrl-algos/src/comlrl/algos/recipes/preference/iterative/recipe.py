"""MADPO-Iter and MARLHF-Iter under the one loop driver (:mod:`comlrl.algos.training.loop`).

Both run ``num_steps`` optimizer steps in rounds of ``steps_per_round``
(:class:`~comlrl.algos.recipes.preference.config.IterativeSection`). The first step of a
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
Evaluation rows go to ``eval.jsonl``. Step checkpoints (:mod:`.checkpoint`) hold
the weights and optimizers and the rounds (replay, comparator snapshots, the round in
progress, the reward model): a run put back by :func:`madpo_iter_resume` /
:func:`marlhf_iter_resume` continues exactly as if never stopped.
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
from comlrl.algos.recipes.preference.config import IterativeMADPOConfig, IterativeSection
from comlrl.algos.recipes.preference.iterative.checkpoint import (
    RoundState,
    madpo_iter_checkpoint,
    madpo_iter_resume,
    marlhf_iter_checkpoint,
)
from comlrl.algos.recipes.preference.iterative.comparator import Comparator
from comlrl.algos.recipes.preference.iterative.replay import PreferenceReplay
from comlrl.algos.recipes.preference.iterative.rounds import IterativeRounds
from comlrl.algos.recipes.preference.madpo.recipe import MADPORun, madpo_evaluate, madpo_update
from comlrl.algos.recipes.preference.marlhf.reward_model import train_reward_model
from comlrl.algos.recipes.preference.outputs import loop_settings, save_models
from comlrl.algos.recipes.preference.pairs import IterPair, joint_pairs
from comlrl.algos.rollout.environment import Environment
from comlrl.algos.training.checkpoint import cpu_state_dict
from comlrl.algos.training.data import DataStream
from comlrl.algos.training.loop import RecipeLoop, StepResult, run_loop
from comlrl.algos.training.reporting import Reporter
from comlrl.core import SamplingParams

__all__ = [
    "build_rounds",
    "MADPOIterRun",
    "madpo_iter_step",
    "train_madpo_iter",
    "MARLHFIterRun",
    "fit_fresh_reward_model",
    "refit_reward_model",
    "marlhf_iter_step",
    "train_marlhf_iter",
]


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
