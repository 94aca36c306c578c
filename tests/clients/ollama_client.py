"""Drives Hearth's Ollama routes with the official `ollama` package, as a user's program (or an
app built on it) would, and prints what it saw as one JSON object (the Rust test,
tests/ollama.rs, asserts on it). Every case runs against the real server the test started.

    python ollama_client.py --host http://127.0.0.1:PORT --key TOKEN --poor-key TOKEN \
        --model alpha-3.3 --embed-model all-minilm-l6-v2 --cases chat,generate,tools,models,embed,errors
"""
import argparse
import datetime
import json
import sys
import time

import jsonschema
import ollama

SYSTEM = "You are a helpful assistant."
QUESTION = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 24}

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
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


def chat(client, model):
    r = client.chat(model=model, messages=QUESTION, options=GREEDY)
    parts, lines, last = [], 0, None
    for part in client.chat(model=model, messages=QUESTION, options=GREEDY, stream=True):
        lines += 1
        parts.append(part.message.content or "")
        last = part
    short = client.chat(model=model, messages=QUESTION, options={"temperature": 0, "num_predict": 3})
    out = {
        "content": r.message.content,
        "role": r.message.role,
        "done": r.done,
        "done_reason": r.done_reason,
        "prompt_eval_count": r.prompt_eval_count,
        "eval_count": r.eval_count,
        "total_duration": r.total_duration,
        "streamed": "".join(parts),
        "lines": lines,
        "stream_done": last.done,
        "stream_done_reason": last.done_reason,
        "stream_eval_count": last.eval_count,
        "short_reason": short.done_reason,
        "short_count": short.eval_count,
    }
    # Sampled, every answer that ends by itself parses and follows the schema.
    people = []
    for _ in range(4):
        p = client.chat(model=model, format=PERSON, options={"temperature": 0.8, "top_k": 40, "num_predict": 120},
                        messages=[{"role": "user", "content": "Describe a made-up person as JSON."}])
        if p.done_reason == "stop":
            parsed = json.loads(p.message.content)
            jsonschema.validate(parsed, PERSON)
            people.append(parsed)
    assert people, "no structured answer ended within num_predict"
    out["people"] = people
    loaded = client.chat(model=model, messages=[])
    out["load_reason"] = loaded.done_reason
    return out


def generate(client, model, stop):
    r = client.generate(model=model, prompt="What is the capital of France?", system=SYSTEM, options=GREEDY)
    streamed = "".join(p.response for p in client.generate(model=model, prompt="What is the capital of France?",
                                                            system=SYSTEM, options=GREEDY, stream=True))
    stopped = client.generate(model=model, prompt="What is the capital of France?", system=SYSTEM,
                              options={**GREEDY, "stop": [stop]})
    raw = client.generate(model=model, prompt="The capital of France is", raw=True,
                          options={"temperature": 0, "num_predict": 8, "seed": 7})
    return {"response": r.response, "streamed": streamed, "done_reason": r.done_reason,
            "eval_count": r.eval_count, "stopped": stopped.response, "stopped_reason": stopped.done_reason,
            "raw": raw.response, "raw_count": raw.eval_count}


# Ollama has no tool_choice: the model decides. A format that is a call's shape makes this
# small model's answer a call (as users of Ollama force one); Hearth reads it back as a call.
CALL_FORMAT = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER_TOOL["function"]["parameters"]},
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


def tools(client, model):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    options = {"temperature": 0, "num_predict": 64}
    r = client.chat(model=model, messages=ask, tools=[WEATHER_TOOL], format=CALL_FORMAT, options=options)
    calls = [{"name": c.function.name, "arguments": dict(c.function.arguments)} for c in (r.message.tool_calls or [])]
    streamed = []
    for part in client.chat(model=model, messages=ask, tools=[WEATHER_TOOL], format=CALL_FORMAT, stream=True,
                            options=options):
        streamed += [{"name": c.function.name, "arguments": dict(c.function.arguments)}
                     for c in (part.message.tool_calls or [])]
    follow = ask + [{"role": "assistant", "content": r.message.content or "",
                     "tool_calls": [{"function": c} for c in calls]},
                    {"role": "tool", "content": "Sunny, 24 degrees.", "tool_name": "get_weather"}]
    answer = client.chat(model=model, messages=follow, tools=[WEATHER_TOOL],
                         options={"temperature": 0, "num_predict": 32})
    return {"calls": calls, "streamed": streamed, "content": r.message.content, "done_reason": r.done_reason,
            "answer_reason": answer.done_reason, "answer": answer.message.content}


