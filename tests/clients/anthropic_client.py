"""Drives Hearth's Anthropic Messages routes with the official `anthropic` package, as a user's
program (or a coding agent) would, and prints what it saw as one JSON object (the Rust test,
tests/anthropic.rs, asserts on it). Every case runs against the real server the test started.

    python anthropic_client.py --base-url http://127.0.0.1:PORT --key TOKEN --poor-key TOKEN \
        --model alpha-3.3 --cases messages,stream,stop,tools,count,errors
"""
import argparse
import json
import sys

import anthropic
import jsonschema

SYSTEM = "You are a helpful assistant."
# The client's typed parameters no longer carry sampling fields; the API still reads them.
GREEDY = {"temperature": 0}

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather now in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def blocks(message):
    return [b.model_dump() for b in message.content]


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def messages(client, model):
    m = client.messages.create(model=model, system=SYSTEM, messages=QUESTION, extra_body=GREEDY, max_tokens=24)
    # System as text blocks, and the token as a bearer header (auth_token) instead of x-api-key.
    return {
        "id": m.id,
        "type": m.type,
        "role": m.role,
        "model": m.model,
        "text": text_of(m),
        "blocks": blocks(m),
        "stop_reason": m.stop_reason,
        "stop_sequence": m.stop_sequence,
        "usage": m.usage.model_dump(exclude_none=True),
    }


def system_blocks_and_bearer(base_url, key, model):
    client = anthropic.Anthropic(base_url=base_url, auth_token=key, api_key=None, max_retries=0)
    m = client.messages.create(model=model, messages=QUESTION, extra_body=GREEDY, max_tokens=24,
                               system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}])
    return {"text": text_of(m)}


def stream(client, model):
    kinds = []
    text = ""
    with client.messages.stream(model=model, system=SYSTEM, messages=QUESTION, extra_body=GREEDY,
                                max_tokens=24) as s:
        for event in s:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
        final = s.get_final_message()
    return {"events": kinds, "text": text, "final_text": text_of(final), "stop_reason": final.stop_reason,
            "usage": final.usage.model_dump(exclude_none=True)}


def stop(client, model, sequence):
    m = client.messages.create(model=model, system=SYSTEM, messages=QUESTION, extra_body=GREEDY, max_tokens=24,
                               stop_sequences=["never generated \u2603", sequence])
    short = client.messages.create(model=model, system=SYSTEM, messages=QUESTION, extra_body=GREEDY, max_tokens=3)
    return {"text": text_of(m), "stop_reason": m.stop_reason, "stop_sequence": m.stop_sequence,
            "short_reason": short.stop_reason, "short_tokens": short.usage.output_tokens}


def tools(client, model):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(model=model, messages=ask, max_tokens=64, extra_body=GREEDY, tools=[WEATHER_TOOL],
                                   tool_choice={"type": "tool", "name": "get_weather"})
    call = next(b for b in first.content if b.type == "tool_use")
    # The tool's answer goes back as a tool_result block; the model then answers in text.
    follow = ask + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": [{"type": "text", "text": "Sunny, 24 degrees."}]}]},
    ]
    answer = client.messages.create(model=model, messages=follow, max_tokens=32, extra_body=GREEDY, tools=[WEATHER_TOOL])
    anyc = client.messages.create(model=model, messages=ask, max_tokens=64, extra_body=GREEDY, tools=[WEATHER_TOOL],
                                  tool_choice={"type": "any"})
    any_call = next(b for b in anyc.content if b.type == "tool_use")
    deltas = 0
    with client.messages.stream(model=model, messages=ask, max_tokens=64, extra_body=GREEDY, tools=[WEATHER_TOOL],
                                tool_choice={"type": "tool", "name": "get_weather"}) as s:
        for event in s:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                deltas += 1
        streamed = s.get_final_message()
    streamed_call = next(b for b in streamed.content if b.type == "tool_use")
    return {
        "stop_reason": first.stop_reason,
        "name": call.name,
        "id": call.id,
        "input": call.input,
        "answer_stop_reason": answer.stop_reason,
        "answer": text_of(answer),
        "any_name": any_call.name,
        "any_input": any_call.input,
        "streamed": {"name": streamed_call.name, "input": streamed_call.input, "deltas": deltas,
                     "stop_reason": streamed.stop_reason},
    }


