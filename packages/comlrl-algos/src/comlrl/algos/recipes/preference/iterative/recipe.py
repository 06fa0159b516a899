"""The iterative preference recipes: MADPO-Iter (:class:`MADPOIterRecipe`) and MARLHF-Iter
(:class:`MARLHFIterRecipe`), each the non-iterative recipe's class with rounds.

Both run ``num_steps`` optimizer steps in rounds of ``steps_per_round`` (the config's
``iterative`` section, :class:`~comlrl.algos.recipes.preference.config.IterativeSection`).
The first step of a round starts it
(:meth:`~comlrl.algos.recipes.preference.iterative.rounds.IterativeRounds.begin`):
``round_prompts`` prompts from the training stream, current vs comparator candidates,
pairs, replay. Then:

- **MADPO-Iter** (:meth:`MADPOIterRecipe.step`): the round's training pairs, shuffled once,
  are spread over its ``steps_per_round`` steps; each step is one joint DPO update
  (:meth:`~comlrl.algos.recipes.preference.madpo.recipe.MADPORecipe.update`: Rafailov et al.
  2023, eq. 7, every agent on its own term of the joint log-ratio) against the frozen
  initial policy. A step without pairs logs and does not update (``num_pairs = 0``).
- **MARLHF-Iter** (:meth:`MARLHFIterRecipe.step`): the round refits the joint reward model
  from its initial weights on the round's training pairs (Bradley-Terry), then each step
  is a group-baseline RL step on that model's reward. Pairs are ordered by the task reward,
  or (``scoring_reward="reward_model"``) by the previous round's reward model once one
  exists.

Every step's row carries its round's ``iter/*`` keys and ``iteration`` (1-based).
Evaluation rows go to ``eval.jsonl``. A step checkpoint holds what the non-iterative
recipe's holds (weights, optimizers, data stream, random streams) and, under
:data:`~comlrl.algos.training.run.checkpoint.RECIPE_STATE`, the rounds: ``recipe``
(``"madpo_iter"`` or ``"marlhf_iter"``; another recipe's checkpoint is refused), ``rounds``
(the pairing and ordering streams, the round rows, the replay, the comparator's history
snapshots and its agents' sampling streams), ``round`` (the round in progress:
:class:`RoundState`) and, MARLHF-Iter, the rounds' prompt stream, the reward model as last
fitted, whether it was fitted, its fit rows (``reward_model_metrics.jsonl``) and a
fingerprint of its initial weights (every round refits from those; a resume whose reward
model starts elsewhere is refused). The reward model's optimizer is not saved: every
round's fit builds a fresh one inside one step. A recipe put back by ``resume`` continues
exactly as if never stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from comlrl.algos.recipes.launch import load_model
from comlrl.algos.recipes.preference.config import IterativeSection
from comlrl.algos.recipes.preference.iterative.comparator import Comparator
from comlrl.algos.recipes.preference.iterative.replay import PreferenceReplay
from comlrl.algos.recipes.preference.iterative.rounds import IterativeRounds
from comlrl.algos.recipes.preference.madpo.recipe import MADPORecipe
from comlrl.algos.recipes.preference.marlhf.recipe import MARLHFRecipe
from comlrl.algos.recipes.preference.marlhf.reward_model import train_reward_model
from comlrl.algos.recipes.preference.pairs import IterPair, joint_pairs
from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.loop import Schedule, StepResult, run_loop
from comlrl.algos.training.run import checkpoint as ckpt
from comlrl.algos.training.run.checkpoint import cpu_state_dict, set_random_state
from comlrl.algos.training.run.data import DataStream, JsonlWriter
from comlrl.algos.training.run.data_mixture import example_stream
from comlrl.core import SamplingParams

__all__ = ["RoundState", "build_rounds", "MADPOIterRecipe", "MARLHFIterRecipe"]


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


def build_rounds(
    section: IterativeSection,
    agents: Sequence[Any],
    sampling: SamplingParams,
    *,
    pairs_per_prompt: int | None,
    num_rounds: int | None,
    seed: int,
    load: Any = None,
) -> IterativeRounds:
    """The :class:`IterativeRounds` of ``section``: the comparator (``load(name) -> model``
    reads ``comparator_models``), the replay and the comparator's sampling (``sampling``
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


def _section(config: Any) -> IterativeSection:
    if config.iterative is None:
        raise ConfigError(
            "an iterative recipe needs the config's iterative section (iterative.steps_per_round=..., "
            "or {} for its defaults)"
        )
    section: IterativeSection = config.iterative
    return section


