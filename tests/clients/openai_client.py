"""Drives Hearth's OpenAI-compatible routes with the official `openai` package, as a user's
program would, and prints what it saw as one JSON object (the Rust test, tests/openai.rs,
asserts on it). Every case runs against the real server the test started.

    python openai_client.py --base-url http://127.0.0.1:PORT/v1 --key TOKEN --poor-key TOKEN \
        --model alpha-3.3 [--image-base-url URL --image-model ID]
"""
import argparse
import base64
import json
import struct
import sys
import zlib

import jsonschema
import openai

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}

QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def chat(client, model):
    r = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=24)
    c = r.choices[0]
    # vLLM's extension: past the end-of-sequence token, to exactly max_tokens.
    short = [{"role": "user", "content": "Say hello."}]
    ended = client.chat.completions.create(model=model, messages=short, temperature=0, max_tokens=64)
    long = client.chat.completions.create(model=model, messages=short, temperature=0, max_tokens=64,
                                          extra_body={"ignore_eos": True})
    return {
        "ignore_eos": {"short": ended.choices[0].message.content, "short_finish": ended.choices[0].finish_reason,
                       "short_tokens": ended.usage.completion_tokens,
                       "content": long.choices[0].message.content, "finish_reason": long.choices[0].finish_reason,
                       "completion_tokens": long.usage.completion_tokens},
        "id": r.id,
        "object": r.object,
        "content": c.message.content,
        "role": c.message.role,
        "finish_reason": c.finish_reason,
        "usage": r.usage.model_dump(),
        "hearth": (r.model_extra or {}).get("hearth"),
    }


def stream(client, model):
    s = client.chat.completions.create(
        model=model, messages=QUESTION, temperature=0, max_tokens=24, stream=True,
        stream_options={"include_usage": True},
    )
    content, finish, usage, chunks, roles = "", None, None, 0, []
    hearth = None
    for chunk in s:
        chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
            hearth = (chunk.model_extra or {}).get("hearth")
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return {"content": content, "finish_reason": finish, "usage": usage, "hearth": hearth, "chunks": chunks,
            "roles": roles}


def json_schema(client, model):
    out = []
    for seed in (1, 2, 3):
        r = client.chat.completions.create(
            model=model, temperature=0.8, seed=seed, max_tokens=200,
            messages=[{"role": "user", "content": "Describe a made-up person as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        )
        text = r.choices[0].message.content
        parsed = json.loads(text)
        jsonschema.validate(parsed, PERSON)
        out.append({"content": text, "parsed": parsed, "finish_reason": r.choices[0].finish_reason})
    # Any JSON object: a 135M model may ramble past max_tokens (an answer cut there cannot be
    # whole JSON, as with any server), so a few seeds, with a frequency penalty; every answer
    # that ends by itself parses.
    objects = []
    for seed in range(1, 7):
        r = client.chat.completions.create(
            model=model, temperature=0.8, seed=seed, max_tokens=200, frequency_penalty=1.0,
            response_format={"type": "json_object"},
            messages=[{"role": "user", "content": "Answer with a JSON object whose key ok is true."}],
        )
        if r.choices[0].finish_reason == "stop":
            objects.append(json.loads(r.choices[0].message.content))
    assert objects, "no json_object answer ended within max_tokens"
    assert all(isinstance(o, dict) for o in objects)
    obj = objects[0]
    return {"schema": out, "json_object": obj}


def tools(client, model):
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = client.chat.completions.create(
        model=model, messages=messages, tools=[WEATHER_TOOL], temperature=0, max_tokens=60,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = first.choices[0].message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER_TOOL["function"]["parameters"])
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"celsius": 3, "sky": "snow"})})
    second = client.chat.completions.create(
        model=model, messages=messages, tools=[WEATHER_TOOL], tool_choice="none", temperature=0, max_tokens=30,
    )
    required = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Weather in Rome, please."}], tools=[WEATHER_TOOL],
        tool_choice="required", temperature=0, max_tokens=60,
    )
    # The same forced call, streamed: the pieces of delta.tool_calls put together.
    s = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Weather in Rome, please."}], tools=[WEATHER_TOOL],
        tool_choice="required", temperature=0, max_tokens=60, stream=True,
    )
    name, args, ids, finish = "", "", set(), None
    for chunk in s:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                if d.id:
                    ids.add(d.id)
                name += (d.function.name or "") if d.function else ""
                args += (d.function.arguments or "") if d.function else ""
            finish = choice.finish_reason or finish
    return {
        "first_finish": first.choices[0].finish_reason,
        "call_name": call.function.name,
        "call_id": call.id,
        "arguments": arguments,
        "answer": second.choices[0].message.content,
        "answer_finish": second.choices[0].finish_reason,
        "required_name": required.choices[0].message.tool_calls[0].function.name,
        "required_arguments": json.loads(required.choices[0].message.tool_calls[0].function.arguments),
        "streamed": {"name": name, "arguments": json.loads(args), "ids": len(ids), "finish_reason": finish},
        "nonstreamed_required_arguments": required.choices[0].message.tool_calls[0].function.arguments,
    }


def cancel(client, model):
    s = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Write a very long story about a dragon."}],
        temperature=0.9, seed=7, max_tokens=1500, stream=True,
    )
    read = 0
    for chunk in s:
        read += 1
        if read >= 4:
            break
    s.response.close()
    return {"chunks_read": read}


