"""Validated training configuration (pydantic), YAML loading and ``key=value`` overrides.

Every field is checked before any model is loaded, so a bad config fails in a second with
an error naming the field, the bad value and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from comlrl.algos.models.loading import DEFAULT_MODEL
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "TrainConfig",
    "TaskConfig",
    "VLLMConfig",
    "LoraSettings",
    "ConfigError",
    "load_config",
    "load_config_data",
    "apply_overrides",
]


class ConfigError(ValueError):
    """The training configuration is invalid; the message lists every bad field."""


class TaskConfig(BaseModel):
    """Which task suite to train on.

    Attributes:
        name: registered task name (entry point group ``comlrl.tasks``), e.g.
            ``coop_story`` (the default) or ``coop_humaneval``; ``comlrl tasks`` lists them
            with their options.
        split: dataset split passed to ``Task.load``.
        kwargs: keyword arguments for the task's constructor (e.g. ``path`` for a local
            data file, ``limit``).
        remote_workers: ``"host:port"`` addresses of reward workers serving this task
            (``python -m comlrl.envs.remote serve --task NAME ...``); empty: the reward runs
            in this process. Data, prompts and feedback stay local either way.
        remote_timeout_s: seconds a reward worker may stay silent on a request before its
            joint actions are retried on another worker.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = "coop_story"
    split: str = "train"
    kwargs: dict[str, Any] = Field(default_factory=dict)
    remote_workers: list[str] = Field(default_factory=list)
    remote_timeout_s: float = Field(300.0, gt=0)

    @field_validator("remote_workers")
    @classmethod
    def _host_port(cls, v: list[str]) -> list[str]:
        for spec in v:
            host, _, port = spec.strip().removeprefix("http://").rstrip("/").rpartition(":")
            if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ValueError(
                    f"reward worker address {spec!r} is not 'host:port' with a port in "
                    "1..65535, e.g. 'node7:8470'"
                )
        if len(set(v)) != len(v):
            raise ValueError(f"remote_workers lists a worker twice: {v!r}; list each once")
        return v


class VLLMConfig(BaseModel):
    """Settings of the vLLM generation backend (``generation_backend: vllm``).

    Attributes:
        gpu_memory_utilization: fraction of each GPU's memory one agent's colocated
            engine may take (weights, activations, KV cache), in ``(0, 1]``; the
            training model, its gradients and optimizer state need the rest.
        behaviour_logprobs: ``engine``: the engine's log-prob of each sampled token
            (the full tempered softmax's, as the update computes); with ``clip_ratio``
            set, the PPO ratio against them corrects the engine/trainer numerics. Under
            top-p < 1 or top-k > 0 the engine only has the truncated distribution's, so
            the training model's are used there. ``recompute``: the training model's
            own log-probs always (one more forward per batch).
        engine_kwargs: extra ``vllm.LLM`` arguments (e.g. ``max_model_len``,
            ``enforce_eager``, ``model`` to name the checkpoint folder).
    """

    model_config = ConfigDict(extra="forbid")

    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    behaviour_logprobs: Literal["engine", "recompute"] = "engine"
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)


class LoraSettings(BaseModel):
    """Agents as LoRA adapters on a frozen base model (``lora:`` section; extra
    ``comlrl-algos[lora]``, which installs ``peft``).

    LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", Eq. 3):
    each targeted weight ``W [out, in]`` becomes ``W + (alpha / r) * B A`` with
    ``A [r, in]``, ``B [out, r]`` trained and ``W`` frozen; ``B`` starts at zero, so every
    agent starts as its base model.

    Attributes:
        r: rank of each adapter.
        alpha: scale numerator; the update is scaled by ``alpha / r``.
        dropout: dropout on the adapter's input, in ``[0, 1)``. The policy-gradient and
            DPO updates run in eval mode (the mode completions are sampled in), where it
            is off; it acts in SFT and reward-model training.
        target_modules: names (suffixes) of the linear layers that get adapters, or
            ``"all-linear"`` (every linear layer but the LM head).
        shared_base: ``true``: one frozen base in memory for all agents, one named adapter
            per agent on it (memory about one base + ``A`` adapters); needs one model for
            all agents and all agents on one device. ``false``: each agent gets its own
            base (``A`` bases; agents may then differ in model and device).
        merge_adapters: checkpoints also hold each agent's merged weights
            (``W + (alpha / r) B A``) in ``agent_<i>/merged/``, loadable without peft.
    """

    model_config = ConfigDict(extra="forbid")

    r: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    shared_base: bool = True
    merge_adapters: bool = False

    @field_validator("target_modules")
    @classmethod
    def _targets_not_empty(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, list) and (not v or any(not isinstance(m, str) or not m for m in v)):
            raise ValueError(
                f"target_modules must name at least one module (e.g. [q_proj, v_proj]) or be "
                f"'all-linear', got {v!r}"
            )
        return v