def _loader(config: Any) -> Any:
    """``name -> model`` for ``comparator_models`` (frozen, loaded as the agents are)."""
    return lambda name: load_model(name, config, config.seed + 7919)[0]


def _iterative_state(state: Mapping[str, Any], path: str | Path, recipe: str) -> dict[str, Any]:
    saved = state.get(ckpt.RECIPE_STATE)
    if not isinstance(saved, Mapping) or saved.get("recipe") != recipe:
        found = saved.get("recipe") if isinstance(saved, Mapping) else None
        raise ckpt.CheckpointError(
            f"{str(path)!r} holds no {recipe} rounds (its recipe state: {found!r}); resume "
            f"it with the recipe that wrote it, or start a new algo={recipe} run."
        )
    return dict(saved)


def _fingerprint(weights: Mapping[str, torch.Tensor]) -> float:
    """The float64 sum of ``|w|`` over ``weights``: equal for the same weights, almost
    surely different for others (a cheap check, not a hash)."""
    return float(sum(t.detach().double().abs().sum() for t in weights.values()))


@contextlib.contextmanager
def _rounds_kept_on_failure(rounds: IterativeRounds) -> Iterator[None]:
    """Around a round's start: an exception puts the rounds' pairing and ordering streams
    back (the recipe's own streams are kept by
    :func:`~comlrl.algos.training.run.checkpoint.streams_kept_on_failure`)."""
    pair, order = rounds.pair_rng.getstate(), rounds.order_rng.getstate()
    try:
        yield
    except Exception:
        set_random_state(rounds.pair_rng, pair)
        set_random_state(rounds.order_rng, order)
        raise


class MADPOIterRecipe(MADPORecipe):
    """MADPO-Iter: MADPO (:class:`~comlrl.algos.recipes.preference.madpo.recipe.MADPORecipe`)
    whose pairs come from rounds against a comparator (``config.iterative``; see the module
    docstring). Takes MADPO's arguments.

    Raises:
        ConfigError: as MADPO, or a config without the ``iterative`` section.
    """

    algo: ClassVar[str] = "madpo_iter"

    def __init__(self, agents: Sequence[Any], config: Any, **kwargs: Any) -> None:
        section = _section(config)
        super().__init__(agents, config, **kwargs)
        self.rounds = build_rounds(
            section,
            self.agents,
            SamplingParams.from_config(config, config.num_generations),
            pairs_per_prompt=config.pairs_per_prompt,
            num_rounds=section.num_rounds(config.num_steps),
            seed=config.seed,
            load=_loader(config),
        )
        self.round = RoundState()

    @classmethod
    def more_models(cls, config: Any) -> list[str]:
        """The comparator's frozen models."""
        return list(_section(config).comparator_models or [])

    @classmethod
    def describe(cls, config: Any) -> str:
        """``MADPO-Iter against the current comparator, 15 rounds of 4 steps``."""
        section = _section(config)
        return (
            f"MADPO-Iter against the {section.comparator} comparator, "
            f"{section.num_rounds(config.num_steps)} rounds of {section.steps_per_round} steps"
        )

    def step(self) -> StepResult:
        """One MADPO-Iter step; its row: ``step``, ``iteration``, the round's ``iter/*`` keys,
        ``reward_mean`` (the round's current policy candidates), ``num_pairs`` and, with
        pairs, the MADPO update's keys."""
        cfg = self.config
        section = _section(cfg)
        spr = section.steps_per_round
        r, k = divmod(self.global_step, spr)
        if k == 0:
            with (
                ckpt.streams_kept_on_failure(self.data, self.rng, self.generators()),
                _rounds_kept_on_failure(self.rounds),
            ):
                if r > 0:
                    self.rounds.finish(r - 1)
                prompts = section.round_prompts or cfg.batch_size * spr
                examples = self.data.next_batch(prompts)
                pairs, row = self.rounds.begin(r, self.env, examples, cfg.batch_size)
            self.round = RoundState(row, self.rounds.split(pairs, spr))
        chunk = self.round.chunks[k]
        self.global_step += 1
        out: dict[str, float] = {
            "step": self.global_step,
            "iteration": float(r + 1),
            "reward_mean": self.round.row["iter/current_reward_mean"],
            **self.round.row,
            "num_pairs": len(chunk),
        }
        if chunk:
            out.update(self.update(joint_pairs(chunk, self.pad_ids())))
        return StepResult(out)

    def checkpoint(  # type: ignore[override]
        self, path: str | Path, *, recipe_state: Mapping[str, Any] | None = None
    ) -> Path:
        """MADPO's step checkpoint plus the rounds and the round in progress."""
        state = {
            "recipe": self.algo,
            "rounds": self.rounds.state_dict(),
            "round": self.round.state_dict(),
            **(recipe_state or {}),
        }
        return super().checkpoint(path, recipe_state=state)

    def resume(self, path: str | Path, *, state: Mapping[str, Any] | None = None) -> int:
        """Put the recipe (the initial weights, rounds not begun) back at the step checkpoint
        ``path`` and return its step; the logs are cut back to the step.

        Raises:
            CheckpointError: the checkpoint is incomplete, is not MADPO-Iter's, or does not
                fit the run (agents, optimizers, reference models, comparator).
        """
        state = ckpt.load_training_state(path) if state is None else state
        saved = _iterative_state(state, path, self.algo)
        step = super().resume(path, state=state)
        try:
            self.rounds.load_state_dict(saved["rounds"])
        except ValueError as exc:
            raise ckpt.CheckpointError(str(exc)) from None
        self.round = RoundState.from_state(saved["round"])
        return step

    def schedule(self) -> Schedule:
        """MADPO's schedule, labelled ``madpo_iter``."""
        return Schedule(**{**vars(super().schedule()), "desc": self.algo})


