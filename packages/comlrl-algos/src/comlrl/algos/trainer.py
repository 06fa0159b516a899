"""Multi-agent policy-gradient trainer (MAGRPO, MARLOO, MAReMax, MAREINFORCE).

One training step (``DESIGN.md`` §3), for ``A`` agents, ``P = batch_size`` prompts and
``G = num_generations``:

1. each agent formats its prompt for every example and samples ``G`` completions per
   prompt with one batched ``generate`` (behaviour log-probs recorded);
2. completions form ``K`` joint actions per prompt (``align``: ``K = G``; ``cross``:
   ``K = G**A``), which the joint reward scores in one batched call;
3. joint returns are credited to each completion (:func:`credit_completions`) and turned
   into advantages by the configured estimator over the ``G`` siblings of each group;
4. every agent takes one optimizer step on its own policy-gradient loss, with log-probs
   computed through :func:`comlrl.kernels.token_logprobs` on completion positions only.

The loop reads top to bottom in :meth:`MultiAgentTrainer.train`; each stage is a method
that researchers can override.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.advantages import compute_advantages
from comlrl.algos.agent import GenerationBatch, HFAgent
from comlrl.algos.config import ConfigError, TrainConfig
from comlrl.algos.joint import credit_completions, joint_action_indices
from comlrl.algos.losses import policy_loss
from comlrl.core import (
    Completion,
    RewardBatch,
    SamplingParams,
    Task,
    as_joint_reward,
    check_rewards,
)
from comlrl.kernels import token_logprobs

__all__ = ["MultiAgentTrainer", "MAGRPOTrainer", "StepResult", "save_agent_checkpoint"]


class StepResult(dict):
    """Metrics of one training step (a ``dict`` of floats, written as one JSONL row)."""


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def save_agent_checkpoint(agent: HFAgent, path: str | Path) -> Path:
    """Write ``agent``'s model and tokenizer to ``path`` atomically (Hugging Face format).

    The files are written into a temporary sibling folder that is then renamed into place,
    so an interrupted save never leaves a half-written checkpoint at ``path``; an existing
    checkpoint at ``path`` is replaced only after the new one is complete.

    Returns:
        ``path`` as a :class:`~pathlib.Path`; load it with
        ``AutoModelForCausalLM.from_pretrained(path)``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    agent.model.save_pretrained(tmp)
    agent.tokenizer.save_pretrained(tmp)
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


