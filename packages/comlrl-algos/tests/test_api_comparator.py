"""The HTTP comparator (comlrl.algos.recipes.preference.iterative.api_comparator): request bodies,
reply parsing and key headers per format, request splitting, errors, and a real local
HTTP server answering it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from comlrl.algos.recipes.preference.iterative.api_comparator import (
    ApiAgent,
    ApiComparatorClient,
    ApiComparatorConfig,
    ApiComparatorError,
    post_json,
)
from comlrl.core import SamplingParams

PARAMS = SamplingParams(num_generations=3, max_new_tokens=7, temperature=0.5, top_p=0.9, top_k=4)


class _Recorder:
    """A ``send`` that records each request and answers from a list of replies."""

    def __init__(self, *replies: Any) -> None:
        self.replies, self.requests = list(replies), []  # type: ignore[var-annotated]

    def __call__(
        self, url: str, body: Mapping[str, Any], headers: Mapping[str, str], t: float
    ) -> Any:
        self.requests.append((url, dict(body), dict(headers), t))
        return self.replies.pop(0)


def test_generic_body_carries_the_sampling_and_the_example_and_reads_the_named_field() -> None:
    send = _Recorder({"data": {"outs": [{"text": "a"}, "b", {"message": {"content": "c"}}]}})
    client = ApiComparatorClient(
        ApiComparatorConfig("http://x/c", response_field="data.outs", extra_body={"seed": 3}),
        send,
    )
    assert client.complete("hi", 3, PARAMS, agent_idx=1, example={"id": (1, 2)}) == ["a", "b", "c"]
    (url, body, headers, timeout) = send.requests[0]
    assert url == "http://x/c" and timeout == 120.0
    assert body == {
        "prompt": "hi", "agent_idx": 1, "num_return_sequences": 3, "max_new_tokens": 7,
        "temperature": 0.5, "top_p": 0.9, "top_k": 4, "batch_item": {"id": [1, 2]}, "seed": 3,
    }  # fmt: skip
    assert headers == {"Content-Type": "application/json"}


def test_generic_reply_without_the_field_falls_back_to_the_usual_keys() -> None:
    client = ApiComparatorClient(ApiComparatorConfig("http://x"), _Recorder({"outputs": ["z"]}))
    assert client.complete("p", 1, PARAMS) == ["z"]


def test_openai_chat_asks_n_per_request_up_to_the_cap_and_sends_the_key() -> None:
    choice = {"message": {"content": "ok"}}
    send = _Recorder({"choices": [choice, choice]}, {"choices": [choice]})
    config = ApiComparatorConfig(
        "http://x", format="openai", model="m", api_key="k", max_n_per_request=2
    )
    assert config.format == "openai_chat"
    assert ApiComparatorClient(config, send).complete("hi", 3, PARAMS) == ["ok"] * 3
    bodies = [r[1] for r in send.requests]
    assert [b["n"] for b in bodies] == [2, 1]
    assert bodies[0]["messages"] == [{"role": "user", "content": "hi"}]
    assert bodies[0]["max_tokens"] == 7 and bodies[0]["model"] == "m"
    assert send.requests[0][2]["Authorization"] == "Bearer k"


def test_anthropic_messages_one_per_request_with_its_key_header(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CMP_KEY", "secret")
    reply = {"content": [{"type": "text", "text": "t"}, {"type": "tool_use", "text": "no"}]}
    send = _Recorder(reply, reply)
    config = ApiComparatorConfig("http://x", format="messages", model="m", api_key_env="CMP_KEY")
    assert ApiComparatorClient(config, send).complete("hi", 2, PARAMS) == ["t", "t"]
    headers = send.requests[0][2]
    assert headers["x-api-key"] == "secret" and "Authorization" not in headers
    assert headers["anthropic-version"] == "2023-06-01"
    assert "n" not in send.requests[0][1]


def test_openai_responses_reads_output_text_blocks() -> None:
    reply = {"output": [{"content": [{"type": "output_text", "text": "r"}]}, "junk"]}
    client = ApiComparatorClient(ApiComparatorConfig("http://x", format="codex"), _Recorder(reply))
    assert client.complete("hi", 1, PARAMS) == ["r"]


def test_a_reply_without_completions_and_bad_settings_are_named() -> None:
    client = ApiComparatorClient(ApiComparatorConfig("http://x"), _Recorder({"other": 1}))
    with pytest.raises(ApiComparatorError, match="returned no completion"):
        client.complete("hi", 1, PARAMS)
    with pytest.raises(ValueError, match="format='soap'"):
        ApiComparatorConfig("http://x", format="soap")
    with pytest.raises(ValueError, match="needs a url"):
        ApiComparatorConfig("")
    with pytest.raises(ValueError, match="max_n_per_request"):
        ApiComparatorConfig("http://x", max_n_per_request=0)


class _Handler(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        if body.get("prompt") == "fail":
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"overloaded")
            return
        n = int(body["num_return_sequences"])
        reply = json.dumps({"completions": [f"yes {i}" for i in range(n)]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.seen = []
    httpd = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/complete"
    finally:
        httpd.shutdown()
        thread.join()


def test_post_json_talks_to_a_real_server_and_reports_its_errors(server: str) -> None:
    assert post_json(server, {"prompt": "p", "num_return_sequences": 2}, {}, 5.0) == {
        "completions": ["yes 0", "yes 1"]
    }
    with pytest.raises(ApiComparatorError, match="HTTP 503: overloaded"):
        post_json(server, {"prompt": "fail"}, {}, 5.0)
    with pytest.raises(ApiComparatorError, match="unreachable"):
        post_json("http://127.0.0.1:9/none", {}, {}, 2.0)


def test_api_agent_returns_token_ids_ending_in_eos(server: str) -> None:
    class _Tok:
        eos_token_id, pad_token_id = 0, 0

        def __call__(self, text: str, add_special_tokens: bool) -> dict[str, list[int]]:
            assert add_special_tokens is False
            return {"input_ids": [len(w) for w in text.split()]}

    agent = ApiAgent(ApiComparatorClient(ApiComparatorConfig(server)), _Tok(), agent_idx=1)
    groups = agent.generate(["hello"], SamplingParams(num_generations=2, max_new_tokens=4))
    assert [[c.text for c in g] for g in groups] == [["yes 0", "yes 1"]]
    assert [list(c.token_ids) for c in groups[0]] == [[3, 1, 0], [3, 1, 0]]
    assert _Handler.seen[0]["agent_idx"] == 1 and _Handler.seen[0]["prompt"] == "hello"
