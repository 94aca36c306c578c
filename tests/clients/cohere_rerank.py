"""Drives Hearth's rerank routes with the official `cohere` package, as a user's program would,
and prints what it saw as one JSON object (tests/rerank.rs asserts on it): the v2 client's
`rerank` (POST /v2/rerank) with and without `top_n`, the v1 client's with `return_documents`
(POST /v1/rerank), and the errors as that client sorts them.

    python cohere_rerank.py --base-url http://127.0.0.1:PORT --key TOKEN --model tiny \
        --query TEXT --documents-json '["a", "b"]'
"""
import argparse
import json

import cohere
from cohere.core.api_error import ApiError


def error(call):
    try:
        call()
    except ApiError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"status": e.status_code, "class": type(e).__name__,
                "param": body.get("error", {}).get("param")}
    return None


def results(response):
    return [{"index": r.index, "relevance_score": r.relevance_score} for r in response.results]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--query", required=True)
    p.add_argument("--documents-json", required=True)
    a = p.parse_args()
    documents = json.loads(a.documents_json)
    v2 = cohere.ClientV2(api_key=a.key, base_url=a.base_url, timeout=60)
    v1 = cohere.Client(api_key=a.key, base_url=a.base_url, timeout=60)
    out = {}
    whole = v2.rerank(model=a.model, query=a.query, documents=documents)
    out["v2"] = {"id": whole.id, "results": results(whole)}
    top = v2.rerank(model=a.model, query=a.query, documents=documents, top_n=2)
    out["v2_top2"] = results(top)
    echoed = v1.rerank(model=a.model, query=a.query, documents=documents, return_documents=True)
    out["v1_documents"] = [
        {"index": r.index, "text": r.document.text if r.document else None}
        for r in echoed.results
    ]
    out["errors"] = {
        "unknown_model": error(lambda: v2.rerank(model="nope", query=a.query,
                                                 documents=documents)),
        "no_documents": error(lambda: v2.rerank(model=a.model, query=a.query, documents=[])),
        "bad_key": error(lambda: cohere.ClientV2(api_key="wrong", base_url=a.base_url).rerank(
            model=a.model, query=a.query, documents=documents)),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
