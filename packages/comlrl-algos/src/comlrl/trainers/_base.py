"""The shared front of the CoMLRL 1.4.3 trainers: arguments in, a recipe run out.

:class:`CompatTrainer` takes CoMLRL 1.4.3's constructor arguments, loads the agents,
adapts the callbacks (:mod:`comlrl.trainers._callbacks`), translates the CoMLRL config
dataclass into a validated :class:`comlrl.algos.TrainConfig` (or
:class:`~comlrl.algos.recipes.actor_critic.recipe.ActorCriticConfig`) and builds the run with
:func:`comlrl.algos.recipes.group_baseline.recipe.setup`. ``train()`` then calls the recipe's
``train_step`` ``num_steps`` times, ``evaluate()`` runs CoMLRL's evaluation protocol on
the recipe's rollout, and ``save_model(dir)`` writes ``dir/agent_<i>`` in Hugging Face
format. What differs from CoMLRL 1.4.3 on purpose is listed in ``docs/compat.md``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.trainers._callbacks import CompatEnvironment, CompatReward, build_formatters
from comlrl.trainers._tasks143 import AgentTasks143

__all__ = [
    "CompatTrainer",
    "UnsupportedFieldError",
    "UnsupportedTrainerError",
    "as_examples",
    "load_agents",
]


class UnsupportedFieldError(ValueError):
    """A CoMLRL 1.4.3 config field or argument is set to a value this package does not
    implement (the message names the field, the value and what to do)."""


class UnsupportedTrainerError(NotImplementedError):
    """A CoMLRL 1.4.3 trainer or config this package names but does not implement (the
    message names it and what to use instead; see docs/compat.md)."""


#: CoMLRL's ``advantage_mode`` -> our estimator name.
ADVANTAGE_MODES = {"mean": "grpo", "raw": "reinforce", "max": "remax", "rloo": "rloo"}
#: CoMLRL's ``joint_mode`` spellings -> ours.
JOINT_MODES = {"aligned": "align", "align": "align", "cross": "cross", "crossed": "cross"}


def as_examples(data: Any, name: str) -> list[dict[str, Any]]:
    """A ``datasets.Dataset`` / ``IterableDataset`` or a sequence of mappings as a list of
    dicts (one per example).

    Raises:
        TypeError: ``data`` is not iterable or holds something other than mappings.
        ValueError: ``data`` is empty.
    """
    if isinstance(data, (str, bytes, Mapping)) or not hasattr(data, "__iter__"):
        raise TypeError(
            f"{name} must be a datasets.Dataset or a list of dicts (one per example), got "
            f"{type(data).__name__}"
        )
    rows = []
    for i, row in enumerate(data):
        if not isinstance(row, Mapping):
            raise TypeError(f"{name}[{i}] is a {type(row).__name__}, not a dict of fields: {row!r}")
        rows.append(dict(row))
    if not rows:
        raise ValueError(f"{name} is empty; give at least one example")
    return rows


def _model_kwargs(model_config: Mapping[str, Any], section: str = "model_kwargs") -> dict[str, Any]:
    nested = model_config.get(section) or {}
    dtype = nested.get("torch_dtype") or nested.get("dtype")
    dtype = dtype or model_config.get("torch_dtype") or model_config.get("dtype")
    kwargs: dict[str, Any] = {}
    if dtype is not None and dtype != "auto":
        import torch

        kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    elif dtype == "auto":
        kwargs["dtype"] = "auto"
    attn = nested.get("attn_implementation", model_config.get("attn_implementation"))
    if attn is not None:
        kwargs["attn_implementation"] = attn
    return kwargs


def _is_tokenizer_list(tokenizer: Any) -> bool:
    return isinstance(tokenizer, (list, tuple))


def load_agents(
    agent_model: Any,
    agents: Sequence[Any] | None,
    num_agents: int,
    tokenizer: Any,
    model_config: Mapping[str, Any],
    *,
    section: str = "model_kwargs",
    label: str = "agent_model",
) -> tuple[list[Any], list[Any], list[str | None]]:
    """Load or take ``A`` causal LMs and their tokenizers, as CoMLRL 1.4.3 accepts them.

    ``agent_model`` (a name/path: ``A`` independent copies are loaded; a model object only
    for one agent) or ``agents`` (``A`` names/paths or model objects). ``tokenizer``: one
    for all, a list of ``A``, or None (loaded from each name/path). ``model_config``:
    ``torch_dtype``/``dtype``, ``attn_implementation``, ``special_tokens``, and a nested
    ``model_kwargs`` section.

    Returns:
        ``(models, tokenizers, names)``; ``names[i]`` is agent ``i``'s name/path or None.

    Raises:
        ValueError: neither or both of ``agent_model`` and ``agents``; a model object for
            several agents; model objects without a tokenizer; a tokenizer list of the
            wrong length.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if agent_model is None and agents is None:
        raise ValueError(
            f"Either {label} or agents must be provided: pass {label}= (a model name or "
            "path) or agents= (a list of models)."
        )
    if agent_model is not None and agents is not None:
        # CoMLRL 1.4.3 accepts both when agents repeats the agent_model name A times
        if not isinstance(agent_model, str) or any(a != agent_model for a in agents):
            raise ValueError(
                f"{label}={agent_model!r} and agents={list(agents)!r} conflict; pass "
                f"{label}= alone, or agents= with one entry per agent."
            )
        if len(agents) != num_agents:
            raise ValueError(
                f"agents length ({len(agents)}) must equal num_agents={num_agents} when "
                f"{label}= is given too."
            )
        agent_model = None
    if agents is not None:
        sources = list(agents)
    elif isinstance(agent_model, str):
        sources = [agent_model] * num_agents
    elif num_agents == 1:
        sources = [agent_model]
    else:
        raise ValueError(
            f"{label} must be a model name or path to build {num_agents} agents (each gets its "
            "own copy); for model objects pass agents=[model_1, ..., model_A]."
        )
    kwargs = _model_kwargs(model_config, section)
    models = [
        AutoModelForCausalLM.from_pretrained(s, **kwargs) if isinstance(s, str) else s
        for s in sources
    ]
    names = [
        s if isinstance(s, str) else getattr(getattr(s, "config", None), "_name_or_path", None)
        for s in sources
    ]
    if tokenizer is None:
        missing = [i for i, s in enumerate(sources) if not isinstance(s, str)]
        if missing:
            raise ValueError(
                f"agents {missing} are model objects; pass tokenizer= (one, or a list with one "
                "per agent)."
            )
        tokenizers = [AutoTokenizer.from_pretrained(s) for s in sources]
    elif _is_tokenizer_list(tokenizer):
        if len(tokenizer) != len(models):
            raise ValueError(
                f"tokenizers length ({len(tokenizer)}) must equal the number of agents "
                f"({len(models)}); give one tokenizer per agent, or one for all."
            )
        tokenizers = list(tokenizer)
    else:
        tokenizers = [tokenizer] * len(models)
    special = model_config.get("special_tokens") or {}
    for tok in {id(t): t for t in tokenizers}.values():
        if special:
            tok.add_special_tokens(special)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
    return models, tokenizers, names


