"""The shared front of the CoMLRL 1.4.3 trainers: arguments in, a recipe run out.

:class:`CompatTrainer` takes CoMLRL 1.4.3's constructor arguments, loads the agents
(:mod:`comlrl.trainers._loading`), checks the config's fields
(:mod:`comlrl.trainers._fields`), adapts the callbacks (:mod:`comlrl.trainers._callbacks`),
translates the CoMLRL config dataclass into a validated :class:`comlrl.algos.TrainConfig`
(or :class:`~comlrl.algos.recipes.actor_critic.recipe.ActorCriticConfig`) and builds the
run with :func:`comlrl.algos.recipes.group_baseline.recipe.setup`. ``train()`` then calls
the recipe's ``train_step`` ``num_steps`` times, ``evaluate()`` runs CoMLRL's evaluation
protocol on the recipe's rollout (:mod:`comlrl.trainers._evaluation`), and
``save_model(dir)`` writes ``dir/agent_<i>`` in Hugging Face format; ``train()`` with
1.4.3's checkpoint arguments, ``save_checkpoint`` and ``load_checkpoint`` are
:mod:`comlrl.trainers._train143`'s. What differs from
CoMLRL 1.4.3 on purpose is listed in ``docs/compat.md``. The helpers of the modules
named above are re-exported here (the trainers import them from this module).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.trainers._callbacks import CompatEnvironment, CompatReward, build_formatters
from comlrl.trainers._fields import (
    ADVANTAGE_MODES,
    JOINT_MODES,
    UnsupportedFieldError,
    UnsupportedTrainerError,
    _reject,
    check_common_fields,
    check_config_fields,
    common_train_config,
    critic_device_names,
    device_fields,
    device_list,
    one_device,
)
from comlrl.trainers._loading import _model_kwargs, as_examples, load_agents
from comlrl.trainers._tasks143 import AgentTasks143
from comlrl.trainers._train143 import TrainLoop143
from comlrl.trainers._wandb import (
    _import_wandb,
    log_row,
    start_run,
    wandb_disabled,
    wandb_installed,
)

__all__ = [
    "ADVANTAGE_MODES",
    "JOINT_MODES",
    "CompatTrainer",
    "UnsupportedFieldError",
    "UnsupportedTrainerError",
    "_model_kwargs",
    "_reject",
    "as_examples",
    "check_common_fields",
    "check_config_fields",
    "common_train_config",
    "critic_device_names",
    "device_fields",
    "device_list",
    "load_agents",
    "one_device",
    "wandb_disabled",
]


class CompatTrainer(TrainLoop143, AgentTasks143):
    """Shared implementation of the CoMLRL 1.4.3 trainer front (see the module docstring).

    Subclasses set :attr:`config_cls`, :attr:`algorithm_name` and implement
    :meth:`_setup` (build the recipe run from agents, env, data and our config).
    """

    config_cls: type = object
    algorithm_name: str = ""
    #: the recipe keeps all agents on one device (parallel_training='mp' over several is
    #: refused before any model loads)
    single_device: bool = False
    #: the CoMLRL config dataclass the trainer was built with
    args: Any
    #: the recipe's run state (``GroupBaselineRun`` or ``MADPORun``), built by
    #: :meth:`_defer_run`'s callable (at construction when there is training data, else
    #: on first use)
    _run_state: Any = None
    _build_run: Callable[[], Any] | None = None
    #: the joint reward :meth:`evaluate` scores with; None: the training environment's
    eval_reward: Any = None
    #: a reward function's ``A`` values for one joint action are per-agent rewards
    #: (CoMLRL 1.4.3's IAC/MAAC); otherwise its first value is the joint reward
    per_agent_rewards: bool = False

    def _init_common(
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
    ) -> None:
        self.args = args if args is not None else self.config_cls()
        if not isinstance(self.args, getattr(self, "accepted_config", self.config_cls)):
            raise TypeError(
                f"{type(self).__name__} takes args={self.config_cls.__name__}(...), got "
                f"{type(self.args).__name__}; build one with {self.config_cls.__name__}(**fields)."
            )
        args = self.args
        check_common_fields(args)
        if self.single_device:
            one_device(args, int(args.num_agents), type(self).__name__)
        # CoMLRL 1.4.3's order: reward_func, the models, the transition; train_dataset may
        # come later (it is needed by train())
        if reward_func is None or not callable(reward_func):
            raise ValueError(f"reward_func must be a callable, got {reward_func!r}")
        if agent_model is None and agents is None:
            raise ValueError(
                "Either agent_model or agents must be provided: pass agent_model= (a model "
                "name or path) or agents= (a list of models)."
            )
        if args.num_turns > 1 and external_transition is None:
            raise ValueError(
                f"num_turns={args.num_turns} needs external_transition= (it builds the next "
                "turn's prompts); set num_turns=1 for single-turn training."
            )
        self.model_config = dict(model_config or {})
        self.wandb_config = dict(wandb_config) if wandb_config is not None else None
        if self.wandb_config is not None and wandb_disabled() and not wandb_installed():
            self.wandb_config = None  # WANDB_MODE=disabled without wandb: no run, no error
        if self.wandb_config is not None:
            _import_wandb()  # fails here, before any model loads
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.reward_func = reward_func
        self.reward_processor = reward_processor
        self.external_transition = external_transition
        models, tokenizers, names = load_agents(
            agent_model, agents, num_agents, tokenizer, self.model_config
        )
        self.num_agents = len(models)
        self.parallel_training = str(args.parallel_training)
        placement = device_fields(args, self.num_agents)
        self.agent_devices = (
            placement.get("agent_devices") or [placement.get("device", "auto")] * self.num_agents
        )
        self.model_name = names[0]
        self.tokenizers = tokenizers
        self.tokenizer = tokenizers[0]
        self.formatters = build_formatters(formatters, self.num_agents)
        self.env = CompatEnvironment(
            self.formatters,
            CompatReward(
                reward_func,
                self.num_agents,
                self.formatters[0],
                reward_processor,
                per_agent=self.per_agent_rewards,
            ),
            external_transition if args.num_turns > 1 else None,
            passthrough=bool(args.external_prompt_passthrough),
        )
        self._train_rows = (
            as_examples(train_dataset, "train_dataset") if train_dataset is not None else []
        )
        self._eval_rows = (
            as_examples(eval_dataset, "eval_dataset") if eval_dataset is not None else None
        )
        self._models = models
        self._names = names
        self._wandb_run: Any = None
        self.env_step = 0
        #: 1.4.3's environment step of the last logged training row (-1: none yet)
        self._last_train_log_step = -1
        #: 1.4.3's per-agent rollout buffers; our recipe's step buffers nothing between
        #: calls, so they stay empty (1.4.3-style hook subclasses fill them)
        self.rollout_buffers: list[list[Any]] = [[] for _ in range(self.num_agents)]

    @property
    def _run(self) -> Any:
        if self._run_state is None:
            if self._build_run is None or not self._train_rows:
                raise ValueError(
                    f"{type(self).__name__} has no training data: train_dataset is required to "
                    "train (a datasets.Dataset or a list of dicts); pass train_dataset= when "
                    "building the trainer."
                )
            self._run_state = self._build_run()
        return self._run_state

    @_run.setter
    def _run(self, value: Any) -> None:
        self._run_state = value

    def _defer_run(self, build: Callable[[], Any]) -> None:
        """Build the recipe's run with ``build()`` now when there is training data, else on
        first use (CoMLRL 1.4.3 builds a trainer without ``train_dataset``)."""
        self._build_run = build
        if self._train_rows:
            self._run_state = build()

    def _hf_agents(self) -> list[Any]:
        from comlrl.algos.rollout.agent import HFAgent

        # CoMLRL 1.4.3 tokenizes what the formatters return as it is: no chat template.
        # It samples with model.generate: a model whose generate was replaced on the
        # instance (a scripted or custom policy) samples through it ("hf" backend).
        return [
            HFAgent(
                m,
                t,
                name=f"agent_{i}",
                prompt_format="raw",
                backend="hf" if "generate" in vars(m) else "native",
            )
            for i, (m, t) in enumerate(zip(self._models, self.tokenizers))
        ]

    def _our_config(self, cls: type, fields: dict[str, Any]) -> Any:
        from comlrl.algos.training.config import ConfigError
        from pydantic import ValidationError

        fields.setdefault("models", [n if n else "local-model" for n in self._names])
        fields.setdefault(
            "output_dir", tempfile.mkdtemp(prefix=f"comlrl-{self.algorithm_name.lower()}-")
        )
        fields.setdefault("progress", self._verbose())
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise ConfigError(
                f"{type(self.args).__name__} does not translate into a valid {cls.__name__}:\n{exc}"
            ) from None

    def _verbose(self) -> bool:
        sections = (self.wandb_config or {}).get("config_sections") or {}
        output = sections.get("output") if isinstance(sections, dict) else None
        return bool(output.get("verbose", True)) if isinstance(output, dict) else True

    # --- the run --------------------------------------------------------------------
    @property
    def agents(self) -> list[Any]:
        """The ``A`` trained ``transformers`` models."""
        return self._models

    @agents.setter
    def agents(self, models: Sequence[Any]) -> None:
        """Replace the models before the recipe run is built (1.4.3's tests assign
        ``trainer.agents`` on trainers they assemble by hand).

        Raises:
            AttributeError: the run is built (it holds the models and their optimizers).
        """
        self._refuse_after_run("agents")
        self._models = list(models)

    def _refuse_after_run(self, name: str) -> None:
        if self.__dict__.get("_run_state") is not None:
            raise AttributeError(
                f"{type(self).__name__}.{name} cannot be replaced once the recipe run is built "
                f"(it holds the models and their optimizers); build a new trainer instead."
            )

    @property
    def config(self) -> Any:
        """Our validated config the CoMLRL ``args`` were translated into."""
        return self._run.config

    @property
    def optimizers(self) -> list[Any]:
        """One optimizer per agent."""
        given = self.__dict__.get("_optimizers_given")
        return given if given is not None else self._base_run().optimizers

    @optimizers.setter
    def optimizers(self, optimizers: Sequence[Any]) -> None:
        """Use these optimizers in the 1.4.3 hooks, before the recipe run is built (1.4.3's
        tests assign them).

        Raises:
            AttributeError: the run is built.
        """
        self._refuse_after_run("optimizers")
        self.__dict__["_optimizers_given"] = list(optimizers)

    def _base_run(self) -> Any:
        return self._run

    def _train_step(self) -> dict[str, float]:
        raise NotImplementedError

    def _wandb_run_config(self) -> dict[str, Any]:
        """The W&B run's config: ``algorithm`` and the config's fields."""
        return {"algorithm": self.algorithm_name, **dataclasses.asdict(self.args)}

    def _init_wandb(self) -> None:
        """1.4.3's ``_init_wandb``: start the W&B run now (not at the first logged row);
        nothing without ``wandb_config`` or when a run is already started."""
        if self.wandb_config is not None and self._wandb_run is None:
            self._wandb_run = start_run(self.wandb_config, self)

    def _wandb_log(self, row: Mapping[str, Any]) -> None:
        """Log ``row``'s numbers to W&B at ``env_step`` (starting the run on first use);
        nothing without ``wandb_config``."""
        if self.wandb_config is not None:
            self._wandb_run = log_row(self._wandb_run, self.wandb_config, self, row)

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """CoMLRL 1.4.3's evaluation: one sampled joint action per turn on the first
        ``num_eval_samples`` (default ``args.eval_num_samples``) evaluation examples.

        Returns ``eval/turn_<t>/reward_mean`` and ``eval/turn_<t>/expected_return`` (the
        undiscounted reward sum from turn ``t`` on; turns that were cut by early
        termination count 0), plus ``eval/<key>`` for what ``eval_aggregator`` returns
        from ``eval_logger``'s per-example metrics (when both are given). Empty without
        ``eval_dataset``.
        """
        from comlrl.trainers._evaluation import evaluate_protocol

        out = evaluate_protocol(self, num_eval_samples)
        if out:
            self._wandb_log(out)
        return out

    def _eval_role_completions(
        self, completions: list[list[list[str]]], rows: list[dict[str, Any]]
    ) -> list[list[list[str]]]:
        """What ``eval_logger`` receives as ``agent_completions_turns`` (``[A][example]
        [turn]`` texts); the centralized trainer splits its joint completions here."""
        return completions

    def save_model(self, output_dir: str | Path) -> list[Path]:
        """Write every agent (weights and tokenizer, Hugging Face format) to
        ``output_dir/agent_<i>``; load one with ``AutoModelForCausalLM.from_pretrained``.
        Returns the folders."""
        from comlrl.algos.training.saving import save_agent_checkpoint

        root = Path(output_dir)
        root.mkdir(parents=True, exist_ok=True)
        paths = [
            save_agent_checkpoint(agent, root / f"agent_{i}")
            for i, agent in enumerate(self._base_run().agents)
        ]
        if self._wandb_run is not None:
            self._wandb_run.log({"final_model_saved": str(root)})
            self._wandb_run.finish()
            self._wandb_run = None
        return paths
