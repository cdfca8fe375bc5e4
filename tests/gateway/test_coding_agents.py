"""The coding agents on their defaults against `capmon serve` on the shipped config, as a user
runs it (a real process, the real SDKs): Claude Code's own model names (claude-opus-4-8, its
small model for side tasks), Codex CLI's (gpt-6.2-sol on 0.171) and Gemini's are served through
the shipped `[gateway.aliases]` patterns, each answer naming the model that served and the name
asked for; the configured names still win. Claude Code's tool loop, whose conversation ends
with a system message after the user's words, runs to its end whichever wire serves it."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai

from tests.gateway.helpers import serve_process
from tests.support import claude_code
from tests.support.configs import shipped_config
from tests.support.scripted import free_port

# The shipped models, answering at once, each with room for Claude Code's max_tokens.
SCENARIO = 'name = "agents"\n' + "".join(
    f'[[models]]\nname = "sim-{m}"\nslots = 16\nbase_latency = 0.02\nper_token = 0.0\nnoise = 0.0\n'
    f"answer_tokens = 8\ncontext_window = 200000\n{api}"
    for m, api in (("flagship", ""), ("claude", 'api = "anthropic"\n'), ("medium", ""), ("small", ""))
)
SAY_HI: Any = [{"role": "user", "content": "Say hi"}]


@dataclass(frozen=True)
class Served:
    origin: str  # the gateway's
    sim: int  # the embedded simulator's port


@contextlib.contextmanager
def capmon_serve(tmp_path: Path) -> Iterator[Served]:
    config, sim = shipped_config(tmp_path, SCENARIO)
    port = free_port()
    proc = serve_process(config, port, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert "aliases: auto, claude-*, gpt-*, gemini-*;" in banner, proc.stderr.read() if proc.stderr else banner
        yield Served(f"http://127.0.0.1:{port}", sim)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in err, err


def claude(served: Served) -> anthropic.Anthropic:
    # what Claude Code sends with ANTHROPIC_AUTH_TOKEN: any token on a gateway without client keys
    return anthropic.Anthropic(base_url=served.origin, auth_token="unused", max_retries=0)


def _loop(client: anthropic.Anthropic) -> tuple[httpx.Headers, anthropic.types.Message, anthropic.types.Message]:
    """Claude Code's tool loop: its first turn, then the tool's result; both streamed, as it streams."""
    body: Any = claude_code.request(claude_code.first_turn())
    with client.messages.stream(**body) as s:
        headers, first = s.response.headers, s.get_final_message()
    call = next(b for b in first.content if b.type == "tool_use")
    assert first.stop_reason == "tool_use" and call.name == "Bash", first
    body = claude_code.request(claude_code.after_call(call.model_dump()))
    with client.messages.stream(**body) as s:
        second = s.get_final_message()
    return headers, first, second


def test_claude_codes_default_names_are_served_on_the_shipped_config(tmp_path: Path) -> None:
    with capmon_serve(tmp_path) as served, claude(served) as client:
        opus = client.messages.with_raw_response.create(model=claude_code.MODEL, max_tokens=64, messages=SAY_HI)
        with client.messages.stream(model=claude_code.SMALL_MODEL, max_tokens=64, messages=SAY_HI) as s:
            small_headers, small = s.response.headers, s.get_final_message()
        own = client.messages.with_raw_response.create(model="claude", max_tokens=64, messages=SAY_HI)
        listed = httpx.get(f"{served.origin}/v1/models/{claude_code.MODEL}").json()
    assert opus.status_code == 200
    assert (opus.headers["x-capmon-model"], opus.headers["x-capmon-requested-model"]) == ("flagship", claude_code.MODEL)
    assert opus.parse().model == "sim-flagship" and opus.parse().content[0].type == "text"  # the model that served
    assert (small_headers["x-capmon-model"], small_headers["x-capmon-requested-model"]) == (
        "flagship",
        claude_code.SMALL_MODEL,
    )
    assert small.model == "sim-flagship" and small.stop_reason in ("end_turn", "max_tokens")
    # the configured name is no pattern's: served by that model, on Anthropic's wire
    assert (own.headers["x-capmon-model"], own.headers["x-capmon-api"]) == ("claude", "anthropic")
    assert listed["capmon_pattern"] == "claude-*" and listed["capmon_alias_of"] is None


def test_codex_and_gemini_default_names_are_served_on_the_shipped_config(tmp_path: Path) -> None:
    with capmon_serve(tmp_path) as served:
        sdk = openai.OpenAI(base_url=f"{served.origin}/v1", api_key="unused", max_retries=0)
        codex = sdk.responses.with_raw_response.create(model="gpt-6.2-sol", input="Say hi")
        gemini = sdk.chat.completions.with_raw_response.create(model="gemini-2.5-pro", messages=SAY_HI)
        # Gemini CLI speaks Google's own format (the model in the path), answered in it
        google = httpx.post(
            f"{served.origin}/v1beta/models/gemini-2.5-pro:generateContent",
            json={"contents": [{"parts": [{"text": "hi"}]}]},
        )
    assert (codex.headers["x-capmon-model"], codex.headers["x-capmon-requested-model"]) == ("flagship", "gpt-6.2-sol")
    assert codex.parse().model == "sim-flagship" and codex.parse().output_text
    assert (gemini.headers["x-capmon-model"], gemini.headers["x-capmon-requested-model"]) == (
        "flagship",
        "gemini-2.5-pro",
    )
    assert google.status_code == 200 and google.headers["x-capmon-model"] == "flagship"
    assert google.headers["x-capmon-requested-model"] == "gemini-2.5-pro"
    assert google.json()["candidates"][0]["content"]["parts"][0]["text"]


def test_claude_codes_tool_loop_runs_through_the_gateway_on_either_wire(tmp_path: Path) -> None:
    with capmon_serve(tmp_path) as served, claude(served) as client:
        chat_headers, chat_call, chat_end = _loop(client)  # flagship: chat completions, translated both ways
        outage = httpx.post(f"http://127.0.0.1:{served.sim}/admin/outage/sim-flagship", json={"duration": 600})
        outage.raise_for_status()
        messages_headers, messages_call, messages_end = _loop(client)  # claude: Anthropic's own wire
    assert (chat_headers["x-capmon-model"], chat_headers["x-capmon-api"]) == ("flagship", "openai")
    assert (messages_headers["x-capmon-model"], messages_headers["x-capmon-api"]) == ("claude", "anthropic")
    for call, end in ((chat_call, chat_end), (messages_call, messages_end)):
        [block] = [b for b in call.content if b.type == "tool_use"]
        assert block.input == {"command": "echo hello"}  # valid against Bash's schema: its one required field
        assert json.loads(json.dumps(block.input)) == block.input
        assert end.stop_reason == "end_turn" and [b.type for b in end.content] == ["text"]
        assert "hello-from-ls" in end.content[0].text  # type: ignore[union-attr]  # the answer quotes the result