def _reject(args: Any, field: str, ok: bool, what: str) -> None:
    if not ok:
        raise UnsupportedFieldError(
            f"{type(args).__name__}.{field}={getattr(args, field)!r} is not supported by "
            f"comlrl.trainers: {what}"
        )


def check_config_fields(cfg: Any, *, critic_devices: bool = False) -> None:
    """The checks CoMLRL 1.4.3's configs make when built (call from ``__post_init__``):
    ``parallel_training`` is ``'none'`` (``'null'``, None) or ``'mp'`` (stored
    normalised), ``'mp'`` needs ``agent_devices`` (and, with ``critic_devices=True``,
    IAC/MAAC's ``critic_devices``), ``reference_kl_coef >= 0``, and ``reference_devices`` (when the KL
    is on) names 1 or ``num_agents`` devices.

    Raises:
        ValueError: naming the field.
    """
    raw = cfg.parallel_training
    mode = "none" if raw is None else str(raw).strip().lower()
    if mode in ("null", "none"):
        mode = "none"
    if mode not in ("none", "mp"):
        raise ValueError(
            f"parallel_training={raw!r}: use 'none' (all agents on one device) or 'mp' "
            "(agent i on agent_devices[i]), as in CoMLRL 1.4.3."
        )
    if mode == "mp":
        for field in ("agent_devices", "critic_devices") if critic_devices else ("agent_devices",):
            if getattr(cfg, field) is None:
                raise ValueError(
                    f"parallel_training='mp' needs {field} (one device, or one per model)."
                )
    cfg.parallel_training = mode
    coef = getattr(cfg, "reference_kl_coef", 0.0)
    if coef is not None and coef < 0:
        raise ValueError(f"reference_kl_coef must be >= 0, got {coef!r}")
    refs = getattr(cfg, "reference_devices", None)
    if getattr(cfg, "reference_kl_enabled", False) and refs is not None:
        if not isinstance(refs, str) and len(refs) not in (1, int(cfg.num_agents)):
            raise ValueError(
                f"reference_devices length ({len(refs)}) must be 1 or num_agents="
                f"{cfg.num_agents}: {list(refs)!r}"
            )


