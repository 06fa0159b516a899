"""Validated training configuration (pydantic), YAML loading and ``key=value`` overrides.

Every field is checked before any model is loaded, so a bad config fails in a second with
an error naming the field, the bad value and what is allowed
(:mod:`comlrl.algos.training.config.errors` words the messages).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import yaml
from comlrl.algos.training.config.errors import (
    FORMATS_ERRORS,
    format_errors,
    unknown_fields_message,
)
from comlrl.algos.training.config.model_defaults import ModelDefaults, choose_defaults
from comlrl.algos.training.config.sections import (
    AgentsSection,
    GroupBaselineSection,
    LifecycleSection,
    OptimisationSection,
    OutputsSection,
    PolicyLossSection,
    ReportingSection,
    SamplingSection,
    TaskSection,
    TurnsSection,
)
from pydantic import (
    ConfigDict,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

__all__ = [
    "RLConfig",
    "TrainConfig",
    "ConfigError",
    "load_config",
    "load_config_data",
    "apply_overrides",
]


class ConfigError(ValueError):
    """The training configuration is invalid; the message lists every bad field."""


class RLConfig(
    ReportingSection,
    LifecycleSection,
    OutputsSection,
    OptimisationSection,
    PolicyLossSection,
    TurnsSection,
    SamplingSection,
    TaskSection,
    AgentsSection,
):
    """What every multi-agent RL recipe reads: agents, task, sampling, turns, the policy loss,
    optimisation, outputs, evaluation, reporting. The recipes' own configs add their fields:
    :class:`TrainConfig` (group baselines) and
    :class:`~comlrl.algos.recipes.actor_critic.config.ActorCriticConfig` (critics).

    Units: ``learning_rate`` per optimizer step; token limits in tokens; ``num_steps`` in
    optimizer steps (one step = one batch of ``batch_size`` prompts, ``G`` completions
    each, for every agent).

    The fields come in sections, one model each (:mod:`comlrl.algos.training.config.sections`):
    agents, task, sampling, turns, estimator and loss, optimisation, outputs, evaluation
    and checkpoint retention, reporting. The keys stay flat (``learning_rate=...``); the
    checks here are those that span sections.

    Defaults by model (:mod:`comlrl.algos.training.config.model_defaults`): with built-in models
    (``builtin:*``) the field defaults apply; with any other model the fields of the
    pretrained-LLM table that are not given (``optimizer``, ``learning_rate``,
    ``loss_reduction``, ``num_generations``, ``max_new_tokens``) take its values instead.
    :meth:`model_defaults` says which set applied and what it filled in.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    _model_defaults: ModelDefaults | None = PrivateAttr(default=None)
    #: fields of other recipes' configs that this one does not have, with why (the unknown-field
    #: error says so instead of a did-you-mean)
    foreign_fields: ClassVar[dict[str, str]] = {}

    @model_validator(mode="wrap")
    @classmethod
    def _defaults_by_model(
        cls, data: Any, handler: ModelWrapValidatorHandler[Any], info: ValidationInfo
    ) -> Any:
        # a mapping (construction, YAML, overrides) gets its models' defaults; an assignment
        # (validate_assignment hands in the model) keeps what the config has
        if not isinstance(data, dict):
            return handler(data)
        unknown = unknown_fields_message(cls, data)
        if unknown is not None and not (info.context or {}).get(FORMATS_ERRORS):
            # TrainConfig(...) in Python: pydantic's own says only "Extra inputs are not
            # permitted"; build_config and the command line format their own, with hints
            raise ValueError(unknown)
        default_models = cls.model_fields["models"].get_default(call_default_factory=True)
        filled, chosen = choose_defaults(data, default_models)
        config = handler(filled)
        if isinstance(config, RLConfig):
            config._model_defaults = chosen
        return config

    def model_defaults(self) -> ModelDefaults:
        """Which set of defaults this config got (built-in or pretrained), why, and the
        fields it filled in (:mod:`comlrl.algos.training.config.model_defaults`)."""
        if self._model_defaults is None:  # built by model_construct: judge by the models
            _, chosen = choose_defaults(self.model_dump(), self.models)
            return ModelDefaults(chosen.kind, chosen.reason)
        return self._model_defaults

    @model_validator(mode="after")
    def _consistent(self) -> RLConfig:
        if len(self.models) not in (1, self.num_agents):
            raise ValueError(
                f"models lists {len(self.models)} models for num_agents={self.num_agents}; "
                "give one model for all agents or exactly one per agent."
            )
        if self.joint_mode == "cross" and self.num_generations**self.num_agents > 4096:
            raise ValueError(
                f"joint_mode='cross' with G={self.num_generations} and {self.num_agents} agents "
                f"makes {self.num_generations**self.num_agents} joint actions per prompt; "
                "use joint_mode='align' or a smaller G."
            )
        if self.max_branches is not None and self.num_turns == 1:
            raise ValueError(
                f"max_branches={self.max_branches} limits multi-turn branching but num_turns=1; "
                "set num_turns > 1 or leave max_branches unset."
            )
        if self.kl_coef > 0 and self.kl_estimator == "k1" and self.kl_mode == "loss":
            from comlrl.estimators.kl import k1_loss_message

            raise ValueError(k1_loss_message(self.kl_coef))
        if self.retempered_update and self.tis in ("token", "sequence"):
            raise ValueError(
                f"tis={self.tis!r} with update_temperature={self.update_temperature} and "
                f"temperature={self.temperature}: the truncated weight compares the trainer's "
                "log-probs with the sampler's at one temperature; set tis=off (or auto), or "
                "leave update_temperature unset."
            )
        if self.num_iterations > 1 and self.clip_ratio is None:
            raise ValueError(
                f"num_iterations={self.num_iterations} reuses each batch, which needs the PPO "
                "clip: set clip_ratio (e.g. 0.2)."
            )
        return self

    @model_validator(mode="after")
    def _placement_and_lora(self) -> RLConfig:
        from comlrl.algos.models.devices import validate_devices

        if self.agent_devices is not None:
            if self.device != "auto":
                raise ValueError(
                    f"both device={self.device!r} and agent_devices={self.agent_devices!r} are "
                    "set; give agent_devices alone (or device alone for one device)."
                )
            validate_devices(self.agent_devices, self.num_agents, "agent_devices")
        if self.reference_devices is not None:
            validate_devices(self.reference_devices, self.num_agents, "reference_devices")
            if self.kl_coef == 0:
                raise ValueError(
                    f"reference_devices={self.reference_devices!r} but kl_coef=0, so there is "
                    "no reference model; set kl_coef > 0 or drop reference_devices."
                )
            if self.lora is not None:
                raise ValueError(
                    "reference_devices is set but a LoRA agent's reference is its own base with "
                    "the adapter disabled (no copy to place); drop reference_devices."
                )
        if self.lora is None:
            return self
        import importlib.util

        if importlib.util.find_spec("peft") is None:
            raise ValueError(
                "lora is set but peft is not installed; install it with "
                "pip install 'comlrl-algos[lora]' or remove the lora section."
            )
        if self.generation_backend == "vllm":
            raise ValueError(
                "lora with generation_backend='vllm' is not supported (the engine would need "
                "the adapters pushed); set generation_backend=native."
            )
        if self.lora.shared_base:
            if len(set(self.models)) > 1:
                raise ValueError(
                    f"lora.shared_base=true needs one base model for all agents, got "
                    f"models={self.models!r}; give one model or set lora.shared_base=false."
                )
            if self.agent_devices is not None and len(set(self.agent_devices)) > 1:
                raise ValueError(
                    f"lora.shared_base=true keeps one base on one device but agent_devices="
                    f"{self.agent_devices!r}; use one device or set lora.shared_base=false."
                )
        return self

    @model_validator(mode="after")
    def _generation_backend_available(self) -> RLConfig:
        if self.generation_backend != "vllm":
            return self
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ValueError(
                "generation_backend='vllm' but vLLM is not installed; install it with "
                "pip install 'comlrl-algos[vllm]' (CUDA GPU needed) or set "
                "generation_backend=native."
            )
        import torch

        if self.device == "cpu" or not torch.cuda.is_available():
            raise ValueError(
                f"generation_backend='vllm' needs a CUDA GPU (device={self.device!r}, CUDA "
                f"available: {torch.cuda.is_available()}); set generation_backend=native."
            )
        return self

    def generation_options(self) -> dict[str, Any]:
        """``HFAgent`` keyword arguments for the generation backend (``backend``,
        ``vllm_options``)."""
        opts: dict[str, Any] = {"prompt_format": self.prompt_format}
        if self.generation_backend == "vllm":
            return {**opts, "backend": "vllm", "vllm_options": self.vllm.model_dump()}
        return {**opts, "backend": self.generation_backend}

    @model_validator(mode="after")
    def _eval_consistent(self) -> RLConfig:
        if self.eval_greedy and self.eval_num_samples > 1:
            raise ValueError(
                f"eval_num_samples={self.eval_num_samples} with eval_greedy=true repeats one "
                "completion; set eval_greedy=false for pass@k with k > 1, or eval_num_samples=1."
            )
        if self.eval_on_start and not self.eval_every and "eval_on_start" in self.model_fields_set:
            raise ValueError(
                "eval_on_start=true but eval_every=0 (evaluation is off); set eval_every=N "
                "to evaluate every N steps, or drop eval_on_start."
            )
        return self

    @property
    def retempered_update(self) -> bool:
        """Whether the update's log-probs are at another temperature than the sampling one
        (``update_temperature`` set and not ``temperature``)."""
        return self.update_temperature is not None and self.update_temperature != self.temperature

    def model_for(self, agent: int) -> str:
        """Model name or path of agent ``agent`` (0-based)."""
        return self.models[0] if len(self.models) == 1 else self.models[agent]

    @property
    def baseline_label(self) -> str:
        """What the advantages are measured against, for titles (an estimator, a critic)."""
        raise NotImplementedError(f"{type(self).__name__} names no baseline")