def structured(client, model):
    # Sampled, every answer that ends by itself parses and follows the schema (one cut at
    # max_tokens cannot be whole JSON, on any server).
    out = []
    for _ in range(4):
        m = client.messages.create(model=model, max_tokens=120,
                                   messages=[{"role": "user", "content": "Describe a made-up person as JSON."}],
                                   output_config={"format": {"type": "json_schema", "schema": PERSON}},
                                   extra_body={"temperature": 0.8, "top_k": 40})
        if m.stop_reason == "end_turn":
            parsed = json.loads(text_of(m))
            jsonschema.validate(parsed, PERSON)
            out.append({"parsed": parsed, "stop_reason": m.stop_reason})
    assert out, "no structured answer ended within max_tokens"
    return out


def count(client, model):
    counted = client.messages.count_tokens(model=model, system=SYSTEM, messages=QUESTION)
    m = client.messages.create(model=model, system=SYSTEM, messages=QUESTION, extra_body=GREEDY, max_tokens=4)
    with_tools = client.messages.count_tokens(model=model, system=SYSTEM, messages=QUESTION, tools=[WEATHER_TOOL])
    return {"input_tokens": counted.input_tokens, "used": m.usage.input_tokens,
            "with_tools": with_tools.input_tokens}


def error_of(call):
    try:
        call()
    except anthropic.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"status": e.status_code, "class": type(e).__name__,
                "type": (body.get("error") or {}).get("type"), "message": (body.get("error") or {}).get("message")}
    return {"status": 200}


def errors(base_url, key, poor, model):
    bad = anthropic.Anthropic(base_url=base_url, api_key="not-a-token", max_retries=0)
    client = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0)
    broke = anthropic.Anthropic(base_url=base_url, api_key=poor, max_retries=0)
    ask = dict(messages=QUESTION, max_tokens=8)
    return {
        "bad_key": error_of(lambda: bad.messages.create(model=model, **ask)),
        "unknown_model": error_of(lambda: client.messages.create(model="no-such-model", **ask)),
        "thinking": error_of(lambda: client.messages.create(
            model=model, thinking={"type": "enabled", "budget_tokens": 1024}, **ask)),
        "image": error_of(lambda: client.messages.create(model=model, max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": "AAAA"}}]}])),
        "too_many_tokens": error_of(lambda: client.messages.create(model=model, messages=QUESTION,
                                                                   max_tokens=10_000_000, timeout=30)),
        "no_funds": error_of(lambda: broke.messages.create(model=model, **ask)),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--poor-key", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--cases", required=True)
    p.add_argument("--stop", default="Paris")
    a = p.parse_args()
    client = anthropic.Anthropic(base_url=a.base_url, api_key=a.key, max_retries=0)
    out = {}
    for case in a.cases.split(","):
        if case == "messages":
            out["messages"] = messages(client, a.model)
            out["bearer"] = system_blocks_and_bearer(a.base_url, a.key, a.model)
        elif case == "stream":
            out["stream"] = stream(client, a.model)
        elif case == "stop":
            out["stop"] = stop(client, a.model, a.stop)
        elif case == "tools":
            out["tools"] = tools(client, a.model)
        elif case == "structured":
            out["structured"] = structured(client, a.model)
        elif case == "count":
            out["count"] = count(client, a.model)
        elif case == "errors":
            out["errors"] = errors(a.base_url, a.key, a.poor_key, a.model)
        else:
            raise SystemExit(f"unknown case {case}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
