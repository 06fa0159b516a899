"""Tool calls inside a turn: sample, pause at a closed call, run it, append the observation, resume.

:func:`sample_with_tools` is :meth:`HFAgent.sample <comlrl.algos.rollout.agent.HFAgent.sample>`
for an agent that has tools (:meth:`comlrl.core.Task.tools`). Generation runs in
*segments*: every row of the batch decodes until it emits EOS, spends its token budget or
closes a tool call (:class:`comlrl.core.ToolFormat`). A row that closes a call stops
decoding at once (the backend's ``stop`` hook) and its call is handed to a thread pool
*while the other rows keep decoding*, so tool time overlaps with generation. When the
segment ends, each calling row gets its result appended as an *observation* and the rows
that called continue in the next segment (their whole context prefilled again). An
agent makes at most ``max_tool_calls`` calls a turn; a later call gets a ``"limit"``
error result without running.

Tokens in, tokens out: the model's sampled tokens are kept as sampled (never decoded and
re-tokenized); an observation is rendered to text and tokenized (one longer than
``max_result_tokens`` gets its result's content cut, its markup kept whole:
:func:`~comlrl.algos.rollout.toolbox.observation_ids`). The
:class:`~comlrl.algos.records.PolicyBatch` holds the exact sequence the model read:
``attention_mask`` is 1 on model and observation tokens, ``completion_mask`` (the loss mask)
is True on the model's tokens only, and behaviour log-probs are those the sampler
measured for the model's tokens (0 on observations). The training forward over the whole
sequence therefore gives ratio 1 at step 0.

How the tools are declared in the prompt and how a result reads (the chat template's own
tool format, or the task's fallback): :mod:`comlrl.algos.rollout.toolbox`; the metrics:
:mod:`comlrl.algos.rollout.tool_metrics`.

Named axes: ``N`` prompts, ``G`` completions per prompt, ``B = N * G`` rows, ``S`` padded
prompt tokens, ``L`` completion tokens (model and observation tokens).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from comlrl.algos.records import AgentSamples, PolicyBatch
from comlrl.algos.rollout.toolbox import ToolBox, observation_ids, render_tool_prompts
from comlrl.core import Completion, SamplingParams, ToolCall, ToolFormat, ToolResult
from comlrl.core.prompts import Prompt

__all__ = ["join_segments", "sample_with_tools"]


@dataclass
class _Row:
    """One completion being sampled: its parts and calls so far."""

    prompt: int
    ids: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    model: list[bool] = field(default_factory=list)
    model_tokens: int = 0
    segments: list[str] = field(default_factory=list)  # the model's own text, per segment
    transcript: list[str] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    calls: int = 0
    finished: bool = False
    done: bool = False


class _Detector:
    """The backend's ``stop`` hook for one segment: stops a row at its first closed call
    (and starts the call at once) or at its token budget.

    Whether a row holds a closed call is decided on the exact decode of the row's tokens so
    far, the same decode :func:`_first_call` parses afterwards (one decoding for both: a
    SentencePiece tokenizer decodes a lone token without its leading space, so text built
    from single-token decodes can hold a call that the exact text does not, or the other
    way round). A single token's decode only says when to look: when it holds the last
    character of one of the format's closers."""

    def __init__(
        self,
        tokenizer: Any,
        fmt: ToolFormat,
        box: ToolBox,
        budgets: Sequence[int],
    ) -> None:
        self.tokenizer, self.fmt, self.box = tokenizer, fmt, box
        self.budgets = list(budgets)
        self.ids: list[list[int]] = [[] for _ in budgets]
        self.stopped = [False] * len(budgets)
        self.futures: dict[int, tuple[str, concurrent.futures.Future[ToolResult]]] = {}
        self.started: dict[int, float] = {}
        self.ends = {c[-1] for c in fmt.closers if c}

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(token.shape[0], dtype=torch.bool)
        toks = token.tolist()
        for i, tok in enumerate(toks):
            if self.stopped[i]:
                continue
            self.ids[i].append(tok)
            piece = self.tokenizer.decode([tok], skip_special_tokens=False)
            if any(c in piece for c in self.ends):
                text = self.tokenizer.decode(self.ids[i], skip_special_tokens=False)
                span = self.fmt.find_call(text)
                if span is not None:
                    call = text[span[0] : span[1]]
                    self.futures[i] = (call, self.box.submit(self.fmt, call))
                    self.started[i] = time.perf_counter()
                    self.stopped[i] = out[i] = True
                    continue
            if len(self.ids[i]) >= self.budgets[i]:
                self.stopped[i] = out[i] = True
        return out.to(token.device)


