"""The sections of :class:`~comlrl.algos.training.config.rl.TrainConfig`, one model per topic,
each with its fields and their checks; ``TrainConfig`` composes them (and checks what spans
sections). The config keys are the fields' names, flat: ``learning_rate=...``, not
``optimisation.learning_rate=...``. The nested settings they hold are defined in
:mod:`comlrl.algos.training.config.task` (the task) and :mod:`comlrl.algos.models.lora`
(LoRA); the vLLM engine's (:class:`VLLMConfig`) is here, beside the sampling section.
"""

from __future__ import annotations

from typing import Any, Literal

from comlrl.algos.models.loading import DEFAULT_MODEL
from comlrl.algos.models.lora import LoraSettings
from comlrl.algos.training.config.task import TaskConfig
from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "VLLMConfig",
    "AgentsSection",
    "TaskSection",
    "SamplingSection",
    "TurnsSection",
    "GroupBaselineSection",
    "PolicyLossSection",
    "OptimisationSection",
    "OutputsSection",
    "LifecycleSection",
    "ReportingSection",
]


class VLLMConfig(BaseModel):
    """Settings of the vLLM generation backend (``generation_backend: vllm``).

    Attributes:
        gpu_memory_utilization: fraction of each GPU's memory one agent's colocated
            engine may take (weights, activations, KV cache), in ``(0, 1]``; the
            training model, its gradients and optimizer state need the rest.
        behaviour_logprobs: ``engine``: the engine's log-prob of each sampled token
            (the full tempered softmax's, as the update computes); their difference to
            the trainer's is logged every step and corrected by truncated importance
            sampling (``tis``, on by default for engine log-probs). Under
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


class AgentsSection(BaseModel):
    """Which models play the agents, how they load (dtype, remote code, LoRA) and
    where they live (devices, reference models)."""

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

    @field_validator("models")
    @classmethod
    def _models_not_empty(cls, v: list[str]) -> list[str]:
        if not v or any(not isinstance(m, str) or not m for m in v):
            raise ValueError(f"models must be a non-empty list of model names/paths, got {v!r}")
        return v


class TaskSection(BaseModel):
    """Which task suite the agents train on (:class:`TaskConfig`: name, split, options,
    remote reward workers)."""

    task: TaskConfig = Field(default_factory=TaskConfig)


class SamplingSection(BaseModel):
    """How each agent samples its ``G`` completions per prompt, how completions form
    joint actions (``align`` or ``cross``), and the generation backend."""

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


class TurnsSection(BaseModel):
    """Multi-turn rollouts: the number of turns, the discount, early termination and
    the branching of the rollout tree."""

    num_turns: int = Field(
        1,
        ge=1,
        description="T, the most turns per episode; turns after the first see the "
        "task's feedback (Task.feedback) or the prompts of a transition callback.",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount of later turns in the returns.")
    hold_terminal_reward: bool = Field(
        True,
        description="An episode that ends before num_turns has its last reward held for "
        "the turns it skips (comlrl.estimators.returns). false: counted once, the return is "
        "the plain (discounted) sum of the rewards earned (CoMLRL 1.4.3).",
    )
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


class PolicyLossSection(BaseModel):
    """The policy loss of every RL recipe: reduction, PPO clip, importance weights,
    reference KL, passes per batch."""

    loss_reduction: Literal["seq_mean_token_mean", "token_mean", "seq_sum"] = "seq_mean_token_mean"
    clip_ratio: float | None = Field(None, gt=0, description="PPO clip epsilon; None = no clip.")
    num_iterations: int = Field(1, ge=1, description="Updates per batch (>1 uses the clip).")
    tis: Literal["auto", "off", "token", "sequence"] = Field(
        "auto",
        description="Truncated importance sampling from the sampler to the trainer (Yao et "
        "al. 2025): each token's policy-gradient term is weighted min(pi_trainer / "
        "pi_behaviour, tis_cap), per token or per sequence. auto: token-level where the "
        "behaviour log-probs come from another engine or dtype (generation_backend=vllm "
        "with engine log-probs, dtype bfloat16/float16), off where they are exact (the "
        "native sampler in float32).",
    )
    tis_cap: float = Field(2.0, ge=1, description="The cap C of tis.")
    importance_level: Literal["token", "sequence"] = Field(
        "token",
        description="The importance ratio of the policy loss: token (PPO's, per token) or "
        "sequence (GSPO, Zheng et al. 2025: one length-normalised ratio per completion, "
        "clipped with clip_ratio; GSPO's ranges are narrow, e.g. 3e-4).",
    )
    kl_coef: float = Field(0.0, ge=0, description="Weight of the reference KL; 0 = none.")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="Reference KL as a loss term: k3 (gradient of KL(ref || policy), GRPO's) "
        "or k2 (gradient of KL(policy || ref)); k1 has zero expected gradient as a loss and "
        "is refused there (Schulman 2020, Approximating KL Divergence). In the reward any "
        "of the three.",
    )
    kl_mode: Literal["loss", "reward"] = Field(
        "loss",
        description="Where the reference KL goes. loss: kl_coef times the per-token "
        "kl_estimator term in the policy loss (GRPO's). reward: kl_coef times each "
        "completion's summed per-token estimate, computed before the update and held fixed, "
        "subtracted from its return before the advantage (PPO-RLHF's, Ziegler et al. 2019; "
        "CoMLRL 1.4.3's reference_kl_coef; comlrl.estimators.kl_reward). Group-baseline "
        "recipes only.",
    )
    update_temperature: float | None = Field(
        None,
        gt=0,
        description="Temperature of the log-probs the policy loss differentiates (and of "
        "the reference model's). None: the sampling temperature, the gradient of the "
        "distribution that sampled the completions. 1.0: the model's untempered softmax "
        "(CoMLRL 1.4.3's MAGRPO and actor-critic trainers). When it differs from "
        "temperature, importance ratios are taken against the trainer's own log-probs before "
        "the update's first optimizer step (the behaviour log-probs are at the sampling "
        "temperature), the sampler/trainer mismatch is not measured, and tis is off.",
    )


class OptimisationSection(BaseModel):
    """The optimizer, batch shapes, concurrency of agents, data parallelism, the
    random streams of sampling, and how long the run is."""

    learning_rate: float = Field(
        1e-3,
        ge=0,
        description="1e-3 suits the built-in 260K-parameter stories260k with "
        "RAdam; any other model gets 1e-6 unless set (defaults by model: "
        "comlrl.algos.training.config.model_defaults; 1e-4 or more on one warns). 0 makes a "
        "control run: every rollout and update runs, the weights stay as loaded (warned).",
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
        "update over the global batch (comlrl.algos.models.gradient_sync).",
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


class GroupBaselineSection(BaseModel):
    """What only the group-baseline recipes (MAGRPO, MARLOO, MAReMax, MAREINFORCE) read: the
    baseline estimator, how advantages are scaled, CoMLRL 1.4.3's node-chunk update
    schedule, and one model for every role (``role_format``). The actor-critic recipes' baseline is their critic; their config has none of
    these fields."""

    estimator: str = Field("grpo", description="reinforce | grpo | rloo | remax (or MA* names).")
    advantage_scale: Literal["auto", "none", "group", "batch"] = Field(
        "auto",
        description="Divide advantages by a std of the returns: auto = the "
        "estimator's own convention (grpo: group; rloo, remax, reinforce: none).",
    )
    advantage_eps: float = Field(1e-6, gt=0)
    advantage_stats: Literal["agent", "global"] = Field(
        "agent",
        description="Whose returns an agent's baseline and std come from. agent: its own "
        "completions' only (Dr. MAS's agent-wise normalization, arXiv 2602.08847): every "
        "agent's advantages have its own scale, whatever its teammates' reward ranges. "
        "global: every agent's completions pooled (one baseline and std for the team). The "
        "two differ only where agents' returns differ (joint_mode=cross, per-agent rewards).",
    )
    advantage_group: Literal["node", "turn"] = Field(
        "node",
        description="The group a completion's baseline is taken over. node: the G "
        "completions its agent sampled at one tree node (same prompt and history). turn: its "
        "agent's completions at that turn of the same example, over every node of the tree "
        "(AT-GRPO's agent x turn groups, arXiv 2510.11062); the same as node with one node "
        "per example a turn (single-turn tasks).",
    )
    update_chunk_nodes: int | None = Field(
        None,
        ge=1,
        description="None: one optimizer step per agent on the whole step's rollout. N: "
        "walk the step's tree nodes in CoMLRL 1.4.3's order (each tree in pre-order) and take "
        "one optimizer step per chunk of N nodes, later chunks weighted by their "
        "importance ratio to the sampling policy, PPO-clipped (needs clip_ratio) "
        "(comlrl.algos.training.update.node_chunks; 1.4.3's rollout_buffer_size).",
    )
    update_chunk_split_turns: bool = Field(
        False,
        description="With update_chunk_nodes: one optimizer step per turn present in a chunk "
        "(CoMLRL 1.4.3 updates each turn's nodes of a full buffer apart).",
    )
    role_format: Literal["sentences", "tagged"] | None = Field(
        None,
        description="One model (models names it) plays every role of a single-turn task "
        "(comlrl.algos.rollout.joint_policy): sentences splits its joint response into the "
        "roles by sentence (base story models), tagged by <agent_i> sections (chat models); "
        "num_agents is then the role count, max_new_tokens and num_generations a whole joint "
        "response's. None: one model per agent.",
    )

    @field_validator("estimator")
    @classmethod
    def _known_estimator(cls, v: str) -> str:
        from comlrl.estimators.registry import ESTIMATORS

        if v.lower() not in ESTIMATORS:
            raise ValueError(f"unknown estimator {v!r}; choose one of {sorted(ESTIMATORS)}")
        return v.lower()


class OutputsSection(BaseModel):
    """Where a run writes (``output_dir``), how often it checkpoints, what it logs."""

    output_dir: str = "runs/default"
    save_every: int = Field(
        0,
        ge=0,
        description="Step checkpoint every N steps and at the last; 0 = only on Ctrl-C or when a step fails.",
    )
    log_samples: int = Field(
        4, ge=0, description="Joint actions per step written to samples.jsonl."
    )
    progress: bool = True


class LifecycleSection(BaseModel):
    """Evaluation during training (``eval_every``, split, greedy or sampled) and how
    many step checkpoints are kept."""

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


class ReportingSection(BaseModel):
    """Where metrics go besides ``metrics.jsonl`` (TensorBoard, W&B) and the reward
    curve (:mod:`comlrl.algos.training.run.reporting`)."""

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