def check_common_fields(args: Any) -> None:
    """Raise :class:`UnsupportedFieldError` for settings we do not implement, and
    ``ValueError`` for device settings CoMLRL 1.4.3 also rejects."""
    check_config_fields(args)
    from comlrl.algos.models.devices import validate_devices

    fields = device_fields(args, int(args.num_agents))  # raises on a malformed spec
    fields["critic_devices"] = critic_device_names(args, int(args.num_agents))
    for field, names in fields.items():
        names = [names] if isinstance(names, str) else names
        if names is not None and names != ["auto"]:
            validate_devices(names, len(names), "agent_devices" if field == "device" else field)
    _reject(args, "eval_batch_size", args.eval_batch_size >= 1, "must be >= 1.")


def device_list(spec: Any, count: int, field: str) -> list[str] | None:
    """CoMLRL 1.4.3's device spec as one device name per model: ``None``/``"auto"`` ->
    ``None`` (our automatic choice), a string -> that device ``count`` times, a list of one
    -> repeated, a list of ``count`` -> as given.

    Raises:
        ValueError: an empty list, or a list whose length is neither 1 nor ``count``.
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto"):
        return None
    if isinstance(spec, str):
        return [spec] * count
    names = [str(s) for s in spec]
    if not names:
        raise ValueError(f"{field} must be a non-empty list, a device string or 'auto'.")
    if len(names) == 1:
        return names * count
    if len(names) != count:
        raise ValueError(f"{field} lists {len(names)} devices; give 1 or {count} (one per model).")
    return names


def device_fields(args: Any, num_agents: int) -> dict[str, Any]:
    """The :class:`~comlrl.algos.TrainConfig` placement fields for a CoMLRL 1.4.3 config:
    ``parallel_training='mp'`` puts agent ``i`` on ``agent_devices[i]`` (``agent_devices``
    in comlrl.algos; ``"auto"`` spreads the agents over the visible GPUs when there are
    enough, as 1.4.3 does), ``'none'`` (or one model) puts every agent on the first device
    named (or the automatic one); ``reference_devices`` places the KL reference copies
    when ``reference_kl_enabled``.

    Raises:
        ValueError: a malformed device list (see :func:`device_list`).
    """
    import torch

    if args.parallel_training == "mp" and num_agents > 1:
        names = device_list(args.agent_devices, num_agents, "agent_devices")
        if names is None and torch.cuda.is_available() and torch.cuda.device_count() >= num_agents:
            names = [f"cuda:{i}" for i in range(num_agents)]
    else:
        spec = args.agent_devices
        if spec is not None and not isinstance(spec, str):
            spec = list(spec)
            if not spec:
                raise ValueError(
                    "agent_devices must be a non-empty list, a device string or 'auto'."
                )
            spec = str(spec[0])
        names = device_list(spec, num_agents, "agent_devices")
    if names is None:
        fields: dict[str, Any] = {"device": "auto"}
    elif len(set(names)) == 1:
        fields = {"device": names[0]}
    else:
        fields = {"agent_devices": names}
    refs = getattr(args, "reference_devices", None)
    if getattr(args, "reference_kl_enabled", False) and refs is not None:
        fields["reference_devices"] = device_list(refs, num_agents, "reference_devices")
    return fields


def critic_device_names(args: Any, num_agents: int) -> list[str] | None:
    """``critic_devices`` of a CoMLRL 1.4.3 actor-critic config as comlrl.algos'
    ``critic_devices``: IAC with separate critics, one device per agent (one device is
    repeated); MAAC (no ``use_separate_critic`` field), its one centralised critic's device;
    ``None`` (critics beside their agents / agent 0) when unset or, as in 1.4.3, for IAC
    value heads on the agents (``use_separate_critic=False``).

    Raises:
        ValueError: a list whose length is neither 1 nor the number of critics.
    """
    spec = getattr(args, "critic_devices", None)
    if spec is None:
        return None
    if not hasattr(args, "use_separate_critic"):
        return device_list(spec, 1, "critic_devices")
    if not args.use_separate_critic:
        return None
    return device_list(spec, num_agents, "critic_devices")


def one_device(args: Any, num_agents: int, trainer: str) -> str:
    """The single device of a trainer that keeps its agents together (preference recipes).

    Raises:
        UnsupportedFieldError: the settings place agents on several devices.
    """
    fields = device_fields(args, num_agents)
    fields.pop("reference_devices", None)
    if "agent_devices" in fields:
        raise UnsupportedFieldError(
            f"{type(args).__name__}.agent_devices={args.agent_devices!r} with "
            f"parallel_training='mp' is not supported by {trainer} here: its agents share one "
            "device; give one device (e.g. 'cuda:0')."
        )
    return str(fields["device"])


def common_train_config(
    args: Any, num_agents: int, num_examples: int, has_eval: bool
) -> dict[str, Any]:
    """The :class:`~comlrl.algos.TrainConfig` fields shared by every CoMLRL config."""
    batch = int(args.train_batch_size or args.rollout_buffer_size)
    steps = max(1, math.ceil(int(args.num_train_epochs) * num_examples / batch))
    eval_on = has_eval and int(args.eval_interval) > 0 and int(args.eval_num_samples) > 0
    return {
        "num_agents": num_agents,
        **device_fields(args, num_agents),
        "max_new_tokens": int(args.max_new_tokens),
        "temperature": float(args.temperature),
        "top_p": float(args.top_p),
        "top_k": int(args.top_k or 0),
        "num_turns": int(args.num_turns),
        "gamma": float(args.discount),
        "early_termination_threshold": args.early_termination_threshold,
        "termination_scope": "node",
        "learning_rate": float(args.agent_learning_rate),
        # CoMLRL 1.4.3: torch.optim.AdamW with its defaults (weight decay 0.01), no clipping
        "optimizer": "adamw",
        "weight_decay": 0.01,
        "max_grad_norm": None,
        "batch_size": batch,
        "num_steps": steps,
        "shuffle": False,
        "eval_every": max(1, math.ceil(int(args.eval_interval) / batch)) if eval_on else 0,
        "eval_greedy": False,
        "eval_num_samples": 1,
        "eval_limit": int(args.eval_num_samples) if eval_on else None,
        "log_samples": 0,
        "reward_curve": False,
        "kl_coef": float(args.reference_kl_coef) if args.reference_kl_enabled else 0.0,
    }


def wandb_disabled() -> bool:
    """Whether the environment turns Weights & Biases off (``WANDB_MODE=disabled`` or
    ``WANDB_DISABLED=true``): a ``wandb_config`` is then ignored, as wandb itself would."""
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    flag = os.environ.get("WANDB_DISABLED", "").strip().lower()
    return mode == "disabled" or flag in ("1", "true", "yes")


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise ImportError(
            "wandb_config was given but wandb is not installed; pip install "
            "'comlrl-algos[wandb]' (WANDB_MODE=offline logs without a network or login), set "
            "WANDB_MODE=disabled to ignore wandb_config, or pass wandb_config=None."
        ) from None
    return wandb


class CompatTrainer(AgentTasks143):
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
        if self.wandb_config is not None and wandb_disabled():
            self.wandb_config = None  # WANDB_MODE=disabled: no run, no import, no network
        if self.wandb_config is not None:
            _import_wandb()  # fails here, before any model loads
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.reward_func = reward_func
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
        return [
            HFAgent(m, t, name=f"agent_{i}", prompt_format="raw")
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
        """Replace the models (1.4.3's tests assign ``trainer.agents``)."""
        self._models = list(models)

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
        """Use these optimizers in the 1.4.3 hooks (1.4.3's tests assign them)."""
        self.__dict__["_optimizers_given"] = list(optimizers)

    def _base_run(self) -> Any:
        return self._run

    def _train_step(self) -> dict[str, float]:
        raise NotImplementedError

    def _wandb_log(self, row: Mapping[str, Any]) -> None:
        if self.wandb_config is None:
            return
        if self._wandb_run is None:
            wandb = _import_wandb()
            cfg = self.wandb_config
            run_config = {"algorithm": self.algorithm_name, **dataclasses.asdict(self.args)}
            if isinstance(cfg.get("config_sections"), dict):
                run_config.update(cfg["config_sections"])
            init = {
                "project": cfg.get("project"),
                "entity": cfg.get("entity"),
                "name": cfg.get("name") or cfg.get("run_name"),
                "config": run_config,
            }
            for key in ("dir", "tags", "id", "resume"):
                if key in cfg:
                    init[key] = cfg[key]
            self._wandb_run = wandb.init(**init)
        numbers = {k: v for k, v in row.items() if isinstance(v, (int, float))}
        self._wandb_run.log(numbers, step=self.env_step)

    def train(self, **kwargs: Any) -> list[dict[str, float]]:
        """Train for ``num_train_epochs`` passes over ``train_dataset``.

        One optimizer step per ``train_batch_size`` examples (each with its whole rollout
        tree); evaluation (when ``eval_dataset`` is given) before the first step and every
        ``eval_interval`` examples. Returns the per-step metric rows (also logged to W&B
        with ``wandb_config``).

        Raises:
            UnsupportedFieldError: CoMLRL's checkpoint arguments (``resume_from_checkpoint``,
                ``checkpoint_dir``, ...): use :meth:`save_model`, or ``comlrl.algos``'
                resumable checkpoints.
        """
        if kwargs:
            raise UnsupportedFieldError(
                f"train({', '.join(f'{k}=...' for k in kwargs)}) is not supported by "
                "comlrl.trainers (no CoMLRL-format checkpoints); call train() and then "
                "save_model(dir), or use comlrl.algos.MultiAgentTrainer for resumable runs."
            )
        from tqdm.auto import tqdm

        cfg = self.config
        run = self._base_run()
        eval_every = int(getattr(self, "_eval_every", getattr(cfg, "eval_every", 0)))
        history: list[dict[str, float]] = []
        show = bool(getattr(cfg, "progress", self._verbose()))
        bar = tqdm(
            total=cfg.num_steps, initial=run.step, disable=not show, desc=self.algorithm_name
        )
        try:
            for _ in range(run.step, cfg.num_steps):
                if eval_every and run.step % eval_every == 0:
                    self.evaluate()
                row = self._train_step()
                self.env_step += cfg.batch_size
                history.append(row)
                self._wandb_log(row)
                bar.update(1)
                bar.set_postfix(reward=f"{row.get('reward_mean', float('nan')):.3f}")
        finally:
            bar.close()
        return history

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """CoMLRL 1.4.3's evaluation: one sampled joint action per turn on the first
        ``num_eval_samples`` (default ``args.eval_num_samples``) evaluation examples.

        Returns ``eval/turn_<t>/reward_mean`` and ``eval/turn_<t>/expected_return`` (the
        undiscounted reward sum from turn ``t`` on; turns that were cut by early
        termination count 0), plus ``eval/<key>`` for what ``eval_aggregator`` returns
        from ``eval_logger``'s per-example metrics (when both are given). Empty without
        ``eval_dataset``.
        """
        if self._eval_rows is None:
            return {}
        from comlrl.algos.rollout import evaluate as evaluation
        from comlrl.core import SamplingParams

        n = int(self.args.eval_num_samples if num_eval_samples is None else num_eval_samples)
        rows = self._eval_rows[:n]
        if not rows:
            return {}
        run, cfg = self._base_run(), self.config
        params = SamplingParams(1, cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.top_k)
        env = run.env
        # MARLHF trains on a learned reward and reports the task's
        if self.eval_reward is not None:
            env = copy.copy(env)
            env.reward = self.eval_reward
        _, rollouts = evaluation.evaluate(
            run.agents, env, rows, params, run.tree, batch_size=cfg.batch_size, seed=cfg.seed
        )
        turns = int(self.args.num_turns)
        # per example: per turn its (single) joint action's texts and reward
        completions: list[list[list[str]]] = [[[] for _ in rows] for _ in range(self.num_agents)]
        rewards: list[list[float]] = [[] for _ in rows]
        offset = 0
        for ro in rollouts:
            for turn in ro.turns:
                for node in range(turn.num_nodes):
                    ex = offset + int(turn.example_index[node])
                    rewards[ex].append(float(turn.rewards[node, 0]))
                    k = turn.joint_index[0]
                    for a in range(self.num_agents):
                        completions[a][ex].append(turn.agents[a].completions[node][int(k[a])].text)
            offset += len(ro.examples)
        out: dict[str, float] = {}
        for t in range(turns):
            at_t = [r[t] if t < len(r) else 0.0 for r in rewards]
            out[f"eval/turn_{t + 1}/reward_mean"] = sum(at_t) / len(at_t)
            out[f"eval/turn_{t + 1}/expected_return"] = sum(sum(r[t:]) for r in rewards) / len(
                rewards
            )
        logger, aggregator = (
            getattr(self, "eval_logger", None),
            getattr(self, "eval_aggregator", None),
        )
        if logger is not None and aggregator is not None:
            detailed = logger(
                agent_completions_turns=self._eval_role_completions(completions, rows),
                batch_items=rows,
                prompts=[r.get("prompt", "") for r in rows],
            )
            for key, value in aggregator(detailed, num_turns=turns).items():
                out[f"eval/{key}"] = value
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
        from comlrl.algos.training.steps import save_agent_checkpoint

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
