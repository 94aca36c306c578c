"""Drives Hearth's `/v1/responses` with the official `openai` package's Responses API, as a
user's program or agent would, and prints what it saw as one JSON object (the Rust test,
tests/responses.rs, asserts on it).

    python openai_responses.py --base-url http://127.0.0.1:PORT/v1 --key TOKEN --model alpha-3.3
"""
import argparse
import json
import sys

import jsonschema
import openai

INSTRUCTIONS = "You are a helpful assistant."
QUESTION = "What is the capital of France?"

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather now in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def error_of(call):
    try:
        call()
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"status": e.status_code, "class": type(e).__name__, "param": body.get("param")}
    return {"status": 200}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--model", required=True)
    a = p.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key=a.key, max_retries=0)
    m = a.model
    out = {}

    r = client.responses.create(model=m, instructions=INSTRUCTIONS, input=QUESTION, temperature=0,
                                max_output_tokens=24)
    out["plain"] = {"id": r.id, "object": r.object, "status": r.status, "text": r.output_text,
                    "usage": r.usage.model_dump(), "items": [o.type for o in r.output]}

    kinds, deltas = [], ""
    for event in client.responses.create(model=m, instructions=INSTRUCTIONS, input=QUESTION, temperature=0,
                                         max_output_tokens=24, stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas += event.delta
        if event.type == "response.completed" or event.type == "response.incomplete":
            final = event.response
    out["stream"] = {"events": kinds, "text": deltas, "final_text": final.output_text,
                     "usage": final.usage.model_dump()}

    with client.responses.stream(model=m, instructions=INSTRUCTIONS, input=QUESTION, temperature=0,
                                 max_output_tokens=24) as s:
        for _ in s:
            pass
        helper = s.get_final_response()
    out["helper_text"] = helper.output_text

    # Input items: a conversation, the earlier answer as an assistant message.
    items = client.responses.create(model=m, temperature=0, max_output_tokens=24, input=[
        {"role": "developer", "content": INSTRUCTIONS},
        {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
    ])
    out["items_text"] = items.output_text

    short = client.responses.create(model=m, input=QUESTION, temperature=0, max_output_tokens=3)
    out["short"] = {"status": short.status, "reason": short.incomplete_details.reason,
                    "tokens": short.usage.output_tokens}

    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    call = client.responses.create(model=m, input=ask, tools=[WEATHER], temperature=0, max_output_tokens=64,
                                   tool_choice={"type": "function", "name": "get_weather"})
    fc = next(o for o in call.output if o.type == "function_call")
    follow = ask + [{"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
                    {"type": "function_call_output", "call_id": fc.call_id, "output": "Sunny, 24 degrees."}]
    reply = client.responses.create(model=m, input=follow, tools=[WEATHER], temperature=0, max_output_tokens=32)
    streamed_args = ""
    for event in client.responses.create(model=m, input=ask, tools=[WEATHER], temperature=0, max_output_tokens=64,
                                         tool_choice="required", stream=True):
        if event.type == "response.function_call_arguments.delta":
            streamed_args += event.delta
    out["tools"] = {"name": fc.name, "call_id": fc.call_id, "arguments": json.loads(fc.arguments),
                    "reply": reply.output_text, "reply_items": [o.type for o in reply.output],
                    "streamed_arguments": json.loads(streamed_args)}

    # Sampled, a 135M model may ramble past the limit (an answer cut there cannot be whole JSON,
    # on any server); every answer that ends by itself parses and follows the schema.
    people = []
    for _ in range(4):
        j = client.responses.create(model=m, input="Describe a made-up person as JSON.", temperature=0.8,
                                    max_output_tokens=120,
                                    text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                                                     "strict": True}})
        if j.status == "completed":
            parsed = json.loads(j.output_text)
            jsonschema.validate(parsed, PERSON)
            people.append(parsed)
    assert people, "no structured answer ended within max_output_tokens"
    out["people"] = people

    bad = openai.OpenAI(base_url=a.base_url, api_key="not-a-token", max_retries=0)
    out["errors"] = {
        "bad_key": error_of(lambda: bad.responses.create(model=m, input="hi")),
        "store": error_of(lambda: client.responses.create(model=m, input="hi", store=True)),
        "previous": error_of(lambda: client.responses.create(model=m, input="hi", previous_response_id="resp_x")),
        "unknown_model": error_of(lambda: client.responses.create(model="no-such-model", input="hi")),
        "image": error_of(lambda: client.responses.create(model=m, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}])),
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