class TrainConfig(BaseModel):
    """Hyper-parameters of a multi-agent RL run (MAGRPO and its sibling estimators).

    Units: ``learning_rate`` per optimizer step; token limits in tokens; ``num_steps`` in
    optimizer steps (one step = one batch of ``batch_size`` prompts, ``G`` completions
    each, for every agent).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # --- agents -------------------------------------------------------------------
    models: list[str] = Field(
        default_factory=lambda: [DEFAULT_MODEL],
        description="One model per agent, or one model for all agents "
        f"(HF id, local path, or {DEFAULT_MODEL!r}).",
    )
    num_agents: int = Field(2, ge=1, le=16)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    prompt_format: Literal["auto", "chat", "raw"] = Field(
        "auto",
        description="chat: apply the tokenizer's chat template to the task's prompt messages "
        "(instruct models); raw: feed the prompt text (base models); auto: chat when the "
        "tokenizer has a chat template.",
    )
    device: str = "auto"
    trust_remote_code: bool = False
    agent_devices: list[str] | None = Field(
        None,
        description="One device per agent (e.g. [cuda:0, cuda:1]): agent i's model, "
        "its batches and its update live on device i (model parallel over agents). None: "
        "every agent on `device`.",
    )
    reference_devices: list[str] | None = Field(
        None,
        description="One device per agent for the KL reference copies (kl_coef > 0, "
        "no LoRA); None: each beside its agent.",
    )
    lora: LoraSettings | None = Field(
        None,
        description="Train LoRA adapters on a frozen base instead of whole models "
        "(pip install 'comlrl-algos[lora]'); None: full fine-tuning.",
    )
    # --- task ---------------------------------------------------------------------
    task: TaskConfig = Field(default_factory=TaskConfig)
    # --- sampling -----------------------------------------------------------------
    num_generations: int = Field(4, ge=1, description="G, completions per prompt per agent.")
    max_new_tokens: int = Field(48, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    joint_mode: Literal["align", "cross"] = "align"
    generation_backend: Literal["native", "vllm"] = Field(
        "native",
        description="native: CoMLRL's sampler on the training model; vllm: a "
        "colocated vLLM engine per agent, weights pushed after every update (pip install "
        "'comlrl-algos[vllm]', CUDA only; settings in the vllm section).",
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    # --- multi-turn ---------------------------------------------------------------
    num_turns: int = Field(
        1,
        ge=1,
        description="T, the most turns per episode; turns after the first see the "
        "task's feedback (Task.feedback) or the prompts of a transition callback.",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount of later turns in the returns.")
    early_termination_threshold: float | None = Field(
        None,
        description="End a joint action's episode when its reward is above this "
        "(termination_scope=joint_action), or stop expanding a node whose mean reward is above "
        "it (node, CoMLRL 1.4.3's rule). None: only Feedback.done and num_turns end episodes.",
    )
    termination_scope: Literal["joint_action", "node"] = "joint_action"
    max_branches: int | None = Field(
        None,
        ge=1,
        description="Expand at most this many joint actions per node (None: all, "
        "K**(T-1) leaves per example).",
    )
    branch_select: Literal["top", "random"] = Field(
        "top", description="Which joint actions max_branches keeps: highest reward, or random."
    )
    # --- estimator and loss ------------------------------------------------------
    estimator: str = Field("grpo", description="reinforce | grpo | rloo | remax (or MA* names).")
    advantage_scale: Literal["auto", "none", "group", "batch"] = Field(
        "auto",
        description="Divide advantages by a std of the returns: auto = the "
        "estimator's own convention (grpo: group; rloo, remax, reinforce: none).",
    )
    advantage_eps: float = Field(1e-6, gt=0)
    loss_reduction: Literal["seq_mean_token_mean", "token_mean", "seq_sum"] = "seq_mean_token_mean"
    clip_ratio: float | None = Field(None, gt=0, description="PPO clip epsilon; None = no clip.")
    num_iterations: int = Field(1, ge=1, description="Updates per batch (>1 uses the clip).")
    kl_coef: float = Field(0.0, ge=0)
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="Reference KL as a loss term: k3 (gradient of KL(ref || policy), GRPO's) "
        "or k2 (gradient of KL(policy || ref)); k1 has zero expected gradient as a loss and "
        "is refused with kl_coef > 0 (Schulman 2020, Approximating KL Divergence).",
    )
    # --- optimisation -------------------------------------------------------------
    learning_rate: float = Field(
        1e-3,
        gt=0,
        description="1e-3 suits the built-in 260K-parameter stories260k with "
        "RAdam; pretrained LLMs of 0.5B+ parameters want about 1e-6 to 1e-5.",
    )
    optimizer: Literal["radam", "adamw", "sgd"] = Field(
        "radam",
        description="radam (default): Adam with the variance of its adaptive step "
        "rectified in early steps (Liu et al. 2020), which needs no warm-up and keeps small "
        "batches at high learning rates from collapsing; adamw: plain AdamW; sgd: no momentum.",
    )
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    batch_size: int = Field(4, ge=1, description="Prompts per step.")
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="Sequences per forward/backward (rounded down to whole "
        "groups of G); None = all at once.",
    )
    parallel_agents: bool = Field(
        True,
        description="Sample, forward and update the agents concurrently (one thread "
        "each, intra-op threads shared out) when that can help: CPU with at least one "
        "intra-op thread per agent, or one GPU per agent. Agents that share one model object "
        "are never updated concurrently.",
    )
    shared_prefix: bool = Field(
        True,
        description="Run each prompt through the model once per update and share its "
        "KV cache among its G completions (same gradient, less work).",
    )
    data_parallel: Literal["ddp", "fsdp2", "none"] = Field(
        "ddp",
        description="Only under an initialised torch.distributed process group "
        "(torchrun): how each agent's gradient is averaged over the ranks. ddp: "
        "DistributedDataParallel (bucketed all-reduce overlapped with the last backward); "
        "none: no wrapper, the gradient is all-reduced once after the local backward passes; "
        "fsdp2: torch.distributed.fsdp.fully_shard per decoder layer (parameters, gradients "
        "and optimizer state sharded; weights gathered for each rollout, checkpoints gathered "
        "to rank 0). Either way the update equals one process's "
        "update over the global batch (comlrl.algos.models.distributed).",
    )
    sampling_rng: Literal["agent", "prompt"] = Field(
        "agent",
        description="agent: each agent draws from its own seeded stream (per rank "
        "under torchrun: seeded from seed and rank). prompt: every prompt's completions are "
        "drawn from a stream keyed by (seed, step, prompt's place in the global batch, turn, "
        "node, agent), so the rollout does not depend on the number of ranks (native "
        "sampling backend only).",
    )
    fused_logprobs: bool = Field(
        True,
        description="Compute the update's log-probs from the last hidden states and "
        "the lm_head weight in chunks of tokens, never materialising the [tokens, vocab] "
        "logits (same values and gradient, far less memory at large vocabularies such as "
        "Qwen's 151,936). Models it cannot handle exactly (lm_head bias, logit soft-capping "
        "or scaling, ...) fall back to the materialised logits with a warning.",
    )
    num_steps: int = Field(160, ge=1)
    seed: int = 0
    shuffle: bool = Field(
        True, description="Shuffle the dataset every epoch; False = dataset order."
    )
    # --- outputs ------------------------------------------------------------------
    output_dir: str = "runs/default"
    save_every: int = Field(0, ge=0, description="Checkpoint every N steps; 0 = only at the end.")
    log_samples: int = Field(
        4, ge=0, description="Joint actions per step written to samples.jsonl."
    )
    progress: bool = True
    # --- evaluation and checkpoint retention (run lifecycle) -----------------------
    eval_every: int = Field(
        0,
        ge=0,
        description="Evaluate every N steps on eval_split without updating (rows in "
        "eval.jsonl); 0 = off.",
    )
    eval_on_start: bool = Field(
        False,
        description="Also evaluate before the first step (an eval.jsonl row with step 0): "
        "the baseline the later rows compare with. Needs eval_every > 0 (asking for it "
        "with eval_every=0 is an error).",
    )
    eval_split: str = Field(
        "test",
        description="Task split to evaluate on (coop_humaneval's train and test are disjoint).",
    )
    eval_greedy: bool = Field(
        True,
        description="Greedy (top_k=1) evaluation; false = sampled "
        "with the training temperature/top_p/top_k.",
    )
    eval_num_samples: int = Field(
        1, ge=1, description="k, joint actions per problem for pass@k (sampled evaluation)."
    )
    eval_limit: int | None = Field(None, ge=1, description="Evaluate on the first N problems only.")
    keep_last: int | None = Field(
        None, ge=1, description="Keep the newest N step checkpoints (None = all); final/ stays."
    )
    # --- reporting (comlrl.algos.training.reporting) -----------------------------------------
    report_to: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(
        ["jsonl"],
        description="Where metrics go: jsonl "
        "(metrics.jsonl, always written), tensorboard (output_dir/tensorboard; pip install "
        "'comlrl-algos[tensorboard]'), wandb (pip install 'comlrl-algos[wandb]'; "
        "WANDB_MODE=offline works without network).",
    )
    wandb_project: str = Field("comlrl", description="W&B project name (report_to wandb).")
    reward_curve: bool = Field(
        True,
        description="Write output_dir/reward_curve.png at the end of the run "
        "(needs matplotlib: pip install 'comlrl-algos[plot]'; skipped with a notice without).",
    )

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [part.strip() for part in v.split(",") if part.strip()]
        if isinstance(v, list) and "jsonl" not in v:
            v = ["jsonl", *v]
        return v

    @field_validator("models")
    @classmethod
    def _models_not_empty(cls, v: list[str]) -> list[str]:
        if not v or any(not isinstance(m, str) or not m for m in v):
            raise ValueError(f"models must be a non-empty list of model names/paths, got {v!r}")
        return v

    @field_validator("estimator")
    @classmethod
    def _known_estimator(cls, v: str) -> str:
        from comlrl.algos.functional.advantages import ESTIMATORS

        if v.lower() not in ESTIMATORS:
            raise ValueError(f"unknown estimator {v!r}; choose one of {sorted(ESTIMATORS)}")
        return v.lower()

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
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
        if self.kl_coef > 0 and self.kl_estimator == "k1":
            from comlrl.algos.functional.losses import k1_loss_message

            raise ValueError(k1_loss_message(self.kl_coef))
        if self.num_iterations > 1 and self.clip_ratio is None:
            raise ValueError(
                f"num_iterations={self.num_iterations} reuses each batch, which needs the PPO "
                "clip: set clip_ratio (e.g. 0.2)."
            )
        return self

    @model_validator(mode="after")
    def _placement_and_lora(self) -> TrainConfig:
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
    def _generation_backend_available(self) -> TrainConfig:
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
        ``vllm_options``) and the ``prompt_format``."""
        opts: dict[str, Any] = {"prompt_format": self.prompt_format}
        if self.generation_backend == "vllm":
            return {**opts, "backend": "vllm", "vllm_options": self.vllm.model_dump()}
        return {**opts, "backend": self.generation_backend}

    @model_validator(mode="after")
    def _eval_consistent(self) -> TrainConfig:
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

    def model_for(self, agent: int) -> str:
        """Model name or path of agent ``agent`` (0-based)."""
        return self.models[0] if len(self.models) == 1 else self.models[agent]


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(config)"
        value = err.get("input")
        shown = repr(value) if not isinstance(value, dict) else "{...}"
        unknown = err["type"] == "extra_forbidden"
        msg = "unknown field" if unknown else err["msg"]
        hint = _did_you_mean(err["loc"]) if unknown else ""
        lines.append(f"  - {loc}: {msg} (got {shown}){hint}")
    return "\n".join(lines)


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """``"; did you mean 'x'?"`` for an unknown field, from the fields of its section."""
    import difflib

    model: type[BaseModel] = TrainConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        model = annotation
    names = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), names, n=3, cutoff=0.6)
    if close:
        return "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "; `comlrl train --print-config` lists the fields"


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
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("invalid training config:\n" + _format_errors(exc)) from None


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
    its ``algo`` key: :func:`comlrl.algos.cli.registry.build_recipe_config`).

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
