"""What the preference and supervised recipes' configs share: a config that validates into
:class:`~comlrl.algos.training.config.rl.ConfigError` (:class:`ValidatedConfig`), the keys of
SFT, DPO and MADPO runs (:class:`PreferenceTrainConfig`: the models, the optimizer, the loop
and the outputs), the optional section of iterative rounds (:class:`IterativeSection`, key
``iterative``) and how an old flat key finds the section it moved into
(:func:`gather_section`, :func:`renamed_key`). Each method's own config lives beside its
recipe (``supervised/config.py``, ``madpo/config.py``, ``marlhf/config.py``)."""

from __future__ import annotations

from typing import Any, Literal

from comlrl.algos.models.loading import DEFAULT_MODEL
from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.config.sections import ReportingSection
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "ValidatedConfig",
    "PreferenceTrainConfig",
    "IterativeSection",
    "gather_section",
    "renamed_key",
]


class ValidatedConfig(BaseModel):
    """A config whose :meth:`build` raises :class:`ConfigError` naming every bad field."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @classmethod
    def build(cls, **kwargs: Any) -> Any:
        """Validate ``kwargs`` into this config; raises :class:`ConfigError` (a
        ``ValueError``) naming every bad field, its value and the rule it broke."""
        try:
            return cls(**kwargs)
        except ValidationError as exc:
            lines = [
                f"{'.'.join(str(x) for x in e['loc']) or '(config)'}: {e['msg']} (got {e.get('input')!r})"
                for e in exc.errors()
            ]
            raise ConfigError(f"invalid {cls.__name__}:\n  " + "\n  ".join(lines)) from None


class PreferenceTrainConfig(ReportingSection, ValidatedConfig):
    """The keys SFT, DPO and MADPO share: the models and how they load, the optimizer, the
    loop, and where the run writes (:class:`~comlrl.algos.training.run.outputs.RunOutputs`
    reads them) and reports.

    Units: ``learning_rate`` per optimizer step, ``num_steps`` in optimizer steps, token
    limits in tokens, ``batch_size`` in rows (SFT, DPO) or prompts (MADPO).
    """

    models: list[str] = Field(
        default_factory=lambda: [DEFAULT_MODEL],
        description=f"Model names or paths (HF id, local path, or {DEFAULT_MODEL!r}).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    prompt_format: Literal["auto", "chat", "raw"] = Field(
        "auto",
        description="chat: the tokenizer's chat template on the task's prompt messages; raw: "
        "the prompt text; auto: chat when the tokenizer has a chat template.",
    )
    trust_remote_code: bool = False
    output_dir: str = Field(
        "runs/default", description="Where metrics.jsonl, config.yaml and final/ go."
    )
    save_every: int = Field(
        0,
        ge=0,
        description="Step checkpoint every N steps and at the last; 0 = only on Ctrl-C, "
        "SIGTERM or when a step fails.",
    )
    keep_last: int | None = Field(
        None, ge=1, description="Keep the newest N step checkpoints (None = all); final/ stays."
    )
    progress: bool = True

    def model_for(self, agent: int) -> str:
        """Model name or path of agent ``agent`` (0-based): the one model, or the agent's."""
        return self.models[0] if len(self.models) == 1 else self.models[agent]

    learning_rate: float = Field(1e-5, gt=0)
    optimizer: Literal["adamw", "radam", "sgd"] = "adamw"
    weight_decay: float = Field(0.0, ge=0)
    num_steps: int = Field(100, ge=1)
    batch_size: int = Field(8, ge=1)
    micro_batch_size: int | None = Field(
        None, ge=1, description="Rows per forward/backward (SFT, DPO); None: the whole batch."
    )
    max_grad_norm: float | None = Field(1.0, gt=0)
    eval_every: int = Field(
        0, ge=0, description="Evaluate every this many steps (0: only at the end)."
    )
    seed: int = 0
    device: str = "auto"


