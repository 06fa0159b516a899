"""Suites without a shipped copy (gsm8k, tldr, arxiv) say so, and fail at once offline.

Without ``path=`` these suites fetch their Hugging Face dataset; on a machine without the
network ``datasets`` retried for about 30 s before failing. ``hub_rows`` now tries one TCP
connection first and fails with a message naming ``task.kwargs.path=``.
"""

from __future__ import annotations

import socket
import sys
import types
from typing import Any

import pytest
from comlrl.envs.math.gsm8k import Gsm8kTask
from comlrl.envs.writing import _files
from comlrl.envs.writing.tasks import ArxivTask, TldrTask


@pytest.fixture
def fake_datasets(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """A stand-in ``datasets`` module that records its calls and returns two rows."""
    calls: list[tuple[Any, ...]] = []

    def load_dataset(name: str, config: str | None = None, *, split: str) -> list[dict[str, Any]]:
        calls.append((name, config, split))
        return [{"question": "1+1?", "answer": "#### 2"}, {"question": "2+2?", "answer": "#### 4"}]

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", module)
    for var in (*_files._OFFLINE_VARS, *_files._PROXY_VARS, "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    return calls


def _no_network(address: tuple[str, int], timeout: float | None = None) -> socket.socket:
    raise socket.gaierror(-2, "Name or service not known")


def test_an_unreachable_hub_fails_before_datasets_is_asked(
    fake_datasets: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "create_connection", _no_network)
    with pytest.raises(FileNotFoundError) as err:
        Gsm8kTask().load("train")
    message = str(err.value)
    assert "task.kwargs.path=" in message and "huggingface.co:443" in message
    assert "'openai/gsm8k'" in message and "HF_HUB_OFFLINE=1" in message
    assert fake_datasets == []  # no retries: datasets was never called


def test_offline_mode_and_a_proxy_skip_the_probe(
    fake_datasets: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "create_connection", _no_network)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the datasets cache answers
    assert len(Gsm8kTask().load("test")) == 2
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")  # only the proxy can tell
    assert len(Gsm8kTask().load("test")) == 2
    assert fake_datasets == [("openai/gsm8k", "main", "test")] * 2


def test_the_probe_connects_to_hf_endpoint(
    fake_datasets: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int]] = []

    class _Conn:
        def __enter__(self) -> _Conn:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    def connect(address: tuple[str, int], timeout: float | None = None) -> _Conn:
        seen.append(address)
        return _Conn()

    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.local:8080")
    assert len(Gsm8kTask().load("train")) == 2
    assert seen == [("mirror.local", 8080)]


@pytest.mark.parametrize("task", [Gsm8kTask, TldrTask, ArxivTask])
def test_suites_without_a_shipped_copy_say_where_their_data_comes_from(task: type) -> None:
    source = getattr(task, "data_source", "")
    assert "task.kwargs.path=" in source and "Hub" in source
