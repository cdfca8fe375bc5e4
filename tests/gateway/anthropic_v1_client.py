"""Run by tests/gateway/test_anthropic_sdk_v1.py in a subprocess whose path holds the
anthropic SDK 1.x (it sends anthropic-version 2023-06-01 and x-api-key): argv is the
gateway's origin and a client key; prints what it saw as one JSON object."""

from __future__ import annotations

import json
import sys

import anthropic

HI = [{"role": "user", "content": "Say something about capacity."}]
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def main(origin: str, key: str) -> None:
    sdk = anthropic.Anthropic(base_url=origin, api_key=key, max_retries=0)
    out: dict[str, object] = {"version": anthropic.__version__}
    raw = sdk.messages.with_raw_response.create(model="auto", max_tokens=50, messages=HI)
    plain = raw.parse()
    out["sent"] = {k: raw.http_request.headers.get(k) for k in ("anthropic-version", "x-api-key", "authorization")}
    out["plain"] = {"text": plain.content[0].text, "stop": plain.stop_reason, "usage": plain.usage.output_tokens}
    out["served"] = raw.headers["x-capmon-model"]
    with sdk.messages.stream(model="auto", max_tokens=5, messages=HI) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    out["stream"] = {"text": text, "stop": final.stop_reason, "usage": final.usage.output_tokens}
    events = list(
        sdk.messages.create(
            model="auto", max_tokens=50, messages=HI, tools=[TOOL], tool_choice={"type": "any"}, stream=True
        )
    )
    pieces = [
        e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    stops = [e.delta.stop_reason for e in events if e.type == "message_delta"]
    out["tool"] = {"input": json.loads("".join(pieces)), "stop": stops, "last": events[-1].type}
    out["count"] = sdk.messages.count_tokens(model="auto", messages=HI).input_tokens
    errors = {}
    for name, call in (
        ("unknown", lambda: sdk.messages.create(model="nope", max_tokens=5, messages=HI)),
        ("bad", lambda: sdk.messages.create(model="auto", max_tokens=0, messages=HI)),
        ("auth", lambda: sdk.with_options(api_key="sk-wrong").messages.create(model="auto", max_tokens=5, messages=HI)),
    ):
        try:
            call()
            errors[name] = "no error"
        except anthropic.APIStatusError as e:
            errors[name] = type(e).__name__
    out["errors"] = errors
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