class IterativeSection(ValidatedConfig):
    """The rounds of iterative preference refresh (MADPO-Iter, MARLHF-Iter;
    :mod:`comlrl.algos.recipes.preference.iterative.replay`). A run of ``num_steps`` optimizer
    steps is ``ceil(num_steps / steps_per_round)`` rounds; each round first samples
    ``round_prompts`` prompts' candidates from the current and the comparator policy and
    pairs them, then trains ``steps_per_round`` steps.

    Attributes:
        steps_per_round: optimizer steps per round.
        round_prompts: prompts sampled per round (``None``: ``batch_size * steps_per_round``).
        comparator: ``current`` / ``current_copy`` (the current agents), ``model``
            (frozen ``comparator_models``), ``history`` (the policy
            ``comparator_history_k`` rounds ago) or ``api`` (a model served at
            ``comparator_api_url``); see :mod:`comlrl.algos.recipes.preference.iterative.comparator`.
        comparator_models: ``comparator="model"``: one model for every agent or one per agent.
        comparator_num_candidates: ``K'`` comparator candidates per prompt (``None``: ``K``).
        comparator_history_k: ``comparator="history"``: rounds back (1: the current policy).
        comparator_api_url, comparator_api_format, comparator_api_model,
            comparator_api_key_env: ``comparator="api"``: the endpoint, its request format
            (``generic``, ``openai_chat``, ``anthropic_messages``, ``openai_responses``),
            the served model's name and the environment variable holding the API key
            (:mod:`comlrl.algos.recipes.preference.iterative.api_comparator`).
        pair_selection: order of a prompt's pairs before ``pairs_per_prompt`` cuts:
            ``comparator_reward`` (highest comparator reward first), ``reward_gap``,
            ``random``, ``all``.
        replay_mode: the round's training pairs: ``current`` (this round's), ``nearest_k``
            (a draw from the last ``replay_k`` rounds), ``all_history``, ``lambda_decay``
            (rounds weighted ``(1 - replay_lambda) * replay_lambda**age``).
        replay_k, replay_lambda: for ``nearest_k`` / ``lambda_decay`` only.
        replay_sample_size: pairs drawn per round by the replay modes other than
            ``current`` (``None``: as many as this round generated).
        replay_dir: a folder for every round's pairs (``iteration_XXXX.json``, read back
            when a draw picks that round; :mod:`comlrl.algos.recipes.preference.iterative.replay_shards`);
            ``None`` keeps them in memory.
    """

    steps_per_round: int = Field(4, ge=1)
    round_prompts: int | None = Field(None, ge=1)
    comparator: Literal["current", "current_copy", "model", "history", "api"] = "current"
    comparator_models: list[str] | None = None
    comparator_num_candidates: int | None = Field(None, ge=1)
    comparator_history_k: int = Field(1, ge=1)
    comparator_api_url: str | None = None
    comparator_api_format: Literal[
        "generic", "openai_chat", "anthropic_messages", "openai_responses"
    ] = "generic"
    comparator_api_model: str | None = None
    comparator_api_key_env: str | None = None
    pair_selection: Literal["comparator_reward", "reward_gap", "random", "all"] = (
        "comparator_reward"
    )
    replay_mode: Literal["current", "nearest_k", "all_history", "lambda_decay"] = "current"
    replay_k: int | None = Field(None, ge=1)
    replay_lambda: float | None = Field(None, ge=0, le=1)
    replay_sample_size: int | None = Field(None, ge=1)
    replay_dir: str | None = None

    @model_validator(mode="after")
    def _fields_of_their_modes(self) -> IterativeSection:
        mode = self.replay_mode
        if mode == "nearest_k" and self.replay_k is None:
            raise ValueError("replay_mode='nearest_k' needs replay_k >= 1")
        if mode != "nearest_k" and self.replay_k is not None:
            raise ValueError(f"replay_k={self.replay_k} needs replay_mode='nearest_k'")
        if mode == "lambda_decay" and self.replay_lambda is None:
            raise ValueError("replay_mode='lambda_decay' needs replay_lambda in [0, 1]")
        if mode != "lambda_decay" and self.replay_lambda is not None:
            raise ValueError(f"replay_lambda={self.replay_lambda} needs replay_mode='lambda_decay'")
        if mode == "current" and self.replay_sample_size is not None:
            raise ValueError(
                f"replay_sample_size={self.replay_sample_size} is read by the replay modes "
                "other than 'current'; drop it or pick one"
            )
        if (self.comparator == "model") != (self.comparator_models is not None):
            raise ValueError(
                "comparator='model' needs comparator_models=[NAME] (one, or one per agent), "
                f"and only it reads them (comparator={self.comparator!r}, "
                f"comparator_models={self.comparator_models!r})"
            )
        if (self.comparator == "api") != (self.comparator_api_url is not None):
            raise ValueError(
                "comparator='api' needs comparator_api_url=URL, and only it reads it "
                f"(comparator={self.comparator!r}, comparator_api_url={self.comparator_api_url!r})"
            )
        if self.comparator != "history" and self.comparator_history_k != 1:
            raise ValueError(
                f"comparator_history_k={self.comparator_history_k} needs comparator='history'"
            )
        return self

    def num_rounds(self, num_steps: int) -> int:
        """Rounds of a run of ``num_steps`` steps."""
        return -(-num_steps // self.steps_per_round)


def gather_section(data: Any, section: str, fields: Any, *, also: tuple[str, ...] = ()) -> Any:
    """For a config's ``mode="before"`` validator: top-level keys of ``data`` that are
    fields of the section model ``fields`` (old flat keys, e.g. ``steps_per_round=4`` of the
    iterative rounds) move into ``data[section]`` (``iterative.steps_per_round``). A key in
    ``also`` (a name both the config and the section have, e.g. ``pair_selection``) moves
    only when the section is there and does not set it itself.

    Raises:
        ValueError: a key given flat and in the section with different values.
    """
    if not isinstance(data, dict):
        return data
    moved = [k for k in data if k in fields.model_fields and k not in also]
    present = isinstance(data.get(section), dict) or bool(moved)
    if not present:
        return data
    out = dict(data)
    inner = dict(out.get(section) or {})
    for key in moved:
        value = out.pop(key)
        if key in inner and inner[key] != value:
            raise ValueError(
                f"{key}={value!r} and {section}.{key}={inner[key]!r} disagree; {key} is a key "
                f"of the {section} section now: give {section}.{key} only"
            )
        inner[key] = value
    for key in also:
        if key in out and key not in inner:
            inner[key] = out.pop(key)
    out[section] = inner
    return out


def renamed_key(data: Any, old: str, new: str) -> Any:
    """For a ``mode="before"`` validator: ``old`` (a key's former name) resolves to ``new``.

    Raises:
        ValueError: both are given with different values.
    """
    if not isinstance(data, dict) or old not in data:
        return data
    out = dict(data)
    value = out.pop(old)
    if new in out and out[new] != value:
        raise ValueError(
            f"{old}={value!r} and {new}={out[new]!r} name one setting ({new}); give {new} only"
        )
    out[new] = value
    return out