class TrainConfig(RLConfig, GroupBaselineSection):
    """Hyper-parameters of a group-baseline multi-agent RL run (MAGRPO and its sibling
    estimators): :class:`RLConfig` plus the estimator, advantage scaling, node-chunk
    schedule and ``role_format``
    (:class:`~comlrl.algos.training.config.sections.GroupBaselineSection`)."""

    @model_validator(mode="after")
    def _group_baseline_consistent(self) -> TrainConfig:
        if self.role_format is not None and len(self.models) != 1:
            raise ValueError(
                f"role_format={self.role_format!r} trains one joint policy but models lists "
                f"{len(self.models)}: {self.models!r}; give one model"
            )
        if self.role_format is not None and self.num_turns != 1:
            raise ValueError(
                f"role_format={self.role_format!r} (one joint policy) is single-turn; got "
                f"num_turns={self.num_turns}, set num_turns=1"
            )
        if self.update_chunk_split_turns and self.update_chunk_nodes is None:
            raise ValueError(
                "update_chunk_split_turns=True splits the chunks of update_chunk_nodes, which "
                "is unset; set update_chunk_nodes (e.g. 2) or drop update_chunk_split_turns."
            )
        if self.advantage_scale == "group" and _has_no_baseline(self.estimator):
            raise ValueError(
                f"estimator={self.estimator!r} with advantage_scale='group': this estimator "
                "has no baseline, so a group of equal returns (std 0) gets r / advantage_eps "
                f"= r / {self.advantage_eps:g}, a step of unbounded size. Use "
                "advantage_scale=none (its default, auto) or a baselined estimator "
                "(estimator=grpo, rloo, remax)."
            )
        if self.update_chunk_nodes is not None and self.clip_ratio is None:
            raise ValueError(
                f"update_chunk_nodes={self.update_chunk_nodes} updates later chunks of nodes "
                "after earlier optimizer steps, with their importance ratio to the sampling "
                "policy, which is unbounded without the PPO clip: set clip_ratio (e.g. 0.2)."
            )
        return self

    @property
    def baseline_label(self) -> str:
        """The estimator's name."""
        return self.estimator