class MultiAgentTrainer:
    """Train ``A`` cooperating causal-LM agents with a group-baseline policy gradient.

    Give either a ``task`` (a :class:`comlrl.core.Task`: examples, per-agent prompts,
    batched joint reward) or ``dataset`` + ``formatters`` + ``reward_func`` (CoMLRL's form:
    ``reward_func(completions_agent1, ..., completions_agentA) -> list[float]``, optionally
    with an ``example=`` or ``batch_items=`` keyword).

    Args:
        agents: ``A`` :class:`HFAgent` objects (or ``(model, tokenizer)`` pairs).
        config: a validated :class:`TrainConfig`; ``config.estimator`` picks the baseline.
        task: the task suite; its ``load(config.task.split)`` gives the dataset unless
            ``dataset`` is passed.
        dataset: a sequence of examples (mappings); a ``datasets.Dataset`` works.
        formatters: ``A`` callables ``example -> prompt`` (without ``task``).
        reward_func: joint reward (without ``task``).

    Raises:
        ConfigError: when the agents, formatters and config disagree (checked before any
            training work starts).
    """

    def __init__(
        self,
        agents: Sequence[HFAgent | tuple[Any, Any]],
        config: TrainConfig,
        *,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], str]] | None = None,
        reward_func: Callable[..., Any] | None = None,
    ) -> None:
        self.config = config
        self.agents = [
            a if isinstance(a, HFAgent) else HFAgent(a[0], a[1], name=f"agent_{i}")
            for i, a in enumerate(agents)
        ]
        n = len(self.agents)
        if n != config.num_agents:
            raise ConfigError(
                f"{n} agents were given but config.num_agents={config.num_agents}; make them agree."
            )
        self.task = task
        if task is not None:
            if task.num_agents != n:
                raise ConfigError(
                    f"task {task.name!r} is for {task.num_agents} agents but {n} agents were given."
                )
            self.reward_fn = as_joint_reward(task)
            self.format_prompts: Callable[[Mapping[str, Any]], list[str]] = task.prompts
            self.dataset: Sequence[Mapping[str, Any]] = (
                list(dataset) if dataset is not None else list(task.load(config.task.split))
            )
        else:
            if formatters is None or reward_func is None or dataset is None:
                raise ConfigError(
                    "without a task, pass dataset=, formatters= (one per agent) and reward_func=."
                )
            if len(formatters) != n:
                raise ConfigError(f"{len(formatters)} formatters for {n} agents; give one per agent.")
            fmts = list(formatters)
            self.format_prompts = lambda ex: [f(ex) for f in fmts]
            self.reward_fn = as_joint_reward(reward_func)
            self.dataset = dataset if isinstance(dataset, Sequence) else list(dataset)
        if len(self.dataset) == 0:
            raise ConfigError("the dataset is empty; nothing to train on.")
        self.device = _resolve_device(config.device)
        self.params = SamplingParams(
            num_generations=config.num_generations,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
        )
        for agent in self.agents:
            agent.model.to(self.device)
            agent.model.train()
        self.optimizers = [
            torch.optim.AdamW(
                [p for p in a.model.parameters() if p.requires_grad],
                lr=config.learning_rate,
                weight_decay=config.weight_decay,
            )
            for a in self.agents
        ]
        self.ref_models = (
            [copy.deepcopy(a.model).eval().requires_grad_(False) for a in self.agents]
            if config.kl_coef > 0
            else None
        )
        self.joint_index = joint_action_indices(n, config.num_generations, config.joint_mode)
        self.output_dir = Path(config.output_dir)
        self.step = 0
        self._order: list[int] = []
        self._reward_thread: ThreadPoolExecutor | None = None
        self._sample_threads: ThreadPoolExecutor | None = None
        for i, agent in enumerate(self.agents):
            agent.seed(config.seed * 1_000_003 + i)
        # Concurrent sampling needs per-agent random streams (native backend) and pays off
        # only with more than one CPU thread, or with agents on different GPUs.
        devices = {str(a.device) for a in self.agents}
        concurrent = (
            config.parallel_agents
            and n > 1
            and (torch.get_num_threads() >= n if self.device.type == "cpu" else len(devices) == n)
        )
        self._parallel_sampling = concurrent and all(a.backend == "native" for a in self.agents)
        # Forwards and updates of distinct models are independent too (no random stream
        # needed); agents that share one model object must not update concurrently.
        self._parallel_updates = concurrent and len({id(a.model) for a in self.agents}) == n
        self._rng = random.Random(config.seed)

    # ------------------------------------------------------------------ data
    def next_batch(self) -> list[Mapping[str, Any]]:
        """The next ``batch_size`` examples (seeded shuffle, reshuffled every epoch)."""
        out: list[Mapping[str, Any]] = []
        while len(out) < self.config.batch_size:
            if not self._order:
                self._order = list(range(len(self.dataset)))
                self._rng.shuffle(self._order)
            out.append(self.dataset[self._order.pop()])
        return out

    # ------------------------------------------------------------------ rollout
    def sample(
        self, examples: Sequence[Mapping[str, Any]]
    ) -> tuple[list[list[str]], list[list[list[Completion]]]]:
        """Format every agent's prompts and sample ``G`` completions per prompt.

        Returns:
            ``(prompts, completions)``: ``prompts[p][a]`` and ``completions[a][p][g]``.
        """
        prompts = [self.format_prompts(ex) for ex in examples]  # [P][A]

        def run(a: int) -> list[list[Completion]]:
            return self.agents[a].generate([pr[a] for pr in prompts], self.params)

        return prompts, self._map_agents(run, self._parallel_sampling)

    def _map_agents(self, fn: Callable[[int], Any], parallel: bool) -> list[Any]:
        """``[fn(0), ..., fn(A - 1)]``, concurrently (one thread per agent) when ``parallel``.

        On CPU the intra-op threads are shared out among the agents (each worker thread
        sets its own count: torch's OpenMP thread count is per thread). Exceptions
        propagate; results are in agent order.
        """
        n = len(self.agents)
        if not parallel:
            return [fn(a) for a in range(n)]
        if self._sample_threads is None:
            self._sample_threads = ThreadPoolExecutor(n, thread_name_prefix="comlrl-agent")
        per_agent = max(1, torch.get_num_threads() // n) if self.device.type == "cpu" else None

        def run(a: int) -> Any:
            if per_agent is not None:
                torch.set_num_threads(per_agent)
            return fn(a)

        return list(self._sample_threads.map(run, range(n)))

    def score(
        self, completions: Sequence[Sequence[Sequence[Completion]]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Form the ``K`` joint actions of every prompt and score them in one batched call.

        Returns:
            ``P * K`` rewards, prompt-major (joint action ``k`` of prompt ``p`` at
            ``p * K + k``), checked finite.

        Raises:
            RewardFunctionError: the reward function raised or returned NaN/inf; the error
                names the joint action and its example.
        """
        idx = self.joint_index.tolist()  # [K][A]
        texts = [
            [completions[a][p][row[a]].text for p in range(len(examples)) for row in idx]
            for a in range(len(self.agents))
        ]
        flat_examples = [ex for ex in examples for _ in idx]
        batch = self.reward_fn(texts, flat_examples)
        batch.rewards = check_rewards(batch.rewards, texts, flat_examples)
        return batch

    def rollout(
        self, examples: Sequence[Mapping[str, Any]]
    ) -> tuple[list[list[list[Completion]]], RewardBatch, dict[str, float]]:
        """Sample every agent's completions and score all joint actions (no overlap).

        Returns:
            ``(completions, rewards, timings)``: ``completions[a][p][g]``; ``rewards`` as
            in :meth:`score`; ``timings`` in seconds.
        """
        t0 = time.perf_counter()
        self._last_prompts, completions = self.sample(examples)
        t1 = time.perf_counter()
        batch = self.score(completions, examples)
        t2 = time.perf_counter()
        return completions, batch, {"time/generate_s": t1 - t0, "time/reward_s": t2 - t1}

    # ------------------------------------------------------------------ advantages
    def advantages(self, rewards: Sequence[float], num_prompts: int) -> torch.Tensor:
        """Per-completion advantages ``[A, P, G]`` from ``P * K`` joint rewards."""
        g = self.config.num_generations
        joint = torch.tensor(rewards, dtype=torch.float32).view(num_prompts, -1)  # [P, K]
        credited = credit_completions(joint, self.joint_index, g)  # [A, P, G]
        return torch.stack(
            [
                compute_advantages(
                    credited[a],
                    estimator=self.config.estimator,
                    scale=self.config.advantage_scale,
                    eps=self.config.advantage_eps,
                )
                for a in range(credited.shape[0])
            ]
        )

    # ------------------------------------------------------------------ update
    def _completion_logprobs(
        self, model: Any, gb: GenerationBatch, prompts: slice, *, shared_prefix: bool
    ) -> torch.Tensor:
        """Log-probs ``[b, L]`` (fp32) of the completions of prompts ``prompts`` in ``gb``.

        Logits are computed only at the ``L`` positions that predict completion tokens
        (never over the prompt), and reduced to log-probs by
        :func:`comlrl.kernels.token_logprobs`. With ``shared_prefix`` each prompt runs
        through the model once and its KV cache (with its autograd graph) is repeated for
        its ``G`` completions, so prompt work is not repeated ``G`` times; the result and
        its gradient equal the plain per-sequence forward (tested to 1e-5).
        """
        g = gb.group_size
        rows = slice(prompts.start * g, prompts.stop * g)
        ids, mask = gb.input_ids[rows], gb.attention_mask[rows]
        length = gb.completion_mask.shape[1]
        s = ids.shape[1] - length
        if not shared_prefix:
            position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
            keep = torch.arange(s - 1, s - 1 + length, device=ids.device)
            logits = model(
                input_ids=ids, attention_mask=mask, position_ids=position_ids,
                logits_to_keep=keep, use_cache=False,
            ).logits  # [b, L, V]
        else:
            prompt_ids, prompt_mask = ids[::g, :s], mask[::g, :s]
            out = model(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
                use_cache=True,
                logits_to_keep=1,
            )
            first = out.logits[:, -1:].repeat_interleave(g, dim=0)  # [b, 1, V]
            if length == 1:
                logits = first
            else:
                cache = out.past_key_values
                cache.batch_repeat_interleave(g)
                start = prompt_mask.sum(-1, keepdim=True).repeat_interleave(g, dim=0)
                rest = model(
                    input_ids=ids[:, s : s + length - 1],
                    attention_mask=mask[:, : s + length - 1],
                    position_ids=start + torch.arange(length - 1, device=ids.device),
                    past_key_values=cache,
                    use_cache=True,
                ).logits  # [b, L - 1, V]
                logits = torch.cat([first, rest], dim=1)
        b = logits.shape[0]
        return token_logprobs(
            logits.reshape(b * length, -1),
            ids[:, s:].reshape(-1),
            temperature=self.config.temperature,
        ).view(b, length)

    def _chunks(self, gb: GenerationBatch) -> list[slice]:
        """Micro-batches as slices of prompts: whole groups, so each prefix is computed once."""
        b = gb.completion_mask.shape[0]
        num_prompts = b // gb.group_size
        per_micro = max(1, (self.config.micro_batch_size or b) // gb.group_size)
        return [slice(i, min(i + per_micro, num_prompts)) for i in range(0, num_prompts, per_micro)]

    def first_chunk_logprobs(self, a: int) -> torch.Tensor:
        """Agent ``a``'s log-probs (with autograd graph) for its first micro-batch.

        The train step computes these while the reward function runs (see
        ``TrainConfig.overlap_reward``) and hands them to :meth:`update_agent`.
        """
        gb = self.agents[a].last_batch
        if gb is None:
            raise RuntimeError(f"agent {a} has no sampled batch; call sample() first.")
        chunk = self._chunks(gb)[0]
        return self._completion_logprobs(
            self.agents[a].model, gb, chunk, shared_prefix=self.config.shared_prefix
        )

    def update_agent(
        self, a: int, advantages: torch.Tensor, first_logprobs: torch.Tensor | None = None
    ) -> dict[str, float]:
        """One optimizer step (``num_iterations`` passes) for agent ``a``.

        Args:
            a: agent index.
            advantages: ``[P * G]`` float32 advantages of its completions, prompt-major.
            first_logprobs: the first micro-batch's log-probs from
                :meth:`first_chunk_logprobs`, computed under the current weights (used by
                the first pass instead of recomputing them).
        """
        cfg = self.config
        agent, opt = self.agents[a], self.optimizers[a]
        gb = agent.last_batch
        if gb is None:
            raise RuntimeError(f"agent {a} has no sampled batch; call rollout() before update_agent().")
        b = gb.completion_mask.shape[0]
        g = gb.group_size
        chunks = self._chunks(gb)
        adv = advantages.to(self.device)
        ref_logp: list[torch.Tensor] = []
        if self.ref_models is not None:
            with torch.no_grad():
                ref_logp = [
                    self._completion_logprobs(self.ref_models[a], gb, c, shared_prefix=cfg.shared_prefix)
                    for c in chunks
                ]
        sums: dict[str, float] = {}
        count = 0
        total_tokens = float(gb.completion_mask.sum())
        for _ in range(cfg.num_iterations):
            opt.zero_grad(set_to_none=True)
            for j, chunk in enumerate(chunks):
                sl = slice(chunk.start * g, chunk.stop * g)
                if j == 0 and first_logprobs is not None:
                    logp, first_logprobs = first_logprobs, None
                else:
                    logp = self._completion_logprobs(
                        agent.model, gb, chunk, shared_prefix=cfg.shared_prefix
                    )
                loss, metrics = policy_loss(
                    logp,
                    adv[sl],
                    gb.completion_mask[sl],
                    old_logprobs=gb.behaviour_logprobs[sl] if cfg.clip_ratio is not None else None,
                    clip_ratio=cfg.clip_ratio,
                    ref_logprobs=ref_logp[j] if ref_logp else None,
                    kl_coef=cfg.kl_coef,
                    kl_estimator=cfg.kl_estimator,
                    reduction=cfg.loss_reduction,
                    max_completion_length=cfg.max_new_tokens,
                )
                # Weight each micro-batch by its share of the reduction's denominator so
                # the accumulated gradient equals the full-batch loss's gradient.
                if cfg.loss_reduction == "token_mean":
                    weight = float(gb.completion_mask[sl].sum()) / max(1.0, total_tokens)
                else:
                    weight = logp.shape[0] / b
                (loss * weight).backward()
                sums["loss"] = sums.get("loss", 0.0) + float(loss.detach()) * weight
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v) * logp.shape[0] / b
            if cfg.max_grad_norm is not None:
                norm = torch.nn.utils.clip_grad_norm_(agent.model.parameters(), cfg.max_grad_norm)
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(norm)
            opt.step()
            count += 1
        return {k: v / count for k, v in sums.items()}

    # ------------------------------------------------------------------ loop
    def train_step(self) -> StepResult:
        """Run one full step (rollout, advantages, every agent's update); return metrics."""
        t0 = time.perf_counter()
        examples = self.next_batch()
        self._last_prompts, completions = self.sample(examples)
        t_gen = time.perf_counter()
        first: list[torch.Tensor | None] = [None] * len(self.agents)
        if self.config.overlap_reward:
            # The reward (e.g. sandboxed test runs in child processes) does not need the
            # policy's log-probs, nor they the reward: compute each agent's first
            # micro-batch forward while the reward function runs in a worker thread.
            if self._reward_thread is None:
                self._reward_thread = ThreadPoolExecutor(1, thread_name_prefix="comlrl-reward")
            future = self._reward_thread.submit(self.score, completions, examples)
            try:
                first = self._map_agents(self.first_chunk_logprobs, self._parallel_updates)
            finally:
                rewards = future.result()
        else:
            rewards = self.score(completions, examples)
        t_rew = time.perf_counter()
        timings = {"time/generate_s": t_gen - t0, "time/reward_s": t_rew - t_gen}
        adv = self.advantages(rewards.rewards, len(examples))  # [A, P, G]
        t1 = time.perf_counter()
        metrics: dict[str, float] = {}

        def update(a: int) -> dict[str, float]:
            logp, first[a] = first[a], None
            return self.update_agent(a, adv[a].reshape(-1), logp)

        for a, agent_metrics in enumerate(self._map_agents(update, self._parallel_updates)):
            for k, v in agent_metrics.items():
                metrics[f"{k}/agent_{a}"] = v
        t2 = time.perf_counter()
        self.step += 1
        r = torch.tensor(rewards.rewards)
        num_tokens = 0
        for a, agent_comps in enumerate(completions):
            lengths = torch.tensor([c.num_tokens for group in agent_comps for c in group], dtype=torch.float32)
            num_tokens += int(lengths.sum())
            metrics[f"completion_len_mean/agent_{a}"] = float(lengths.mean())
            metrics[f"completion_len_max/agent_{a}"] = float(lengths.max())
            metrics[f"advantage_mean/agent_{a}"] = float(adv[a].mean())
            metrics[f"advantage_std/agent_{a}"] = float(adv[a].std(unbiased=False))
        elapsed = t2 - t0
        result = StepResult(
            step=self.step,
            reward_mean=float(r.mean()),
            reward_std=float(r.std(unbiased=False)),
            reward_max=float(r.max()),
            reward_min=float(r.min()),
            num_joint_actions=len(rewards.rewards),
            **metrics,
            **timings,
            **{"time/update_s": t2 - t1, "time/step_s": elapsed},
            tokens_per_s=num_tokens / elapsed,
            prompts_per_s=len(examples) / elapsed,
        )
        self._last = (examples, completions, rewards)
        return result

    def _write_samples(self, fh: Any) -> None:
        examples, completions, rewards = self._last
        k = len(self.joint_index)
        for p, ex in enumerate(examples[: max(1, self.config.log_samples)]):
            for kk in range(k)[: self.config.log_samples]:
                row = self.joint_index[kk].tolist()
                i = p * k + kk
                fh.write(
                    json.dumps(
                        {
                            "step": self.step,
                            "example_id": ex.get("task_id", ex.get("id")),
                            "prompts": self._last_prompts[p],
                            "joint_action": row,
                            "completions": [completions[a][p][g].text for a, g in enumerate(row)],
                            "reward": rewards.rewards[i],
                            "info": rewards.infos[i],
                        },
                        default=str,
                    )
                    + "\n"
                )

    def save(self, tag: str) -> list[Path]:
        """Checkpoint every agent under ``output_dir/<tag>/agent_<i>`` (atomically)."""
        return [
            save_agent_checkpoint(agent, self.output_dir / tag / f"agent_{i}")
            for i, agent in enumerate(self.agents)
        ]

    def train(self) -> list[StepResult]:
        """Run ``config.num_steps`` steps, logging metrics and samples, then checkpoint.

        Writes ``metrics.jsonl`` (one row per step), ``samples.jsonl`` (joint actions with
        rewards and reward-function infos such as sandbox verdicts), ``config.yaml`` and the
        per-agent checkpoints in ``output_dir``.
        """
        import yaml
        from tqdm.auto import tqdm

        cfg = self.config
        torch.manual_seed(cfg.seed)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
        history: list[StepResult] = []
        bar = tqdm(total=cfg.num_steps, disable=not cfg.progress, desc="train", unit="step")
        try:
            with open(self.output_dir / "metrics.jsonl", "a") as mfh, open(
                self.output_dir / "samples.jsonl", "a"
            ) as sfh:
                for _ in range(cfg.num_steps):
                    result = self.train_step()
                    history.append(result)
                    mfh.write(json.dumps(result) + "\n")
                    mfh.flush()
                    if cfg.log_samples:
                        self._write_samples(sfh)
                        sfh.flush()
                    bar.update(1)
                    bar.set_postfix(
                        reward=f"{result['reward_mean']:.3f}",
                        tok_s=f"{result['tokens_per_s']:.0f}",
                    )
                    if cfg.save_every and self.step % cfg.save_every == 0:
                        self.save(f"checkpoints/step-{self.step:06d}")
            self.save("final")
        finally:
            bar.close()
            for pool in (self._reward_thread, self._sample_threads):
                if pool is not None:
                    pool.shutdown()
            self._reward_thread = self._sample_threads = None
            if self.task is not None:
                self.task.close()
        return history


class MAGRPOTrainer(MultiAgentTrainer):
    """:class:`MultiAgentTrainer` with the group-mean baseline (MAGRPO).

    Multi-agent GRPO: every agent's completion is credited with its joint actions' returns
    and compared with the mean of its ``G`` siblings (Shao et al. 2024, eq. for the
    outcome-supervised GRPO advantage; without std scaling by default, following Liu et al.
    2025). Raises :class:`ConfigError` if ``config.estimator`` names another estimator.
    """

    def __init__(self, agents: Sequence[HFAgent | tuple[Any, Any]], config: TrainConfig, **kwargs: Any) -> None:
        if config.estimator not in ("grpo", "magrpo"):
            raise ConfigError(
                f"MAGRPOTrainer uses estimator='grpo' but config.estimator={config.estimator!r}; "
                "use MultiAgentTrainer for other estimators."
            )
        super().__init__(agents, config, **kwargs)
