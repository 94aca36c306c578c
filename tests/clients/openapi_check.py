"""Checks Hearth's OpenAPI documents with tools nobody here wrote.

Reads one JSON object on stdin:

    {"documents": {"<listener>": <document>, ...},
     "exchanges": [{"listener": ..., "method": "get", "path": "/v1/models/{id}",
                    "request": <JSON body or null>, "status": 200,
                    "content_type": "application/json", "body": <JSON answer>}, ...]}

Each document must pass `openapi_spec_validator` as OpenAPI 3.1. Each exchange is a real
request and answer: the request body (unless the server refused it with 400) must validate against the operation's `requestBody`
schema, and the answer against the schema of the documented status and content type (with
`jsonschema`, draft 2020-12, which OpenAPI 3.1 schemas are). An answer may also not carry a
field its schema does not list: a document that leaves a field out is wrong too.

Prints {"checked": n} and exits 0, or prints every problem to stderr and exits 1.
"""

import json
import sys

from jsonschema import Draft202012Validator
from openapi_spec_validator import validate


def pointer(*parts):
    return "#/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def resolve(doc, schema):
    seen = 0
    while isinstance(schema, dict) and "$ref" in schema:
        ref = schema["$ref"]
        node = doc
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        schema = node
        seen += 1
        if seen > 64:
            raise ValueError(f"reference loop at {ref}")
    return schema


def undocumented(doc, schema, value, where, out):
    """Fields of `value` that `schema` does not list (objects with `properties` only)."""
    schema = resolve(doc, schema)
    if not isinstance(schema, dict):
        return
    branches = [resolve(doc, s) for key in ("allOf", "oneOf", "anyOf") for s in schema.get(key, [])]
    if isinstance(value, dict):
        props = dict(schema.get("properties", {}))
        open_ended = "properties" not in schema or schema.get("additionalProperties") not in (None, False)
        for branch in branches:
            if isinstance(branch, dict):
                props.update(branch.get("properties", {}))
                if "properties" in branch and branch.get("additionalProperties") in (None, False):
                    open_ended = False
        if branches and not props:
            open_ended = True
        for key, item in value.items():
            if key in props:
                undocumented(doc, props[key], item, f"{where}.{key}", out)
            elif not open_ended:
                out.append(f"{where}.{key} is not in the schema")
    elif isinstance(value, list):
        items = schema.get("items")
        for i, item in enumerate(value):
            if items is not None:
                undocumented(doc, items, item, f"{where}[{i}]", out)


def check(doc, ref, value, what, problems):
    root = dict(doc)
    root["$ref"] = ref
    validator = Draft202012Validator(root)
    for error in validator.iter_errors(value):
        path = "".join(f"[{p!r}]" for p in error.absolute_path)
        problems.append(f"{what}: {path or 'the body'}: {error.message}")
    extra = []
    undocumented(doc, {"$ref": ref}, value, "", extra)
    problems.extend(f"{what}: {e}" for e in extra)


def main():
    data = json.load(sys.stdin)
    documents = data["documents"]
    problems = []
    for name, doc in documents.items():
        try:
            validate(doc)
        except Exception as e:  # the validator's own error types vary by version
            problems.append(f"{name}: not a valid OpenAPI 3.1 document: {e}")
    checked = 0
    for ex in data["exchanges"]:
        doc = documents[ex["listener"]]
        what = f'{ex["listener"]} {ex["method"].upper()} {ex["path"]} -> {ex["status"]}'
        op = doc["paths"].get(ex["path"], {}).get(ex["method"])
        if op is None:
            problems.append(f"{what}: the operation is not documented")
            continue
        # A request the server refused as invalid (400) may well be outside the schema too.
        if ex.get("request") is not None and ex["status"] != 400:
            body = op.get("requestBody")
            if body is None:
                problems.append(f"{what}: sends a body the document does not describe")
            else:
                body = resolve(doc, body)
                media = "application/json"
                if media not in body.get("content", {}):
                    problems.append(f"{what}: the request body is not documented as JSON")
                else:
                    ref = pointer("paths", ex["path"], ex["method"], "requestBody", "content", media, "schema")
                    if "$ref" in op["requestBody"]:
                        ref = op["requestBody"]["$ref"] + "/content/" + media.replace("/", "~1") + "/schema"
                    check(doc, ref, ex["request"], what + " (request)", problems)
        responses = op.get("responses", {})
        status = str(ex["status"])
        if status not in responses:
            problems.append(f"{what}: status {status} is not documented (documented: {sorted(responses)})")
            continue
        response = resolve(doc, responses[status])
        media = ex["content_type"].split(";")[0].strip()
        content = response.get("content", {})
        if media not in content:
            problems.append(f"{what}: content type {media} is not documented (documented: {sorted(content)})")
            continue
        if "schema" in content[media] and ex.get("body") is not None:
            ref = pointer("paths", ex["path"], ex["method"], "responses", status, "content", media, "schema")
            if "$ref" in responses[status]:
                ref = responses[status]["$ref"] + "/content/" + media.replace("/", "~1") + "/schema"
            check(doc, ref, ex["body"], what, problems)
        checked += 1
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"checked": checked}))


if __name__ == "__main__":
    main()