def logprobs(client, model):
    r = client.chat.completions.create(
        model=model, messages=QUESTION, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3,
    )
    entries = r.choices[0].logprobs.content
    return {
        "tokens": [e.token for e in entries],
        "logprobs": [e.logprob for e in entries],
        "top_counts": [len(e.top_logprobs) for e in entries],
        "completion_tokens": r.usage.completion_tokens,
        "content": r.choices[0].message.content,
    }


def completions(client, model):
    r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    s = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0,
                                  stream=True, stream_options={"include_usage": True})
    chunks = list(s)
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    usage_chunk = chunks[-1]
    stopped = client.completions.create(
        model=model, prompt="Count: 1, 2, 3,", max_tokens=30, temperature=0, stop=[" 6"],
    )
    return {
        "text": r.choices[0].text,
        "finish_reason": r.choices[0].finish_reason,
        "usage": r.usage.model_dump(),
        "streamed": streamed,
        "streamed_usage": usage_chunk.usage.model_dump() if usage_chunk.usage else None,
        "streamed_hearth": (usage_chunk.model_extra or {}).get("hearth"),
        "hearth": (r.model_extra or {}).get("hearth"),
        "stopped_text": stopped.choices[0].text,
        "stopped_finish": stopped.choices[0].finish_reason,
    }


def models(client, model):
    listed = [m.id for m in client.models.list()]
    one = client.models.retrieve(model)
    return {"ids": listed, "retrieved": one.id}


def errors(base_url, key, poor_key, model):
    seen = {}
    cases = {
        "bad_key": (openai.OpenAI(base_url=base_url, api_key="not-a-token", max_retries=0), {}),
        "unknown_model": (openai.OpenAI(base_url=base_url, api_key=key, max_retries=0), {"model": "no-such-model"}),
        "n_two": (openai.OpenAI(base_url=base_url, api_key=key, max_retries=0), {"n": 2}),
        "too_many_tokens": (openai.OpenAI(base_url=base_url, api_key=key, max_retries=0), {"max_tokens": 10**9}),
        "bad_schema": (openai.OpenAI(base_url=base_url, api_key=key, max_retries=0),
                       {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}}),
        "no_funds": (openai.OpenAI(base_url=base_url, api_key=poor_key, max_retries=0), {}),
        "ignore_eos_grammar": (openai.OpenAI(base_url=base_url, api_key=key, max_retries=0),
                               {"response_format": {"type": "json_object"}, "extra_body": {"ignore_eos": True}}),
    }
    for name, (client, extra) in cases.items():
        args = {"model": model, "messages": QUESTION, "max_tokens": 8}
        args.update(extra)
        try:
            client.chat.completions.create(**args)
            seen[name] = {"status": 200}
        except openai.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            seen[name] = {"status": e.status_code, "class": type(e).__name__, "type": body.get("type"),
                          "param": body.get("param"), "code": body.get("code"), "message": body.get("message")}
    return seen


def images(base_url, key, model):
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
    r = client.images.generate(model=model, prompt="a red fox in snow", n=1, size="256x256",
                               response_format="b64_json", extra_body={"seed": 42, "steps": 2})
    png = base64.b64decode(r.data[0].b64_json)
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", png[16:24])
    try:
        client.images.generate(model=model, prompt="x", n=2, size="256x256")
        refused = None
    except openai.BadRequestError as e:
        refused = e.body.get("param") if isinstance(e.body, dict) else None
    return {"count": len(r.data), "width": width, "height": height,
            "hearth": (r.model_extra or {}).get("hearth"), "n_two_param": refused}


def png_rgba(width, height, pixel):
    """A PNG of `pixel(x, y) -> (r, g, b, a)`, written with the standard library only."""
    rows = b"".join(b"\x00" + b"".join(bytes(pixel(x, y)) for x in range(width))
                    for y in range(height))
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


def image_edits(base_url, key, model):
    """An edit through the SDK's multipart upload: a picture, a mask whose left half is
    transparent (repaint), Hearth's extensions in extra_body; then a mask of the wrong size."""
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
    picture = png_rgba(256, 256, lambda x, y: (x, y, (x * y) % 256, 255))
    mask = png_rgba(256, 256, lambda x, y: (0, 0, 0, 0 if x < 128 else 255))
    r = client.images.edit(model=model, image=("in.png", picture, "image/png"),
                           mask=("mask.png", mask, "image/png"), prompt="a boat on a lake",
                           size="256x256", response_format="b64_json",
                           extra_body={"seed": 42, "steps": 4, "strength": 0.5})
    png = base64.b64decode(r.data[0].b64_json)
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", png[16:24])
    try:
        client.images.edit(model=model, image=("in.png", picture, "image/png"),
                           mask=("mask.png", png_rgba(64, 64, lambda x, y: (0, 0, 0, 0)), "image/png"),
                           prompt="x")
        refused = None
    except openai.BadRequestError as e:
        refused = e.body.get("param") if isinstance(e.body, dict) else None
    return {"count": len(r.data), "width": width, "height": height,
            "hearth": (r.model_extra or {}).get("hearth"), "wrong_mask_param": refused}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--poor-key", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--cases", default="models,chat,stream,completions,logprobs,json_schema,tools,errors,cancel")
    p.add_argument("--image-base-url")
    p.add_argument("--image-model")
    a = p.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key=a.key, max_retries=0, timeout=120)
    out = {"openai_version": openai.__version__}
    for case in a.cases.split(","):
        if case == "errors":
            out[case] = errors(a.base_url, a.key, a.poor_key, a.model)
        elif case == "images":
            out[case] = images(a.image_base_url, a.key, a.image_model)
        elif case == "image_edits":
            out[case] = image_edits(a.image_base_url, a.key, a.image_model)
        else:
            out[case] = globals()[case](client, a.model)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