def _has_no_baseline(estimator: str) -> bool:
    """Whether the registered estimator subtracts nothing (REINFORCE's ``A = r``)."""
    from comlrl.estimators.registry import resolve_estimator

    return resolve_estimator(estimator).baseline == "none"


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    cur = data
    for part in parts[:-1]:
        nxt = cur.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {key!r}: {part!r} is not a section")
        cur = nxt
    cur[parts[-1]] = value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` overrides (dotted keys for sections, YAML-parsed values).

    Example: ``["num_generations=8", "task.kwargs.limit=16", "models=[a,b]"]``.

    Raises:
        ConfigError: for an override without ``=``.
    """
    out = dict(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"override {item!r} is not of the form key=value (e.g. num_generations=8)"
            )
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"override {item!r}: the value is not valid YAML ({_yaml_problem(exc)}); quote "
                "it, e.g. key='...', or write a list as [a, b]"
            ) from None
        _set_dotted(out, key.strip(), value)
    return out


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's problem and position, one line (``line 3, column 5: ...``)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return str(problem)


def build_config(data: dict[str, Any]) -> TrainConfig:
    """Validate a config mapping into a :class:`TrainConfig`.

    Raises:
        ConfigError: listing every invalid or unknown field with its value.
    """
    try:
        return TrainConfig.model_validate(data, context={FORMATS_ERRORS: True})
    except ValidationError as exc:
        raise ConfigError("invalid training config:\n" + format_errors(exc, TrainConfig)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML config (or the defaults when ``path`` is None) and apply overrides.

    Raises:
        ConfigError: when the file is missing, is not valid YAML or not a YAML mapping, or
            fails validation.
    """
    return build_config(load_config_data(path, overrides))


def load_config_data(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> dict[str, Any]:
    """The mapping of a YAML config file (``{}`` when ``path`` is None) with ``key=value``
    overrides applied, not yet validated (the recipe registry picks the config class from
    its ``algo`` key: :func:`comlrl.algos.recipes.registry.build_recipe_config`).

    Raises:
        ConfigError: when the file is missing, is not valid YAML or not a YAML mapping, or
            an override is malformed.
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"config file {str(p)!r} is not valid YAML: {_yaml_problem(exc)}; fix that line "
                "(e.g. a missing ':' or an unclosed bracket or quote)"
            ) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"config file {str(p)!r} must hold a YAML mapping, got {type(loaded).__name__}"
            )
        data = loaded
    return apply_overrides(data, overrides or [])
