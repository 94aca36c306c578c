"""Drives Hearth's `/v1/embeddings` with the official `openai` package, as a user's program
would, and prints what it saw as one JSON object (tests/embeddings.rs asserts on it): one text,
a batch, the raw base64 answer, shortened vectors, token ids, and the errors as that client
sorts them.

    python openai_embeddings.py --base-url http://127.0.0.1:PORT/v1 --key TOKEN \
        --model minilm --short-model minilm-short --texts-json '["a", "b"]' --long-text TEXT
"""
import argparse
import json

import openai


def error(call):
    try:
        call()
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"status": e.status_code, "class": type(e).__name__, "param": body.get("param"),
                "message": body.get("message")}
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--short-model", required=True)
    p.add_argument("--texts-json", required=True)
    p.add_argument("--long-text", required=True)
    a = p.parse_args()
    texts = json.loads(a.texts_json)
    client = openai.OpenAI(base_url=a.base_url, api_key=a.key, max_retries=0)
    out = {}
    # The package asks for base64 itself when no format is given, and decodes it.
    one = client.embeddings.create(model=a.model, input=texts[0])
    out["single"] = {"vector": one.data[0].embedding, "usage": one.usage.prompt_tokens,
                     "model": one.model, "object": one.object}
    batch = client.embeddings.create(model=a.model, input=texts, encoding_format="float")
    out["batch"] = {"vectors": [d.embedding for d in batch.data], "indexes": [d.index for d in batch.data],
                    "usage": batch.usage.prompt_tokens, "total": batch.usage.total_tokens}
    raw = client.embeddings.with_raw_response.create(model=a.model, input=texts[:2],
                                                     encoding_format="base64")
    raw = json.loads(raw.text)
    out["base64"] = [d["embedding"] for d in raw["data"]]
    short = client.embeddings.create(model=a.short_model, input=texts[:2], dimensions=64,
                                     encoding_format="float")
    out["short"] = [d.embedding for d in short.data]
    ids = client.embeddings.create(model=a.model, input=[[101, 7592, 2088, 102]], encoding_format="float")
    hello = client.embeddings.create(model=a.model, input="hello world", encoding_format="float")
    out["ids"] = {"vector": ids.data[0].embedding, "usage": ids.usage.prompt_tokens,
                  "text": hello.data[0].embedding}
    cut = client.embeddings.create(model=a.model, input=a.long_text, encoding_format="float",
                                   extra_body={"truncate_prompt_tokens": -1})
    out["truncated"] = {"vector": cut.data[0].embedding, "usage": cut.usage.prompt_tokens}
    out["tokens_billed"] = sum(r.usage.prompt_tokens for r in [one, batch, short, ids, hello, cut]) \
        + raw["usage"]["prompt_tokens"]
    out["errors"] = {
        "too_long": error(lambda: client.embeddings.create(model=a.model, input=["fine", a.long_text])),
        "dimensions": error(lambda: client.embeddings.create(model=a.model, input="x", dimensions=8)),
        "unknown_model": error(lambda: client.embeddings.create(model="no-such-model", input="x")),
        "empty": error(lambda: client.embeddings.create(model=a.model, input=[])),
        "bad_key": error(lambda: openai.OpenAI(base_url=a.base_url, api_key="nope", max_retries=0)
                         .embeddings.create(model=a.model, input="x")),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