def join_segments(segments: Sequence[str]) -> str:
    """The model's own text of a completion with tools (:attr:`comlrl.core.Completion.text`):
    its segments in order, each segment after a tool call starting a new line.

    The model wrote each later segment after reading an observation, which (in every
    format: a fenced ``output`` block, a ``<tool_response>`` block, a chat template's tool
    message and the next assistant header) ends a line; so the segment starts a line in
    what the model read, and it does in this text too. A reward that reads lines (an
    ``Answer:`` line written right after ``</tool_call>``) reads what the model wrote where
    it wrote it.

    Examples:
        >>> join_segments(['<tool_call>{"name": "f"}</tool_call>', "Answer: 42"])
        '<tool_call>{"name": "f"}</tool_call>\\nAnswer: 42'
    """
    out = ""
    for seg in segments:
        if out and not out.endswith("\n") and not seg.startswith("\n"):
            out += "\n"
        out += seg
    return out


def _first_call(tokenizer: Any, fmt: ToolFormat, ids: Sequence[int]) -> tuple[int, str] | None:
    """``(k, call text)`` for the fewest tokens ``k`` whose exact decode holds a closed call
    (binary search: a closed call stays closed in longer texts), or ``None``."""

    def closed(k: int) -> tuple[int, int] | None:
        return fmt.find_call(tokenizer.decode(list(ids[:k]), skip_special_tokens=False))

    if not ids or closed(len(ids)) is None:
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if closed(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    text = tokenizer.decode(list(ids[:lo]), skip_special_tokens=False)
    span = fmt.find_call(text)
    assert span is not None
    return lo, text[span[0] : span[1]]


def _left_pad(
    rows: Sequence[Sequence[int]], pad: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.int64)
    mask = torch.zeros((len(rows), width), dtype=torch.int64)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.as_tensor(list(r), dtype=torch.int64)
            mask[i, width - len(r) :] = 1
    return ids.to(device), mask.to(device)


def _segment_generators(
    keys: Sequence[int] | None, rows: Sequence[tuple[int, int]], segment: int, device: torch.device
) -> list[torch.Generator] | None:
    """One stream per row ``(prompt, g)`` of a later segment, derived from the prompt's key."""
    if keys is None:
        return None
    mod = 2**63 - 1
    return [
        torch.Generator(device=device).manual_seed(
            (int(keys[n]) * 1_000_003 + (g + 1) * 7_919 + segment * 104_729) % mod
        )
        for n, g in rows
    ]


def sample_with_tools(
    agent: Any,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    box: ToolBox,
    keys: Sequence[int] | None = None,
) -> AgentSamples:
    """``G`` completions for each of ``N`` prompts, with tool calls run inside them.

    Args:
        agent: an :class:`~comlrl.algos.rollout.agent.HFAgent` (its tokenizer,
            ``prompt_format``, EOS ids, device and generation backend are used).
        prompts: ``N`` prompts.
        params: sampling settings; ``max_new_tokens`` bounds the *model's* tokens of a
            completion over all its segments (observations come on top, at most
            ``box.max_result_tokens`` each where their markup allows).
        box: the agent's tools.
        keys: ``N`` seeds for prompt-keyed sampling (see
            :meth:`~comlrl.algos.rollout.agent.HFAgent.sample`), or ``None``.

    Returns:
        :class:`~comlrl.algos.records.AgentSamples` whose completions carry
        ``tool_results`` and ``transcript``; ``text`` is the model's own text (see
        :class:`comlrl.core.Completion`). Its batch's ``completion_mask`` covers the model's
        tokens only.

    Raises:
        ValueError: ``keys`` not one per prompt.
    """
    tok = agent.tokenizer
    device = agent.device
    g = params.num_generations
    n_prompts = len(prompts)
    if keys is not None and len(keys) != n_prompts:
        raise ValueError(f"agent {agent.name!r}: {len(keys)} keys for {n_prompts} prompts")
    if keys is not None and agent.backend != "native":
        raise ValueError(
            f"agent {agent.name!r}: prompt-keyed sampling (sampling_rng='prompt') needs "
            "backend='native'; model.generate and vLLM draw from one stream."
        )
    texts, fmt, templated = render_tool_prompts(tok, prompts, agent.prompt_format, box)
    add_special = agent.prompt_format != "chat"
    prompt_ids = [list(x) for x in tok(texts, add_special_tokens=add_special)["input_ids"]]
    eos = set(agent.eos_token_ids)
    pad = int(tok.pad_token_id)
    rows = [_Row(prompt=n) for n in range(n_prompts) for _ in range(g)]
    backend = agent.generation_backend
    takes_stop = bool(getattr(backend, "supports_stop", False))
    segment = 0
    while True:
        active = [i for i, r in enumerate(rows) if not r.done]
        if not active:
            break
        budgets = [params.max_new_tokens - rows[i].model_tokens for i in active]
        # a call past the limit pauses too: it gets a "limit" result instead of running
        detector = _Detector(tok, fmt, box, budgets)
        if segment == 0:
            ids_in, mask_in = _left_pad(prompt_ids, pad, device)
            seg_params = params
            generator: Any = (
                [torch.Generator(device=device).manual_seed(int(k)) for k in keys]
                if keys is not None
                else agent.generator
            )
        else:
            contexts = [prompt_ids[rows[i].prompt] + rows[i].ids for i in active]
            ids_in, mask_in = _left_pad(contexts, pad, device)
            seg_params = replace(params, num_generations=1, max_new_tokens=max(budgets))
            generator = (
                _segment_generators(
                    keys, [(rows[i].prompt, i % g) for i in active], segment, device
                )
                or agent.generator
            )
        kwargs = {"stop": detector} if takes_stop else {}
        out_ids, out_logp = backend.sample(ids_in, mask_in, seg_params, generator, **kwargs)
        out_ids, out_logp = out_ids.cpu(), out_logp.float().cpu()
        if torch.isnan(out_logp).any():
            out_logp = _recompute(agent, ids_in, mask_in, out_ids, seg_params)
        pending: list[tuple[int, concurrent.futures.Future[ToolResult], float]] = []
        for j, i in enumerate(active):
            row = rows[i]
            seq = out_ids[j].tolist()[: budgets[j]]
            logp = out_logp[j].tolist()
            end = next((k + 1 for k, t in enumerate(seq) if t in eos), None)
            if end is not None:
                seq = seq[:end]
            found = _first_call(tok, fmt, seq)
            if found is not None:
                seq = seq[: found[0]]
            row.ids += seq
            row.logp += logp[: len(seq)]
            row.model += [True] * len(seq)
            row.model_tokens += len(seq)
            seg_text = tok.decode(seq, skip_special_tokens=True)
            row.segments.append(seg_text)
            row.transcript.append(seg_text)
            if found is None:
                row.finished = end is not None
                row.done = True
                continue
            call_text = found[1]
            if row.calls >= box.max_tool_calls:
                fut: concurrent.futures.Future[ToolResult] = concurrent.futures.Future()
                fut.set_result(
                    ToolResult(
                        ToolCall(None, {}, call_text),
                        f"Error: no more tool calls this turn (limit {box.max_tool_calls}).",
                        "limit",
                    )
                )
                pending.append((i, fut, time.perf_counter()))
            elif j in detector.futures and detector.futures[j][0] == call_text:
                pending.append((i, detector.futures[j][1], detector.started[j]))
            else:
                pending.append((i, box.submit(fmt, call_text), time.perf_counter()))
            row.calls += 1
        for i, fut, _ in pending:
            row = rows[i]
            result = fut.result()
            result, obs_ids = observation_ids(
                tok, prompts[row.prompt], fmt, templated, result, box.max_result_tokens
            )
            row.ids += obs_ids
            row.logp += [0.0] * len(obs_ids)
            row.model += [False] * len(obs_ids)
            row.results.append(replace(result, result_tokens=len(obs_ids)))
            row.transcript.append(tok.decode(obs_ids, skip_special_tokens=False))
            if row.model_tokens >= params.max_new_tokens:
                row.done = True  # the budget is spent: the completion ends on the result
        segment += 1
    return _assemble(agent, texts, prompt_ids, rows, g, pad, device)


def _recompute(
    agent: Any,
    ids_in: torch.Tensor,
    mask_in: torch.Tensor,
    out_ids: torch.Tensor,
    params: SamplingParams,
) -> torch.Tensor:
    """Behaviour log-probs of a segment the backend did not measure (NaN), from the
    training model (as :class:`~comlrl.algos.rollout.agent.HFAgent` does)."""
    from comlrl.algos.rollout.sampling.backends import recompute_behaviour_logprobs
    from comlrl.algos.rollout.sampling.collate import policy_batch

    batch = policy_batch(
        ids_in,
        mask_in,
        out_ids.to(ids_in.device),
        torch.zeros_like(out_ids, dtype=torch.float32).to(ids_in.device),
        agent.eos_token_ids,
        params.num_generations,
    )
    return recompute_behaviour_logprobs(agent.model, batch, params.temperature).cpu()


def _assemble(
    agent: Any,
    texts: Sequence[str],
    prompt_ids: Sequence[Sequence[int]],
    rows: Sequence[_Row],
    g: int,
    pad: int,
    device: torch.device,
) -> AgentSamples:
    n = len(prompt_ids)
    s = max(len(p) for p in prompt_ids)
    length = max(1, max(len(r.ids) for r in rows))
    b = len(rows)
    ids = torch.full((b, s + length), pad, dtype=torch.int64)
    attn = torch.zeros((b, s + length), dtype=torch.int64)
    cmask = torch.zeros((b, length), dtype=torch.bool)
    logp = torch.zeros((b, length), dtype=torch.float32)
    completions: list[Completion] = []
    for i, row in enumerate(rows):
        p = prompt_ids[row.prompt]
        ids[i, s - len(p) : s] = torch.as_tensor(list(p), dtype=torch.int64)
        attn[i, s - len(p) : s] = 1
        m = len(row.ids)
        if m:
            ids[i, s : s + m] = torch.as_tensor(row.ids, dtype=torch.int64)
            attn[i, s : s + m] = 1
            cmask[i, :m] = torch.as_tensor(row.model, dtype=torch.bool)
            logp[i, :m] = torch.as_tensor(row.logp, dtype=torch.float32)
        logp[i].masked_fill_(~cmask[i], 0.0)
        completions.append(
            Completion(
                text=join_segments(row.segments),
                token_ids=ids[i, s : s + m].clone(),
                logprobs=logp[i, :m].clone(),
                finished=row.finished,
                tool_results=tuple(row.results),
                transcript="".join(row.transcript),
            )
        )
    batch = PolicyBatch(ids, attn, cmask, logp, group_size=g).to(device)
    groups = tuple(tuple(completions[k * g : (k + 1) * g]) for k in range(n))
    return AgentSamples(tuple(texts), groups, batch, with_tools=True)
