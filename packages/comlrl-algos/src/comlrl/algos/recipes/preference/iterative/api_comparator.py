"""A comparator policy behind an HTTP API: the rounds of iterative preference refresh
(:mod:`.rounds`) compare the current agents' joint actions with completions a served model
writes for the same prompts (CoMLRL 1.4.3's ``comparator_policy="api"``).

Four request formats (:data:`API_FORMATS`; aliases in :data:`FORMAT_ALIASES`):

- ``generic``: ``POST {"prompt", "agent_idx", "num_return_sequences", "max_new_tokens",
  "temperature", "top_p", "top_k", "batch_item"?, "model"?}``; the completions are read
  from ``response_field`` (a dotted path, default ``completions``), else from the first of
  ``completions`` / ``responses`` / ``outputs`` / ``choices``: a string, or a list of
  strings or of objects with ``text`` / ``content`` / ``completion`` / ``response`` /
  ``message.content``.
- ``openai_chat``: an OpenAI Chat Completions body (the prompt as one user message, ``n``
  completions per request); ``choices[i].message.content`` (or ``.text``).
- ``anthropic_messages``: an Anthropic Messages body, one completion per request; the
  ``text`` blocks of ``content``.
- ``openai_responses``: an OpenAI Responses body, one completion per request; the
  ``output_text`` / ``text`` blocks of ``output[i].content``.

``extra_body`` is merged into every body last. Authentication: ``api_key`` (or the
environment variable ``api_key_env``) sent as ``key_header: key_prefix key``; for
``anthropic_messages`` an ``Authorization``/``Bearer`` default becomes ``x-api-key`` with
no prefix, and ``anthropic-version: 2023-06-01`` is set unless given.

:class:`ApiAgent` is a :class:`comlrl.core.Agent` over a client, so :func:`~comlrl.algos.rollout.tree.rollout`
samples it like a model: its completions are tokenized with the compared agent's tokenizer
(EOS appended: a served answer is finished) and carry no behaviour log-probs.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from comlrl.core import Completion, SamplingParams
from comlrl.core.prompts import Prompt, prompt_text

__all__ = [
    "API_FORMATS",
    "FORMAT_ALIASES",
    "ApiComparatorConfig",
    "ApiComparatorError",
    "ApiComparatorClient",
    "ApiAgent",
    "post_json",
]

API_FORMATS = ("generic", "openai_chat", "anthropic_messages", "openai_responses")
#: accepted spellings of each format (1.4.3's)
FORMAT_ALIASES = {
    "generic": "generic",
    "openai": "openai_chat",
    "openai_chat": "openai_chat",
    "chat": "openai_chat",
    "anthropic": "anthropic_messages",
    "anthropic_messages": "anthropic_messages",
    "messages": "anthropic_messages",
    "openai_responses": "openai_responses",
    "responses": "openai_responses",
    "codex": "openai_responses",
}
#: formats whose request returns one completion (no ``n``)
_ONE_PER_REQUEST = ("anthropic_messages", "openai_responses")


class ApiComparatorError(RuntimeError):
    """The comparator API failed: an HTTP error (its status and body), an unreachable
    server, a reply that is not JSON, or a reply without completions."""


@dataclass(frozen=True)
class ApiComparatorConfig:
    """Where and how to ask the comparator API (see the module docstring).

    Attributes:
        url: the endpoint (``POST``).
        format: one of :data:`API_FORMATS` or an alias (stored canonical).
        model: the served model's name (required by the OpenAI and Anthropic bodies).
        headers: extra request headers.
        api_key, api_key_env: the key, or the environment variable holding it.
        key_header, key_prefix: how the key is sent.
        response_field: ``generic``: dotted path of the completions in the reply.
        extra_body: merged into every request body.
        timeout: seconds per request (> 0).
        max_n_per_request: completions asked for per request (``None``: all at once;
            the one-per-request formats always ask for one).

    Raises:
        ValueError: an empty ``url``, an unknown ``format``, ``timeout <= 0`` or
            ``max_n_per_request < 1``.
    """

    url: str
    format: str = "generic"
    model: str | None = None
    headers: Mapping[str, str] | None = None
    api_key: str | None = None
    api_key_env: str | None = None
    key_header: str = "Authorization"
    key_prefix: str = "Bearer"
    response_field: str | None = "completions"
    extra_body: Mapping[str, Any] | None = field(default=None)
    timeout: float = 120.0
    max_n_per_request: int | None = None

    def __post_init__(self) -> None:
        if not str(self.url or "").strip():
            raise ValueError("the API comparator needs a url (comparator_api_url), got none")
        name = str(self.format or "generic").strip().lower()
        if name not in FORMAT_ALIASES:
            raise ValueError(
                f"comparator API format={self.format!r}; use one of {sorted(FORMAT_ALIASES)}"
            )
        object.__setattr__(self, "format", FORMAT_ALIASES[name])
        if not float(self.timeout) > 0:
            raise ValueError(f"comparator API timeout must be > 0 seconds, got {self.timeout!r}")
        if self.max_n_per_request is not None and int(self.max_n_per_request) < 1:
            raise ValueError(
                f"comparator API max_n_per_request must be >= 1 or None, got "
                f"{self.max_n_per_request!r}"
            )


def post_json(url: str, body: Mapping[str, Any], headers: Mapping[str, str], timeout: float) -> Any:
    """``POST`` ``body`` as JSON to ``url`` and return the parsed JSON reply.

    Raises:
        ApiComparatorError: an HTTP error status (with the reply's text), no connection,
            or a reply that is not JSON.
    """
    data = json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, headers=dict(headers), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            text = reply.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", errors="replace")[:500]
        raise ApiComparatorError(
            f"comparator API {url} answered HTTP {exc.code}: {detail}"
        ) from exc
    except urllib.error.URLError as exc:
        raise ApiComparatorError(f"comparator API {url} unreachable: {exc.reason}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiComparatorError(
            f"comparator API {url} answered with something other than JSON: {text[:200]!r}"
        ) from exc


def _plain(value: Any) -> Any:
    """``value`` with what JSON cannot write turned into numbers (tensors, numpy scalars)
    or strings."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def _texts(value: Any) -> list[str]:
    """Completion texts from a reply value (see the ``generic`` format)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        return [str(value)]
    out = []
    for entry in value:
        if isinstance(entry, Mapping):
            text = next(
                (
                    entry[k]
                    for k in ("text", "content", "completion", "response")
                    if entry.get(k) is not None
                ),  # fmt: skip
                None,
            )
            message = entry.get("message")
            if text is None and isinstance(message, Mapping):
                text = message.get("content")
            if text is not None:
                out.append(str(text))
        elif entry is not None:
            out.append(str(entry))
    return out


def _blocks(items: Any, kinds: Sequence[str]) -> list[str]:
    """The ``text`` of every block in ``items`` whose ``type`` is one of ``kinds``."""
    if not isinstance(items, list):
        return []
    return [
        str(b["text"])
        for b in items
        if isinstance(b, Mapping) and b.get("type") in kinds and b.get("text") is not None
    ]


class ApiComparatorClient:
    """Asks the comparator API for completions of one prompt.

    Args:
        config: where and how.
        send: ``(url, body, headers, timeout) -> parsed reply`` (:func:`post_json`; a test
            or another transport may stand in).
    """

    def __init__(
        self,
        config: ApiComparatorConfig,
        send: Callable[[str, Mapping[str, Any], Mapping[str, str], float], Any] = post_json,
    ) -> None:
        self.config, self.send = config, send

    def headers(self) -> dict[str, str]:
        """The request headers (see the module docstring for the key rules)."""
        c = self.config
        out = {"Content-Type": "application/json", **dict(c.headers or {})}
        anthropic = c.format == "anthropic_messages"
        if anthropic:
            out.setdefault("anthropic-version", "2023-06-01")
        key = c.api_key or (os.environ.get(c.api_key_env) if c.api_key_env else None)
        if key:
            header, prefix = str(c.key_header or "Authorization"), str(c.key_prefix or "").strip()
            if anthropic and header.lower() == "authorization":
                header = "x-api-key"
            if anthropic and prefix.lower() == "bearer":
                prefix = ""
            out[header] = f"{prefix} {key}" if prefix else str(key)
        return out

    def body(
        self,
        prompt: str,
        n: int,
        params: SamplingParams,
        *,
        agent_idx: int = 0,
        example: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One request's body asking for ``n`` completions of ``prompt``."""
        c = self.config
        user = [{"role": "user", "content": prompt}]
        body: dict[str, Any]
        if c.format == "openai_chat":
            body = {"model": c.model, "messages": user, "n": n, "max_tokens": params.max_new_tokens,
                    "temperature": params.temperature, "top_p": params.top_p}  # fmt: skip
        elif c.format == "anthropic_messages":
            body = {"model": c.model, "messages": user, "max_tokens": params.max_new_tokens,
                    "temperature": params.temperature}  # fmt: skip
        elif c.format == "openai_responses":
            body = {"model": c.model, "input": prompt, "max_output_tokens": params.max_new_tokens}
        else:
            body = {
                "prompt": prompt,
                "agent_idx": int(agent_idx),
                "num_return_sequences": n,
                "max_new_tokens": params.max_new_tokens,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k,
                "model": c.model,
            }
            if example is not None:
                body["batch_item"] = _plain(example)
        body.update(dict(c.extra_body or {}))
        return {k: v for k, v in body.items() if v is not None}

    def completions_of(self, reply: Any) -> list[str]:
        """The completion texts of one reply (empty when it holds none)."""
        fmt = self.config.format
        if not isinstance(reply, Mapping):
            return _texts(reply) if fmt == "generic" else []
        if fmt == "openai_chat":
            return _texts(reply.get("choices"))
        if fmt == "anthropic_messages":
            return _blocks(reply.get("content"), ("text",))
        if fmt == "openai_responses":
            output = reply.get("output")
            items = output if isinstance(output, list) else []
            return [t for item in items if isinstance(item, Mapping)
                    for t in _blocks(item.get("content"), ("output_text", "text"))]  # fmt: skip
        value: Any = reply
        for part in str(self.config.response_field or "").split("."):
            value = value.get(part) if isinstance(value, Mapping) and part else None
        if value is None:
            value = next(
                (
                    reply[k]
                    for k in ("completions", "responses", "outputs", "choices")
                    if reply.get(k)
                ),
                None,
            )
        return _texts(value)

    def complete(
        self,
        prompt: str,
        n: int,
        params: SamplingParams,
        *,
        agent_idx: int = 0,
        example: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """``n`` completions of ``prompt``, in as many requests as the format and
        ``max_n_per_request`` need (a reply with more than asked is cut to ``n``).

        Raises:
            ApiComparatorError: a request failed or a reply held no completion.
        """
        c = self.config
        per = 1 if c.format in _ONE_PER_REQUEST else min(int(c.max_n_per_request or n), n)
        out: list[str] = []
        while len(out) < n:
            ask = min(per, n - len(out))
            body = self.body(prompt, ask, params, agent_idx=agent_idx, example=example)
            got = self.completions_of(self.send(c.url, body, self.headers(), float(c.timeout)))
            if not got:
                raise ApiComparatorError(
                    f"comparator API {c.url} ({c.format}) returned no completion for a request "
                    f"of {ask}; check comparator_api_format / comparator_api_response_field"
                )
            out.extend(got[:ask])
        return out


class ApiAgent:
    """A :class:`comlrl.core.Agent` whose completions come from an :class:`ApiComparatorClient`:
    the comparator of agent ``agent_idx`` (for one joint actor: 0).

    Args:
        client: the API client.
        tokenizer: the compared agent's tokenizer (the completions are tokenized with it,
            EOS appended, so the pairs train that agent).
        agent_idx: sent in ``generic`` bodies.
        name: for logs.

    Raises:
        ValueError: a tokenizer with neither an EOS nor a pad token.
    """

    def __init__(
        self, client: ApiComparatorClient, tokenizer: Any, agent_idx: int = 0, name: str = ""
    ) -> None:
        self.client, self.tokenizer, self.agent_idx = client, tokenizer, int(agent_idx)
        self.name = name or f"api_comparator_{agent_idx}"
        self.model = None  # no local weights: collated on the CPU
        eos = (
            tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
        )
        if eos is None:
            raise ValueError(f"{self.name}: the tokenizer has neither an EOS nor a pad token")
        self.eos = int(eos)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Completion]]:
        """``params.num_generations`` API completions per prompt.

        Raises:
            ApiComparatorError: as :meth:`ApiComparatorClient.complete`.
        """
        groups = []
        for prompt in prompts:
            texts = self.client.complete(
                prompt_text(prompt), params.num_generations, params, agent_idx=self.agent_idx
            )
            groups.append([self._completion(t) for t in texts])
        return groups

    def _completion(self, text: str) -> Completion:
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.eos]
        return Completion(text=text, token_ids=ids, logprobs=None, finished=True)