def models(client, model):
    tags = client.list()
    shown = client.show(model)
    ps = client.ps()
    # `ollama stop`: keep_alive 0 and nothing to generate unloads the model.
    stopped = client.generate(model=model, keep_alive=0)
    deadline = time.time() + 30
    while model in [m.model for m in client.ps().models] and time.time() < deadline:
        time.sleep(0.1)
    after_stop = [m.model for m in client.ps().models]
    # Loaded again for ten minutes: ps says when it leaves.
    loaded = client.generate(model=model, keep_alive="10m")
    expires = [m.expires_at for m in client.ps().models if m.model == model]
    return {
        "tags": [m.model for m in tags.models],
        "show_capabilities": list(shown.capabilities or []),
        "show_template": bool(shown.template),
        "ps": [m.model for m in ps.models],
        "stop_reason": stopped.done_reason,
        "ps_after_stop": after_stop,
        "load_reason": loaded.done_reason,
        "expires_in": (expires[0] - datetime.datetime.now(datetime.timezone.utc)).total_seconds() if expires else None,
        "version": client._request_raw("GET", "/api/version").json()["version"],
    }


def embed(client, model):
    r = client.embed(model=model, input=["The harbour opens at seven.", "Ferries arrive at noon."])
    one = client.embed(model=model, input="The harbour opens at seven.")
    return {"count": len(r.embeddings), "width": len(r.embeddings[0]), "tokens": r.prompt_eval_count,
            "first": r.embeddings[0], "single": one.embeddings[0]}


def error_of(call):
    try:
        call()
    except ollama.ResponseError as e:
        return {"status": e.status_code, "error": e.error}
    return {"status": 200}


def errors(host, key, poor, model):
    anonymous = ollama.Client(host=host)
    client = ollama.Client(host=host, headers={"Authorization": f"Bearer {key}"})
    broke = ollama.Client(host=host, headers={"Authorization": f"Bearer {poor}"})
    ask = [{"role": "user", "content": "hi"}]
    wrong = ollama.Client(host=host, headers={"Authorization": "Bearer not-a-token"})
    return {
        "no_key": error_of(lambda: anonymous.chat(model=model, messages=ask)),
        "bad_key": error_of(lambda: wrong.chat(model=model, messages=ask)),
        "unknown_model": error_of(lambda: client.chat(model="no-such-model", messages=ask)),
        "think": error_of(lambda: client.chat(model=model, messages=ask, think=True)),
        "mirostat": error_of(lambda: client.chat(model=model, messages=ask, options={"mirostat": 2})),
        "images": error_of(lambda: client.generate(model=model, prompt="what is this?", images=[b"\x89PNG"])),
        "no_funds": error_of(lambda: broke.chat(model=model, messages=ask)),
        "runtime_options": error_of(lambda: client.chat(model=model, messages=ask,
                                                        options={"num_ctx": 4096, "num_thread": 2,
                                                                 "repeat_penalty": 1.0, "num_predict": 2})),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--poor-key", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--embed-model", default="")
    p.add_argument("--stop", default="Paris")
    p.add_argument("--cases", required=True)
    a = p.parse_args()
    client = ollama.Client(host=a.host, headers={"Authorization": f"Bearer {a.key}"})
    out = {}
    for case in a.cases.split(","):
        if case == "chat":
            out["chat"] = chat(client, a.model)
        elif case == "generate":
            out["generate"] = generate(client, a.model, a.stop)
        elif case == "tools":
            out["tools"] = tools(client, a.model)
        elif case == "models":
            out["models"] = models(client, a.model)
        elif case == "embed":
            out["embed"] = embed(client, a.embed_model)
        elif case == "errors":
            out["errors"] = errors(a.host, a.key, a.poor_key, a.model)
        else:
            raise SystemExit(f"unknown case {case}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