class MARLHFIterRecipe(MARLHFRecipe):
    """MARLHF-Iter: MARLHF (:class:`~comlrl.algos.recipes.preference.marlhf.recipe.MARLHFRecipe`)
    whose reward model is refit every round on pairs against a comparator
    (``config.iterative``; see the module docstring), the RL phase running from the start.
    Takes MARLHF's arguments and ``prompts``: the stream the rounds' prompts come from
    (default: the training examples, seeded ``seed + 1``, shuffled as ``config.shuffle``
    says).

    Raises:
        ConfigError: as MARLHF, or a config without the ``iterative`` section.
    """

    algo: ClassVar[str] = "marlhf_iter"

    def __init__(
        self,
        agents: Sequence[Any],
        config: Any,
        *,
        prompts: DataStream | None = None,
        **kwargs: Any,
    ) -> None:
        section = _section(config)
        super().__init__(agents, config, **kwargs)
        self.rl = self.rl_recipe()
        self.rounds = build_rounds(
            section,
            self.rl.agents,
            SamplingParams.from_config(config, config.reward_model.num_generations),
            pairs_per_prompt=config.reward_model.pairs_per_prompt,
            num_rounds=section.num_rounds(config.num_steps),
            seed=config.seed,
            load=_loader(config),
        )
        #: the stream the rounds' prompts come from
        self.prompts = (
            prompts
            if prompts is not None
            else example_stream(
                self.dataset, seed=config.seed + 1, shuffle=config.shuffle, task=config.task
            )
        )
        #: the reward model's initial weights: every round refits from them
        self.reward_init = cpu_state_dict(self.reward_model)
        self.fitted = False
        self.round = RoundState()
        self.reward_model_rows: list[dict[str, float]] = []

    @classmethod
    def more_models(cls, config: Any) -> list[str]:
        """The comparator's frozen models."""
        return list(_section(config).comparator_models or [])

    @classmethod
    def describe(cls, config: Any) -> str:
        """``MARLHF-Iter against the current comparator, 15 rounds of a reward-model fit
        and 4 steps of estimator grpo``."""
        section = _section(config)
        return (
            f"MARLHF-Iter against the {section.comparator} comparator, "
            f"{section.num_rounds(config.num_steps)} rounds of a reward-model fit and "
            f"{section.steps_per_round} steps of estimator {config.estimator}"
        )

    def refit(self, pairs: Sequence[IterPair], round_index: int) -> dict[str, float]:
        """The reward model back at its initial weights, fit on ``pairs`` (Bradley-Terry);
        every row of the fit goes to ``reward_model_rows`` (with ``iteration``); returns the
        last as ``reward_model/*`` keys."""
        self.reward_model.load_state_dict(dict(self.reward_init))
        pad_ids = [int(a.tokenizer.pad_token_id) for a in self.agents]
        rows = train_reward_model(
            self.reward_model,
            self.reward_tokenizer,
            [joint_pairs(pairs, pad_ids)],
            self.config.reward_model,
        )
        for row in rows:
            row["iteration"] = float(round_index + 1)
        self.fitted = True
        self.reward_model_rows.extend(rows)
        return {f"reward_model/{k}": float(v) for k, v in rows[-1].items() if k != "iteration"}

    def step(self) -> StepResult:
        """One MARLHF-Iter step: at a round's first step, pairs and the reward model's refit
        (a round without pairs keeps the previous fit); then one RL step. The row: the RL
        step's, ``iteration``, the round's ``iter/*`` keys and the latest fit's
        ``reward_model/*`` keys."""
        rl, cfg = self._rl(), self.config
        section = _section(cfg)
        spr = section.steps_per_round
        r, k = divmod(rl.global_step, spr)
        if k == 0:
            learned = cfg.reward_model.scoring_reward == "reward_model" and self.fitted
            env = rl.env if learned else self.env
            with (
                ckpt.streams_kept_on_failure(self.prompts, rl.rng, rl.generators()),
                _rounds_kept_on_failure(self.rounds),
            ):
                if r > 0:
                    self.rounds.finish(r - 1)
                prompts = section.round_prompts or cfg.batch_size * spr
                examples = self.prompts.next_batch(prompts)
                pairs, row = self.rounds.begin(r, env, examples, cfg.batch_size)
            fit = self.refit(pairs, r) if pairs else {}
            previous = {
                key: v for key, v in self.round.row.items() if key.startswith("reward_model/")
            }
            self.round = RoundState({**row, **(fit or previous)})
        result = rl.step()
        result.row.update({"iteration": float(r + 1), **self.round.row})
        return result

    def checkpoint(self, path: str | Path | None = None) -> Path:
        """The RL phase's step checkpoint plus the rounds, the round in progress, the
        prompt stream and the reward model."""
        state = {
            "recipe": self.algo,
            "rounds": self.rounds.state_dict(),
            "round": self.round.state_dict(),
            "data": self.prompts.state_dict(),
            "fitted": self.fitted,
            "reward_model": cpu_state_dict(self.reward_model),
            "reward_init_fingerprint": _fingerprint(self.reward_init),
            "reward_model_rows": [dict(row) for row in self.reward_model_rows],
        }
        return self._rl().checkpoint(path, recipe_state=state)

    def resume(self, path: str | Path) -> int:
        """Put the recipe (the initial weights and reward model, rounds not begun) back at
        the step checkpoint ``path`` and return its step; the logs are cut back to it.

        Raises:
            CheckpointError: the checkpoint is incomplete, is not MARLHF-Iter's, or does not
                fit the run (agents, optimizers, comparator, the reward model's initial
                weights or shape, the prompt data).
        """
        state = ckpt.load_training_state(path)
        saved = _iterative_state(state, path, self.algo)
        now = _fingerprint(self.reward_init)
        was = float(saved["reward_init_fingerprint"])
        if abs(now - was) > 1e-9 * max(1.0, abs(was)):
            raise ckpt.CheckpointError(
                f"the reward model starts from other weights than the saved run's (fingerprint "
                f"{was} when saved, {now} now); resume with the reward_model the run started with."
            )
        step = self._rl().resume(path, state=state)
        try:
            self.reward_model.load_state_dict(dict(saved["reward_model"]), strict=True)
            self.prompts.load_state_dict(saved["data"])
            self.rounds.load_state_dict(saved["rounds"])
        except (RuntimeError, ValueError) as exc:
            raise ckpt.CheckpointError(
                f"the saved reward model, data or rounds do not fit: {exc}"
            ) from None
        self.fitted = bool(saved["fitted"])
        self.reward_model_rows = [dict(row) for row in saved["reward_model_rows"]]
        self.round = RoundState.from_state(saved["round"])
        return step

    def schedule(self) -> Schedule:
        """The RL phase's schedule, labelled ``marlhf_iter``."""
        return Schedule(**{**vars(self._rl().schedule()), "desc": self.algo})

    def train(self) -> list[dict[str, float]]:
        """The rounds and RL steps under the loop driver; every fit's rows (a resumed run's
        saved ones too) go to ``reward_model_metrics.jsonl``. Closes the task.

        Raises:
            ConfigError: ``output_dir`` holds another run (without ``outputs.overwrite``).
            TrainingInterrupted: Ctrl-C or SIGTERM, after the step checkpoint.
        """
        if self.global_step == 0:
            torch.manual_seed(self.config.seed)
        try:
            return run_loop(self, self.outputs)
        finally:
            self.close()
            if self.reward_model_rows:
                out = self.output_dir / "reward_model_metrics.jsonl"
                out.unlink(missing_ok=True)
                writer = JsonlWriter(out)
                try:
                    for row in self.reward_model_rows:
                        writer.write(row)
                finally:
                    writer.close()
