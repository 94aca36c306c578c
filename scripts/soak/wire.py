"""HTTP with the standard library: answers, requests, SSE reading, hang-ups and multipart bodies."""

import http.client
import json
import random
import socket

from common import REQUEST_TIMEOUT

# A fresh connection per request: the accept and close paths are part of what a soak exercises,
# and an fd leak per connection shows up within minutes.

class Answer:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def error_text(self):
        """The error message in either shape (`{"error": "..."}` or `{"error": {"message"}}`)."""
        doc = self.json()
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            return f"{err.get('type') or err.get('code') or ''}: {err.get('message', '')}"
        return str(err) if err is not None else self.body[:200].decode("utf-8", "replace")


def connect(base, timeout=REQUEST_TIMEOUT):
    host, port = base.rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def call(base, method, path, body=None, headers=None, timeout=REQUEST_TIMEOUT):
    conn = connect(base, timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Answer(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def post_json(base, path, doc, token=None, timeout=REQUEST_TIMEOUT):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return call(base, "POST", path, json.dumps(doc).encode(), headers, timeout)


def get_json(base, path):
    return json.loads(call(base, "GET", path, timeout=10).body)


def sse_events(resp):
    """The `data:` payloads of an SSE response as they arrive (`[DONE]` as the string)."""
    data = []
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.decode("utf-8").rstrip("\r\n")
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and data:
            payload = "\n".join(data)
            data = []
            yield payload if payload == "[DONE]" else json.loads(payload)


def cut(conn):
    """Hangs up at once: a shutdown of the socket sends the FIN now, whatever still refers to it
    (http.client's response object keeps a file on the socket)."""
    try:
        conn.sock.shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError):
        pass
    conn.close()


def multipart(filename, data, field="file"):
    boundary = f"soak{random.getrandbits(64):016x}"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{filename}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    body = head + data + f"\r\n--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}
