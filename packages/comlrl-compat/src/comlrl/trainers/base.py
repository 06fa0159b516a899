"""The front every ``comlrl.trainers`` trainer shares: CoMLRL 1.4.3's constructor
arguments checked in 1.4.3's order, the agents loaded, the callbacks adapted, and
``train()`` / ``evaluate()`` / ``save_model()`` run on a ``comlrl.algos`` trainer.

A subclass of :class:`CompatTrainer` says which 1.4.3 config it takes
(:attr:`~CompatTrainer.config_cls`), how that config translates onto the recipe's config
(:meth:`~CompatTrainer.recipe_config`) and which ``comlrl.algos`` trainer runs it
(:meth:`~CompatTrainer.build_recipe_trainer`). Training, evaluation, checkpoints and
resuming are the recipe's: the loop driver of ``comlrl.algos`` runs every step and writes
its own checkpoint format (``train(checkpoint_dir=...)``), and
``train(resume_from_checkpoint=...)`` resumes through it. Without ``checkpoint_dir`` a
run writes into a temporary folder that ``train()`` deletes when it returns or raises, so
nothing the script did not ask for stays on disk (1.4.3 writes nothing either).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.trainers.config_fields import UnsupportedFieldError, device_fields
from comlrl.trainers.environment import CompatEnvironment, CompatReward, build_formatters
from comlrl.trainers.loading import as_examples, load_agents
from comlrl.utils.wandb_utils import verbose_from_wandb_config

__all__ = ["CompatTrainer", "recipe_agents"]


def recipe_agents(models: Sequence[Any], tokenizers: Sequence[Any]) -> list[Any]:
    """``A`` :class:`comlrl.algos.HFAgent` s for 1.4.3's models: prompts are fed as the
    formatters return them (no chat template, as 1.4.3 does), and a model whose
    ``generate`` was replaced on the instance (a scripted policy) samples through it."""
    from comlrl.algos import HFAgent

    return [
        HFAgent(
            m,
            t,
            name=f"agent_{i}",
            prompt_format="raw",
            backend="hf" if "generate" in vars(m) else "native",
        )
        for i, (m, t) in enumerate(zip(models, tokenizers, strict=True))
    ]


class CompatTrainer:
    """CoMLRL 1.4.3's trainer front (see the module docstring).

    Attributes:
        args: the 1.4.3 config dataclass.
        agents: the ``A`` ``transformers`` models.
        tokenizers, tokenizer: one tokenizer per agent, and agent 0's.
        num_agents: ``A``.
        model_name: agent 0's model name or path (None for a model object without one).
        formatters: ``A`` formatters (:func:`comlrl.trainers.environment.build_formatters`).
        env: the :class:`comlrl.trainers.environment.CompatEnvironment` the recipe plays.
    """

    #: the 1.4.3 config dataclass (``args`` of another type is refused)
    config_cls: type[Any] = object
    #: the config types ``args`` may have (default :attr:`config_cls`)
    accepted_config: type | None = None
    #: the name in messages and the W&B run config
    algorithm_name: str = ""
    #: a reward function's ``A`` values for one joint action are per-agent rewards (IAC, MAAC)
    per_agent_rewards: bool = False
    args: Any
    _recipe: Any = None
    #: 1.4.3's ``train()`` checkpoint arguments the recipe was built for: ``(folder or None,
    #: save_every, keep_last)``
    _output: tuple[str | None, int, int | None] | None = None
    #: the temporary folder the current recipe run writes into (None: the script's own)
    _scratch: Path | None = None

    def _init_front(
        self,
        *,
        args: Any,
        agent_model: Any,
        agents: Sequence[Any] | None,
        num_agents: int,
        tokenizer: Any,
        model_config: Mapping[str, Any] | None,
        train_dataset: Any,
        eval_dataset: Any,
        reward_func: Callable[..., Any] | None,
        reward_processor: Callable[[float], float] | None,
        formatters: Any,
        external_transition: Callable[..., Sequence[str]] | None,
        wandb_config: Mapping[str, Any] | None,
        eval_logger: Any = None,
        eval_aggregator: Any = None,
        before_loading: Callable[[], None] | None = None,
    ) -> None:
        """Check the arguments (1.4.3's order and messages), load the agents and build the
        environment. ``before_loading`` runs the subclass's own checks before any model
        loads.

        Raises:
            TypeError: ``args`` is not a :attr:`config_cls`.
            ValueError: no callable ``reward_func``; neither ``agent_model`` nor
                ``agents``; ``num_turns > 1`` without ``external_transition``; malformed
                devices, agents or tokenizers (named in the message).
        """
        chosen = args if args is not None else self.config_cls()
        if not isinstance(chosen, self.accepted_config or self.config_cls):
            raise TypeError(
                f"{type(self).__name__} takes args={self.config_cls.__name__}(...), got "
                f"{type(chosen).__name__}."
            )
        self.args = args if args is not None else chosen
        if reward_func is None or not callable(reward_func):
            raise ValueError(f"reward_func must be a callable, got {reward_func!r}")
        if agent_model is None and agents is None:
            raise ValueError(
                "Either agent_model or agents must be provided: pass agent_model= (a model "
                "name or path) or agents= (a list of models)."
            )
        if before_loading is not None:
            before_loading()
        if self.args.num_turns > 1 and external_transition is None:
            raise ValueError(
                f"num_turns={self.args.num_turns} needs external_transition= (it builds the "
                "next turn's prompts); set num_turns=1 for single-turn training."
            )
        device_fields(self.args, int(self.args.num_agents))  # a malformed device list raises
        if eval_logger is not None or eval_aggregator is not None:
            warnings.warn(
                f"{type(self).__name__}: eval_logger and eval_aggregator are not called here; "
                "evaluate() returns the recipe's evaluation metrics (docs/compat.md).",
                UserWarning,
                stacklevel=3,
            )
        self.model_config = dict(model_config or {})
        self.wandb_config = dict(wandb_config) if wandb_config is not None else None
        self.reward_func = reward_func
        self.reward_processor = reward_processor
        self.external_transition = external_transition
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        models, tokenizers, names = load_agents(
            agent_model, agents, num_agents, tokenizer, self.model_config
        )
        self.agents = models
        self.num_agents = len(models)
        self.tokenizers = tokenizers
        self.tokenizer = tokenizers[0]
        self.model_name = names[0]
        self.model_names = names
        self.formatters = build_formatters(formatters, self.num_agents)
        reward = (
            reward_func  # already batched (centralized: the roles' reward of a joint text)
            if getattr(reward_func, "is_joint_reward", False)
            else CompatReward(
                reward_func,
                self.num_agents,
                self.formatters[0],
                reward_processor,
                per_agent=self.per_agent_rewards,
            )
        )
        self.env = CompatEnvironment(
            self.formatters,
            reward,
            external_transition if self.args.num_turns > 1 else None,
            passthrough=bool(getattr(self.args, "external_prompt_passthrough", False)),
        )

    # --- what a subclass supplies ------------------------------------------------------
    def recipe_config(self, num_examples: int, has_eval: bool) -> dict[str, Any]:
        """The recipe config's fields for :attr:`args` (``num_examples`` training examples;
        ``has_eval``: an evaluation set is given)."""
        raise NotImplementedError

    def build_recipe_trainer(
        self, config: dict[str, Any], data: list[dict[str, Any]], eval_rows: list[Any] | None
    ) -> Any:
        """The ``comlrl.algos`` trainer that runs ``config`` on ``data``."""
        raise NotImplementedError

    # --- the recipe trainer ------------------------------------------------------------
    def _rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        train = (
            as_examples(self.train_dataset, "train_dataset")
            if self.train_dataset is not None
            else []
        )
        evals = (
            as_examples(self.eval_dataset, "eval_dataset")
            if self.eval_dataset is not None
            else None
        )
        return train, evals

    def _build(self, output: tuple[str | None, int, int | None]) -> Any:
        """The ``comlrl.algos`` trainer, its config translated from :attr:`args` and its
        :class:`comlrl.algos.RunOutputs` (a fresh temporary folder when 1.4.3's ``train()``
        named none, deleted after ``train()``) in the config's output fields, which the recipe
        reads them from."""
        from comlrl.algos import RunOutputs

        train, evals = self._rows()
        # 1.4.3 builds a trainer (and its optimizers) without train_dataset; so does this
        # one, on a stand-in example that is never trained on (train() refuses to start)
        data = train or evals or [{"prompt": ""}]
        fields = self.recipe_config(len(data), evals is not None)
        fields.setdefault("models", [n or "local-model" for n in self.model_names])
        fields["prompt_format"] = "raw"
        root, save_every, keep_last = output
        self._scratch = None
        if root is None:  # a folder of our own, deleted after train()
            scratch = tempfile.mkdtemp(prefix=f"comlrl-{self.algorithm_name.lower()}-")
            self._scratch = Path(scratch)
            weakref.finalize(self, shutil.rmtree, scratch, True)
        wandb = self.wandb_config is not None and os.environ.get("WANDB_MODE") != "disabled"
        outputs = RunOutputs(
            output_dir=Path(root) if root is not None else self._scratch,  # type: ignore[arg-type]
            save_every=save_every,
            keep_last=keep_last,
            progress=verbose_from_wandb_config(self.wandb_config),
            report_to=("jsonl", "wandb") if wandb else ("jsonl",),
            wandb_project=str((self.wandb_config or {}).get("project") or "comlrl"),
        )
        fields.update(
            output_dir=str(outputs.output_dir),
            save_every=outputs.save_every,
            keep_last=outputs.keep_last,
            progress=outputs.progress,
        )
        if wandb:
            fields.update(report_to=list(outputs.report_to), wandb_project=outputs.wandb_project)
        limit = fields.get("eval_limit")
        rows = evals[:limit] if evals is not None and limit else evals
        self._output = output
        return self.build_recipe_trainer(fields, data, rows)

    @property
    def recipe_trainer(self) -> Any:
        """The ``comlrl.algos`` trainer that runs this one (built on first use)."""
        if self._recipe is None:
            self._recipe = self._build(self._output or (None, 0, None))
        return self._recipe

    @property
    def config(self) -> Any:
        """The recipe's validated config that :attr:`args` translate into."""
        return self.recipe_trainer.config

    @property
    def optimizers(self) -> list[Any]:
        """One optimizer per agent (the recipe's)."""
        return list(self.recipe_trainer.optimizers)

    @property
    def output_dir(self) -> Path:
        """Where the recipe writes metrics, samples and checkpoints."""
        return Path(self.recipe_trainer.output_dir)

    # --- 1.4.3's public methods --------------------------------------------------------
    def train(
        self,
        resume_from_checkpoint: str | Path | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **kwargs: Any,
    ) -> list[dict[str, float]]:
        """Train ``num_train_epochs`` passes over ``train_dataset`` with the recipe's loop
        driver; returns the metrics rows (one per optimizer step). Called again after a
        finished run, it trains the same models ``num_train_epochs`` more on the current
        ``train_dataset`` (a new recipe run: fresh optimizer state, a new output folder).

        Args:
            resume_from_checkpoint: a step checkpoint this package wrote
                (``<checkpoint_dir>/checkpoints/step-<n>``): training continues from its step.
            checkpoint_dir: the run's output folder (metrics, samples, step checkpoints in
                the ``comlrl.algos`` format, ``final/``); default a temporary folder,
                deleted when ``train()`` returns or raises (a Ctrl-C then keeps no
                checkpoint: it raises a plain ``KeyboardInterrupt``).
            checkpoint_interval: a step checkpoint every this many epochs.
            checkpoint_total_limit: keep only the newest this many step checkpoints.

        Raises:
            ValueError: no ``train_dataset``, or ``checkpoint_interval < 1``.
            UnsupportedFieldError: other keyword arguments, or new checkpoint settings
                after training has started.
        """
        if kwargs:
            raise UnsupportedFieldError(
                f"{type(self).__name__}.train() got {sorted(kwargs)}; it takes "
                "resume_from_checkpoint, checkpoint_dir, checkpoint_interval and "
                "checkpoint_total_limit."
            )
        train, _ = self._rows()
        if not train:
            raise ValueError(
                f"{type(self).__name__} has no training data: pass train_dataset= (a "
                "datasets.Dataset or a list of dicts) when building the trainer."
            )
        if checkpoint_interval < 1:
            raise ValueError(f"checkpoint_interval must be >= 1, got {checkpoint_interval!r}")
        root = checkpoint_dir
        if root is None and resume_from_checkpoint is not None:
            root = Path(resume_from_checkpoint).parent.parent  # <run>/checkpoints/step-<n>
        save_every = 0
        if checkpoint_dir is not None:
            per_epoch = math.ceil(len(train) / int(self.args.train_batch_size or 1))
            save_every = max(1, per_epoch * int(checkpoint_interval))
        output = (str(root) if root is not None else None, save_every, checkpoint_total_limit)
        if self._recipe is not None:
            done = self._recipe.global_step >= self._recipe.config.num_steps
            if done:  # 1.4.3: another train() trains num_train_epochs more on train_dataset
                self._recipe = None
            elif output != self._output:
                if self._recipe.global_step > 0:
                    raise UnsupportedFieldError(
                        "checkpoint settings are fixed once training has started; build a "
                        "new trainer for another checkpoint_dir."
                    )
                self._recipe = None
        if self._recipe is None:
            self._recipe = self._build(output)
        if resume_from_checkpoint is not None:
            self._recipe.resume(resume_from_checkpoint)
        scratch = self._scratch
        try:
            return list(self._recipe.train())
        except KeyboardInterrupt:
            if scratch is None:
                raise
            raise KeyboardInterrupt(
                f"{type(self).__name__}.train() was interrupted; without checkpoint_dir= no "
                "checkpoint is kept (pass checkpoint_dir= to resume later)."
            ) from None
        except Exception as exc:
            if scratch is not None:  # Python 3.10 has no add_note: __notes__ as 3.11 keeps them
                note = (
                    f"comlrl.trainers: the run's temporary folder {scratch} was deleted; pass "
                    "checkpoint_dir= to keep a run's checkpoints."
                )
                exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
            raise
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """One evaluation of the agents on the first ``num_eval_samples`` (default
        ``args.eval_num_samples``) examples of ``eval_dataset``: the recipe's evaluation
        row, each key prefixed with ``eval/``; empty without ``eval_dataset``."""
        _, evals = self._rows()
        if evals is None:
            return {}
        trainer = self.recipe_trainer
        run = trainer
        held = run.eval_data
        limit = num_eval_samples or int(getattr(self.args, "eval_num_samples", 0) or 0)
        run.eval_data = evals[:limit] if limit else evals
        try:
            row = trainer.evaluate()
        finally:
            run.eval_data = held
        return {f"eval/{k}": float(v) for k, v in row.items()}

    def save_model(self, output_dir: str | Path) -> list[Path]:
        """Write every agent (weights and tokenizer, Hugging Face format) to
        ``output_dir/agent_<i>``; returns the folders."""
        from comlrl.algos import save_agent_checkpoint

        root = Path(output_dir)
        root.mkdir(parents=True, exist_ok=True)
        return [
            save_agent_checkpoint(agent, root / f"agent_{i}")
            for i, agent in enumerate(self.recipe_trainer.agents)
        ]
