"""langchain-openai's ChatOpenAI through capmon.httpx_client() (the one changed line in
docs/sdk.md): its answer comes from the process's engine, which fell back from a model at capacity.
Needs the ``langchain`` extra (``pip install -e '.[test,langchain]'``, as CI does)."""

from __future__ import annotations

from pathlib import Path

import pytest

import capmon
from tests.sdk.helpers import ANSWER_TOKENS, config

langchain_openai = pytest.importorskip("langchain_openai")


def test_chat_openai_through_capmons_httpx_client(tmp_path: Path) -> None:
    cfg = config(tmp_path, full=("flagship",))
    llm = langchain_openai.ChatOpenAI(
        model="auto", api_key="unused", max_retries=0, http_client=capmon.httpx_client(cfg)
    )
    answer = llm.invoke("Say something about capacity.")
    assert len(str(answer.content).split()) == ANSWER_TOKENS
    assert answer.response_metadata["model_name"] == "sim-claude"  # flagship was full: it fell back
    engine = capmon.inprocess.engine()
    assert engine is not None and engine.client.snapshot().succeeded == 1
