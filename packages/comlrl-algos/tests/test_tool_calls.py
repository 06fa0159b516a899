"""Tool calls inside a turn, end to end with a scripted policy.

The scripted backend writes fixed text (chosen from the context it is given) as token ids
and reports NaN behaviour log-probs, so the tool loop measures them with the real tiny
model on the segment's own context; the update then recomputes them over the whole
sequence (prompt, model segments, observations). Ratio 1 at step 0 therefore checks that
the sequence the update sees is exactly the one sampled: the same tokens at the same
positions, observations attended but not trained.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import torch
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.environment import CallbackEnvironment
from comlrl.algos.rollout.metrics import rollout_metrics, sample_rows
from comlrl.algos.rollout.tool_calls import sample_with_tools
from comlrl.algos.rollout.toolbox import ToolBox, template_renders_tools
from comlrl.algos.rollout.tree import rollout
from comlrl.algos.training.update.policy import update_policy
from comlrl.algos.training.update.settings import UpdateSettings
from comlrl.core import SamplingParams, Tool

CODE = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}


def _exec_python(code: str) -> str:
    """A test stand-in for the sandboxed Python tool (trusted code only)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # noqa: S102 - the scripts below are the test's own
    return out.getvalue().strip()


PYTHON = Tool("python", "Run Python code and read what it prints.", CODE, run=_exec_python)


class ScriptedBackend:
    """Writes ``script(context_text)`` for every row (then EOS), NaN log-probs."""

    name = "native"
    recompute_logprobs = False

    def __init__(
        self, tokenizer: Any, script: Callable[[str], str], *, supports_stop: bool = False
    ) -> None:
        self.tokenizer, self.script = tokenizer, script
        self.supports_stop = supports_stop
        self.calls: list[int] = []

    def sample(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        generator: Any = None,
        stop: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        g = params.num_generations
        rows: list[list[int]] = []
        for p in range(input_ids.shape[0]):
            context = self.tokenizer.decode(input_ids[p][attention_mask[p].bool()].tolist())
            for _ in range(g):
                ids = self.tokenizer(self.script(context), add_special_tokens=False)["input_ids"]
                rows.append(list(ids)[: params.max_new_tokens - 1] + [self.tokenizer.eos_token_id])
        self.calls.append(len(rows))
        pad = self.tokenizer.pad_token_id
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
        if stop is not None:  # play the tokens through the hook as a sampler would
            done = torch.zeros(len(rows), dtype=torch.bool)
            for k in range(width):
                col = ids[:, k].masked_fill(done, pad)
                hit = stop(col)
                ids[:, k] = col
                done |= hit | (col == self.tokenizer.eos_token_id)
        return ids, torch.full(ids.shape, float("nan"))

    def after_update(self) -> None:
        """Nothing to do."""


def _results(context: str) -> int:
    """Observations of the python format in ``context`` (its declaration shows one)."""
    return context.count("```output\n") - 1


def two_step_script(context: str) -> str:
    """Call the tool once, then answer from its output."""
    if _results(context) < 1:
        return "Let me compute.\n```python\nprint(6 * 7)\n```\nignored tail"
    return "So the answer is 42.\nAnswer: 42"


def _agent(model: Any, tokenizer: Any, script: Callable[[str], str], **kw: Any) -> HFAgent:
    backend = ScriptedBackend(tokenizer, script, **kw)
    return HFAgent(model, tokenizer, backend=backend, prompt_format="raw")


def _box(*tools: Tool, **kw: Any) -> ToolBox:
    return ToolBox(tuple(tools) or (PYTHON,), fallback_format="python", **kw)


PARAMS = SamplingParams(num_generations=2, max_new_tokens=64)


@pytest.mark.parametrize("supports_stop", [False, True])
def test_a_tool_result_is_appended_as_an_observation_not_trained_on(
    tiny_model: Any, tiny_tokenizer: Any, supports_stop: bool
) -> None:
    agent = _agent(tiny_model, tiny_tokenizer, two_step_script, supports_stop=supports_stop)
    samples = sample_with_tools(agent, ["What is 6 * 7?", "Six times seven?"], PARAMS, _box())
    assert samples.with_tools and samples.batch.behaviour_logprobs.shape[0] == 4
    for group in samples.completions:
        for c in group:
            (result,) = c.tool_results
            assert (result.error, result.content) == (None, "42")
            assert result.result_tokens > 0
            # the model's own text leaves the observation out; the transcript has it in place
            assert "```output" not in c.text and c.text.endswith("Answer: 42")
            assert "ignored tail" not in c.text  # generation paused at the closed call
            assert "```\n```output\n42\n```\nSo the answer" in c.transcript
            assert c.finished
    batch = samples.batch
    s = batch.prompt_length
    tail = batch.input_ids[:, s:]
    for i in range(tail.shape[0]):
        obs = tail[i][(~batch.completion_mask[i]) & batch.attention_mask[i, s:].bool()]
        assert tiny_tokenizer.decode(obs.tolist()) == "\n```output\n42\n```\n"
        # behaviour log-probs exist for model tokens only
        assert bool((batch.behaviour_logprobs[i][~batch.completion_mask[i]] == 0).all())
        assert bool((batch.behaviour_logprobs[i][batch.completion_mask[i]] < 0).all())


def test_the_first_ratio_is_one_with_tool_results_inside_the_sequence(
    tiny_model: Any, tiny_tokenizer: Any
) -> None:
    agent = _agent(tiny_model, tiny_tokenizer, two_step_script)
    batch = sample_with_tools(agent, ["What is 6 * 7?", "x"], PARAMS, _box()).batch
    settings = UpdateSettings(clip_ratio=0.2, max_completion_length=batch.completion_mask.shape[1])
    opt = torch.optim.SGD(tiny_model.parameters(), lr=0.0)
    stats = update_policy(
        tiny_model, opt, [batch], [torch.tensor([1.0, -1.0, 0.5, -0.5])], settings
    )
    # float32 round-off between the segment prefill and the full forward is ~1e-6
    assert abs(stats["ratio_mean"] - 1.0) < 1e-4, stats
    assert stats["clip_fraction"] == 0.0


def test_observation_tokens_get_no_gradient(tiny_model: Any, tiny_tokenizer: Any) -> None:
    from comlrl.algos.models.logprobs import completion_logprobs

    agent = _agent(tiny_model, tiny_tokenizer, two_step_script)
    batch = sample_with_tools(agent, ["q"], SamplingParams(1, 64), _box()).batch
    logp = completion_logprobs(tiny_model, batch, slice(0, 1))
    weights = torch.zeros_like(logp, requires_grad=True)
    # the loss reads the completion mask: observation positions contribute nothing
    loss = (logp * batch.completion_mask * (1 + weights)).sum()
    loss.backward()
    assert weights.grad is not None
    assert bool((weights.grad[~batch.completion_mask] == 0).all())
    assert bool((weights.grad[batch.completion_mask] != 0).any())


def _one(agent: HFAgent, box: ToolBox) -> Any:
    samples = sample_with_tools(agent, ["q"], SamplingParams(1, 64), box)
    return samples.completions[0][0]


def test_malformed_unknown_raising_and_hanging_calls_become_error_results(
    tiny_model: Any, tiny_tokenizer: Any
) -> None:
    def boom(code: str) -> str:
        raise RuntimeError("tool broke")

    def hang(code: str) -> str:
        time.sleep(30)
        return "late"

    def script(kind: str) -> Callable[[str], str]:
        call = "```python\n\n```" if kind == "malformed" else "```python\nprint(1)\n```"
        return lambda ctx: "Answer: 0" if _results(ctx) >= 1 else call

    cases = {
        "malformed": PYTHON,
        "raised": Tool("python", "d", CODE, run=boom),
        "timeout": Tool("python", "d", CODE, run=hang, timeout_s=0.3),
    }
    for kind, tool in cases.items():
        t0 = time.perf_counter()
        c = _one(_agent(tiny_model, tiny_tokenizer, script(kind)), _box(tool))
        assert [r.error for r in c.tool_results] == [kind], c.tool_results
        assert c.text.endswith("Answer: 0")  # the sample goes on: nothing is lost
        assert c.tool_results[0].content.startswith("Error:")
        assert time.perf_counter() - t0 < 10
    unknown = ToolBox((PYTHON,), fallback_format="json")
    c = _one(
        _agent(
            tiny_model,
            tiny_tokenizer,
            lambda ctx: (
                "done"
                if "</tool_response>" in ctx
                else '<tool_call>{"name": "search", "arguments": {}}</tool_call>'
            ),
        ),
        unknown,
    )
    assert [r.error for r in c.tool_results] == ["unknown_tool"]
    assert "there is no tool named 'search'" in c.transcript


def test_calls_past_the_limit_get_a_limit_result_without_running(
    tiny_model: Any, tiny_tokenizer: Any
) -> None:
    ran: list[str] = []

    def record(code: str) -> str:
        ran.append(code)
        return "ok"

    def script(ctx: str) -> str:
        return "Answer: 1" if _results(ctx) >= 3 else "```python\nprint(1)\n```"

    box = _box(Tool("python", "d", CODE, run=record), max_tool_calls=2)
    c = _one(_agent(tiny_model, tiny_tokenizer, script), box)
    assert [r.error for r in c.tool_results] == [None, None, "limit"]
    assert len(ran) == 2


def test_text_that_looks_like_a_result_is_the_models_own(
    tiny_model: Any, tiny_tokenizer: Any
) -> None:
    fake = "I ran it:\n```output\n999\n```\nAnswer: 999"
    c = _one(_agent(tiny_model, tiny_tokenizer, lambda ctx: fake), _box())
    assert c.tool_results == () and c.text == fake


def test_the_token_budget_bounds_the_models_tokens(tiny_model: Any, tiny_tokenizer: Any) -> None:
    agent = _agent(tiny_model, tiny_tokenizer, lambda ctx: "```python\nprint(1)\n```")
    samples = sample_with_tools(agent, ["q"], SamplingParams(1, 40), _box(max_tool_calls=100))
    assert int(samples.batch.completion_mask.sum()) <= 40
    c = samples.completions[0][0]
    assert len(c.tool_results) >= 2


def test_native_sampler_stops_rows_the_stop_hook_names(
    tiny_model: Any, tiny_tokenizer: Any
) -> None:
    from comlrl.algos.rollout.sampling.native import NativeSampler

    sampler = NativeSampler(tiny_model, pad_token_id=0, eos_token_ids=[0], fast_decode=False)
    enc = tiny_tokenizer(["def f(x):"], return_tensors="pt")
    seen = [0]

    def stop(token: torch.Tensor) -> torch.Tensor:
        seen[0] += 1
        out = torch.zeros(token.shape[0], dtype=torch.bool)
        out[0] = seen[0] == 3  # row 0 stops after its third token
        return out

    torch.manual_seed(0)
    ids, _ = sampler.sample(
        enc["input_ids"],
        enc["attention_mask"],
        SamplingParams(2, 12),
        torch.Generator().manual_seed(1),
        stop,
    )
    assert bool((ids[0, 3:] == 0).all()) and ids.shape[1] > 3


def _hermes_template() -> str:
    # a minimal chat template that renders tools and tool messages (Hermes / Qwen2.5 style)
    return (
        "{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n"
        "{% endfor %}<|im_end|>\n{% endif %}"
        "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
        "{{ m.content }}\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n"
        "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


def test_a_template_with_tools_declares_them_and_renders_results(
    tiny_model: Any, tiny_tokenizer: Any
) -> None:
    tok = tiny_tokenizer
    old = tok.chat_template
    tok.chat_template = _hermes_template()
    try:
        assert template_renders_tools(tok)

        def script(ctx: str) -> str:
            if "<tool_response>" in ctx:
                return "Answer: 42"
            return '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>'

        backend = ScriptedBackend(tok, script)
        agent = HFAgent(tiny_model, tok, backend=backend, prompt_format="chat")
        samples = sample_with_tools(agent, ["What is 6*7?"], SamplingParams(1, 64), _box())
        assert '"name": "python"' in samples.prompts[0]  # declared through the template
        c = samples.completions[0][0]
        assert [(r.error, r.content) for r in c.tool_results] == [(None, "42")]
        assert (
            "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\n" in c.transcript
        )
        assert c.text.endswith("Answer: 42")
    finally:
        tok.chat_template = old


def test_rollout_logs_tool_metrics_and_transcripts(tiny_model: Any, tiny_tokenizer: Any) -> None:
    def reward(a: Sequence[str], b: Sequence[str]) -> list[float]:
        return [float("Answer: 42" in x) + float("Answer: 42" in y) for x, y in zip(a, b)]

    agents = [_agent(tiny_model, tiny_tokenizer, two_step_script) for _ in range(2)]
    env = CallbackEnvironment(
        [lambda ex: ex["q"], lambda ex: ex["q"]], reward, tools=[[PYTHON], []], tool_format="python"
    )
    examples: list[Mapping[str, Any]] = [{"q": "6*7?"}]
    ro = rollout(agents, examples, env, PARAMS)
    assert ro.turns[0].agents[0].with_tools and not ro.turns[0].agents[1].with_tools
    m = rollout_metrics(ro)
    assert m["tool_calls_mean/agent_0"] == 1.0 and "tool_calls_mean/agent_1" not in m
    assert m["turn_0/tool_calls_mean/agent_0"] == 1.0
    assert m["tool_error_fraction"] == 0.0 and m["tool_errors/timeout"] == 0.0
    assert m["tool_result_tokens_mean/agent_0"] > 0
    row = sample_rows(ro, step=0, limit=1)[0]
    assert row["tool_calls"][0][0]["result"] == "42" and row["tool_calls"][1] == []
    assert "```output\n42" in row["transcripts"][0]
    # agent 1 has no tools: the scripted call stays its own text, nothing ran
    assert "```output" not in row["transcripts"][1]
    env.close()


def test_tools_of_a_callback_environment_must_be_one_list_per_agent() -> None:
    with pytest.raises(ValueError, match="one list of tools per agent"):
        CallbackEnvironment([lambda ex: "a"], lambda a: [0.0] * len(a), tools=[[PYTHON], []])


def _answer_lines(text: str) -> list[str]:
    """The lines of ``text`` that are an ``Answer:`` line (what ``answer_line`` reads)."""
    return [line for line in text.splitlines() if line.startswith("Answer:")]


@pytest.mark.parametrize("fmt", ["python", "json", "template"])
def test_an_answer_written_right_after_a_call_starts_its_own_line(
    tiny_model: Any, tiny_tokenizer: Any, fmt: str
) -> None:
    # the model's next segment follows the observation, which ends a line in every format:
    # its first line is a line of the model's own text too
    call = {
        "python": "```python\nprint(6 * 7)\n```",
        "json": '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>',
        "template": '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>',
    }[fmt]
    seen = "```output\n42" if fmt == "python" else "<tool_response>\n42"

    def script(ctx: str) -> str:
        return "Answer: 42" if seen in ctx else call

    tok = tiny_tokenizer
    old = tok.chat_template
    if fmt == "template":
        tok.chat_template = _hermes_template()
    try:
        agent = HFAgent(
            tiny_model,
            tok,
            backend=ScriptedBackend(tok, script),
            prompt_format="chat" if fmt == "template" else "raw",
        )
        box = ToolBox((PYTHON,), fallback_format="python" if fmt == "python" else "json")
        c = _one(agent, box)
    finally:
        tok.chat_template = old
    assert [(r.error, r.content) for r in c.tool_results] == [(None, "42")]
    assert _answer_lines(c.text) == ["Answer: 42"], c.text
    assert c.text == call + "\nAnswer: 42"


def test_segments_are_joined_so_that_each_after_a_call_starts_a_line() -> None:
    from comlrl.algos.rollout.tool_calls import join_segments

    assert join_segments(["a```", "Answer: 1"]) == "a```\nAnswer: 1"
    assert join_segments(["a```\n", "Answer: 1"]) == "a```\nAnswer: 1"
    assert join_segments(["a```", "\nAnswer: 1"]) == "a```\nAnswer: 1"
    assert join_segments(["only"]) == "only" and join_segments([]) == ""


@pytest.mark.parametrize("fmt", ["python", "template"])
def test_a_long_result_is_cut_inside_an_observation_that_stays_closed(
    tiny_model: Any, tiny_tokenizer: Any, fmt: str
) -> None:
    long = " ".join(f"line{i}" for i in range(400))  # ~3000 characters
    tool = Tool("python", "d", CODE, run=lambda code: long, max_result_chars=10_000)
    seen = "```output\n" if fmt == "python" else "<tool_response>\n"
    call = (
        "```python\nprint(1)\n```"
        if fmt == "python"
        else '<tool_call>{"name": "python", "arguments": {"code": "x"}}</tool_call>'
    )
    tok = tiny_tokenizer
    old = tok.chat_template
    if fmt == "template":
        tok.chat_template = _hermes_template()
    try:
        agent = HFAgent(
            tiny_model,
            tok,
            backend=ScriptedBackend(
                tok, lambda ctx: "Answer: 1" if seen + "line0" in ctx else call
            ),
            prompt_format="chat" if fmt == "template" else "raw",
        )
        samples = sample_with_tools(
            agent, ["q"], SamplingParams(1, 64), _box(tool, max_result_tokens=48)
        )
    finally:
        tok.chat_template = old
    c = samples.completions[0][0]
    (result,) = c.tool_results
    kept = result.content.split("\n[... ")[0]
    assert long.startswith(kept) and 0 < len(kept) < len(long)
    assert result.content.endswith(f"\n[... {len(long) - len(kept)} characters cut]")
    batch = samples.batch
    s = batch.prompt_length
    attended = batch.attention_mask[0, s:].bool()
    obs = batch.input_ids[0, s:][(~batch.completion_mask[0]) & attended]
    assert result.result_tokens == len(obs) <= 48
    text = tok.decode(obs.tolist())
    # the observation is whole: the content as cut, then its closing markup
    closing = (
        "\n```\n" if fmt == "python" else "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert text.endswith(result.content + closing), text[-120:]
    assert c.text == call + "\nAnswer: 1" and c.finished


def test_a_result_that_fits_is_not_cut(tiny_tokenizer: Any) -> None:
    from comlrl.algos.rollout.toolbox import observation_ids
    from comlrl.core import PythonBlockFormat, ToolCall, ToolResult

    result = ToolResult(ToolCall("python", {}, "c"), "42")
    same, ids = observation_ids(tiny_tokenizer, "q", PythonBlockFormat(), False, result, 256)
    assert same is result
    assert tiny_tokenizer.decode(ids) == "\n```output\n42\n```\n"


def test_a_sentencepiece_tokenizer_stops_a_row_only_at_a_call_its_exact_text_holds() -> None:
    # stories260k's SentencePiece vocabulary decodes the lone token "▁py" as "py": text made
    # of single-token decodes reads "```py" where the model wrote "``` py" (no call)
    from comlrl.algos.models.loading import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("builtin:stories260k")
    ran: list[str] = []

    def record(code: str) -> str:
        ran.append(code)
        return "1"

    reply = "Look.\n``` py\nprint(1)\n```\nAnswer: 1"
    assert "```py" in "".join(
        tok.decode([i]) for i in tok(reply, add_special_tokens=False)["input_ids"]
    )
    backend = ScriptedBackend(tok, lambda ctx: reply, supports_stop=True)
    agent = HFAgent(model, tok, backend=backend, prompt_format="raw")
    box = _box(Tool("python", "d", CODE, run=record))
    c = sample_with_tools(agent, ["Once"], SamplingParams(1, 64), box).completions[0][0]
    assert ran == [] and c.tool_results == ()
    assert c.text == reply and c.finished
