"""The request kinds the driver sends (Traffic), each judging and recording its answers, and the
plan of their rates."""

import http.client
import json
import random
import time
from decimal import Decimal

from common import CUT_MAX_TOKENS, PROMPT_TOKENS_BOUND, PROMPTS, REQUEST_TIMEOUT, SERVICES, TEXT_PRICES
from wire import Answer, call, connect, cut, multipart, post_json, sse_events


class Traffic:
    """The request kinds, each a method that sends one request (or one short exchange) and
    records the answers; the driver calls them at their rates from a thread pool."""

    def __init__(self, urls, users, recorder, benign, hostile):
        self.urls, self.users, self.rec = urls, users, recorder
        self.benign, self.hostile = benign, hostile
        self.cutters = [u for u in users if u.cutter]

    # -- helpers

    def judge(self, cls, answer, ms, ok=(200,), tolerated=(429,), expected=None):
        """Records `answer`; `expected(answer)` may accept more than `ok` (hostile uploads)."""
        if answer.status in ok or (expected is not None and expected(answer)):
            verdict = "ok"
        elif answer.status in tolerated:
            verdict = "tolerated"
        else:
            verdict = "unexpected"
        self.rec.answer(cls, answer.status, ms, verdict, "" if verdict == "ok" else answer.error_text())
        return verdict == "ok"

    def timed(self, cls, fn):
        """Runs fn() -> Answer, records it; returns the Answer, or None when there was none."""
        start = time.monotonic()
        try:
            answer = fn()
        except (OSError, http.client.HTTPException, ValueError) as e:
            self.rec.error(cls, (time.monotonic() - start) * 1000, e)
            return None
        return answer, (time.monotonic() - start) * 1000

    def pick(self, group, slot):
        """A random user of `group` with a free driver-side slot (`slot` names the semaphore),
        holding it; None when every one is busy."""
        for user in random.sample(group, len(group)):
            if getattr(user, slot).acquire(blocking=False):
                return user
        return None

    def completion_body(self, user, max_tokens=None):
        return {"serviceToken": user.token, "model": random.choice(list(TEXT_PRICES)),
                "messages": [{"role": "system", "content": "You are a helpful assistant."},
                             {"role": "user", "content": random.choice(PROMPTS)}],
                "temperature": round(random.uniform(0, 1), 2),
                "maxOutputTokens": max_tokens or random.randint(16, 32)}

    def v1_body(self, body, stream):
        out = {"model": body["model"], "messages": body["messages"], "temperature": body["temperature"],
               "max_tokens": body["maxOutputTokens"]}
        if stream:
            out["stream"] = True
            if random.random() < 0.5:
                out["stream_options"] = {"include_usage": True}
        return out

    # -- auth

    def signin(self):
        """Sign-in as the pages do it: /token, then /validate and /balance with the new token.
        The new token becomes the user's, so no token lives long enough to expire."""
        user = random.choice(self.users)
        got = self.timed("auth", lambda: post_json(self.urls["auth"], "/token", {
            "userId": user.name, "idpToken": user.idp, "lifetimeSeconds": 3600}))
        if not got or not self.judge("auth", *got, tolerated=()):
            return
        token = got[0].json()["serviceToken"]
        user.token = token
        got = self.timed("auth", lambda: post_json(self.urls["auth"], "/validate", {"serviceToken": token}))
        if got:
            self.judge("auth", *got, tolerated=())
        got = self.timed("auth", lambda: post_json(self.urls["auth"], "/balance", {"serviceToken": token}))
        if got:
            self.judge("auth", *got, tolerated=())

    def logout(self):
        """A throwaway token signed in, logged out, then refused: /validate must say 401."""
        user = random.choice(self.users)
        got = self.timed("auth", lambda: post_json(self.urls["auth"], "/token", {
            "userId": user.name, "idpToken": user.idp, "lifetimeSeconds": 600}))
        if not got or not self.judge("auth", *got, tolerated=()):
            return
        token = got[0].json()["serviceToken"]
        got = self.timed("auth", lambda: post_json(self.urls["auth"], "/logout", {"serviceToken": token}))
        if got:
            self.judge("auth", *got, tolerated=())
        got = self.timed("auth", lambda: post_json(self.urls["auth"], "/validate", {"serviceToken": token}))
        if got:
            self.judge("auth", *got, ok=(401,), tolerated=())

    # -- completions that run to their end (every user)

    def _with_completion_slot(self, fn):
        user = self.pick(self.users, "completions")
        if user is None:
            self.rec.skip("completion (user slots)")
            return
        try:
            fn(user)
        finally:
            user.completions.release()

    def complete(self):
        def run(user):
            body = self.completion_body(user)
            got = self.timed("complete", lambda: post_json(self.urls["completion"], "/", body))
            if got and self.judge("complete", *got):
                usage = got[0].json()["usage"]
                user.charged(Decimal(usage["inputCost"]) + Decimal(usage["outputCost"]))
        self._with_completion_slot(run)

    def _stream(self, user, cls, path, body, token=None, stop_after=None):
        """One SSE stream read to its end; the final response's cost is the user's. With
        `stop_after`, /stream/shutdown stops it after that many events (its partial answer,
        billed, comes in the shutdown answer and in the stream's `aborted` event: counted once)."""
        start = time.monotonic()
        conn = connect(self.urls["completion"])
        try:
            headers = {"Content-Type": "application/json"}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                self.judge(cls, Answer(resp.status, resp.headers, resp.read()), (time.monotonic() - start) * 1000)
                return
            stream_id = resp.getheader("X-Stream-Id")
            final, stopped, events = None, None, 0
            for event in sse_events(resp):
                events += 1
                if event == "[DONE]":
                    break
                if "error" in event:
                    raise ValueError(f"stream error event: {json.dumps(event)[:200]}")
                if "completed" in event or "aborted" in event:
                    final = event["response"]["usage"]
                elif event.get("hearth"):
                    final = event["hearth"]  # /v1: the last chunk carrying the cost wins
                if stop_after is not None and events == stop_after and stopped is None:
                    asked = time.monotonic()
                    stopped = post_json(self.urls["completion"], "/stream/shutdown", {"streamId": stream_id})
                    stop_ms = (time.monotonic() - asked) * 1000
            ms = (time.monotonic() - start) * 1000
            if stopped is not None and stopped.status == 200 and final is None:
                final = stopped.json()["response"]["usage"]
            if final is None:
                raise ValueError("the stream ended without its final response")
            cost = (Decimal(final.get("inputCost") or final.get("input_cost"))
                    + Decimal(final.get("outputCost") or final.get("output_cost")))
            user.charged(cost)
            if stopped is not None:
                # 404: the stream had finished before the shutdown arrived (a race, not an error).
                self.judge("shutdown", stopped, stop_ms, ok=(200, 404), tolerated=())
            self.rec.answer(cls, 200, ms, "ok")
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as e:
            self.rec.error(cls, (time.monotonic() - start) * 1000, e)
        finally:
            conn.close()

    def stream(self):
        self._with_completion_slot(lambda u: self._stream(u, "stream", "/stream", self.completion_body(u)))

    def stream_stopped(self):
        self._with_completion_slot(lambda u: self._stream(
            u, "stop", "/stream", self.completion_body(u, CUT_MAX_TOKENS), stop_after=random.randint(1, 5)))

    def v1(self):
        def run(user):
            body = self.v1_body(self.completion_body(user), stream=False)
            got = self.timed("v1", lambda: post_json(self.urls["completion"], "/v1/chat/completions", body, token=user.token))
            if got and self.judge("v1", *got):
                h = got[0].json()["hearth"]
                user.charged(Decimal(h["input_cost"]) + Decimal(h["output_cost"]))
        self._with_completion_slot(run)

    def v1_stream(self):
        def run(user):
            body = self.v1_body(self.completion_body(user), stream=True)
            self._stream(user, "v1-stream", "/v1/chat/completions", body, token=user.token)
        self._with_completion_slot(run)

    # -- requests the client hangs up on (cutter users only)

    def cut(self):
        """/stream or /v1 stream cut after a few events (or right after the head), or a one-shot
        completion abandoned before its answer. Billed for what was made; only the ledger knows."""
        user = self.pick(self.cutters, "completions")
        if user is None:
            self.rec.skip("cut (user slots)")
            return
        kind = random.choice(["stream", "v1-stream", "one-shot"])
        body = self.completion_body(user, CUT_MAX_TOKENS)
        in_price, out_price = TEXT_PRICES[body["model"]]
        with user.lock:
            user.cuts += 1
            user.cut_bound += (PROMPT_TOKENS_BOUND * in_price + CUT_MAX_TOKENS * out_price) / Decimal(10**6)
        start = time.monotonic()
        conn = connect(self.urls["completion"], timeout=REQUEST_TIMEOUT)
        try:
            if kind == "one-shot":
                conn.request("POST", "/", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
                time.sleep(random.uniform(0.05, 0.4))
                cut(conn)
                self.rec.answer("cut", "cut", (time.monotonic() - start) * 1000, "ok")
                return
            path, headers = "/stream", {"Content-Type": "application/json"}
            if kind == "v1-stream":
                path, body = "/v1/chat/completions", self.v1_body(body, stream=True)
                headers["Authorization"] = f"Bearer {user.token}"
            conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                self.judge("cut", Answer(resp.status, resp.headers, resp.read()), (time.monotonic() - start) * 1000)
                return
            keep = random.randint(0, 6)
            for i, _ in enumerate(sse_events(resp)):
                if i >= keep:
                    break
            cut(conn)
            self.rec.answer("cut", 200, (time.monotonic() - start) * 1000, "ok")
        except (OSError, http.client.HTTPException, ValueError) as e:
            self.rec.error("cut", (time.monotonic() - start) * 1000, e)
        finally:
            conn.close()
            user.completions.release()

    # -- documents

    def markdown(self):
        name, data = random.choice(self.benign)
        body, headers = multipart(name, data)
        path = "/?attachments=convert" if name.endswith((".eml", ".msg")) and random.random() < 0.5 else "/"
        got = self.timed("markdown", lambda: call(self.urls["markdown"], "POST", path, body, headers))
        if got:
            self.judge("markdown", *got, tolerated=())

    def hostile_upload(self):
        """A hostile document, or an upload that claims more bytes than the limit. Expected:
        200 (converted within its budgets), 400 (empty), 413 (too large), 415 (unsupported or
        encrypted), or 500 `Conversion failed: ...` (malformed, bomb, time limit: the service's
        documented answer). Anything else, a bare 500 or a 503 included, is unexpected."""
        if random.random() < 0.15:
            got = self.timed("hostile", self._claims_too_much)
            if got:
                self.judge("hostile", *got, ok=(413,), tolerated=())
            return
        name, data = random.choice(self.hostile)
        body, headers = multipart(name, data)
        got = self.timed("hostile", lambda: call(self.urls["markdown"], "POST", "/", body, headers))
        if got:
            self.judge("hostile", *got, ok=(200, 400, 413, 415), tolerated=(),
                       expected=lambda a: a.status == 500 and a.error_text().startswith("Conversion failed"))

    def _claims_too_much(self):
        """Declares a 60 MiB body (over the 50 MiB limit) and sends none of it: the answer must
        be 413 from the header alone, without waiting for the body."""
        conn = connect(self.urls["markdown"], timeout=30)
        try:
            conn.putrequest("POST", "/")
            conn.putheader("Content-Type", "multipart/form-data; boundary=x")
            conn.putheader("Content-Length", str(60 * 2**20))
            conn.endheaders()
            resp = conn.getresponse()
            return Answer(resp.status, resp.headers, resp.read())
        finally:
            cut(conn)

    # -- images

    def image(self):
        user = self.pick(self.users, "images")
        if user is None:
            self.rec.skip("image (user slots)")
            return
        try:
            size = random.choice([256, 320, 384])
            steps = random.randint(1, 2)
            if random.random() < 0.5:
                doc = {"serviceToken": user.token, "prompt": random.choice(PROMPTS), "width": size,
                       "height": size, "steps": steps, "seed": random.randrange(2**32)}
                got = self.timed("image", lambda: post_json(self.urls["imagine"], "/", doc))
                if got and self.judge("image", *got):
                    user.charged(Decimal(got[0].json()["usage"]["cost"]))
            else:
                doc = {"prompt": random.choice(PROMPTS), "size": f"{size}x{size}", "steps": steps}
                got = self.timed("image", lambda: post_json(self.urls["imagine"], "/v1/images/generations", doc, token=user.token))
                if got and self.judge("image", *got):
                    user.charged(Decimal(got[0].json()["hearth"]["cost"]))
        finally:
            user.images.release()

    # -- metrics

    def metrics(self):
        for service in SERVICES:
            got = self.timed("metrics", lambda: call(self.urls[service], "GET", "/metrics"))
            if got:
                self.judge("metrics", *got, tolerated=())

    def plan(self):
        """(class, seconds between two sends at --rate 1, in-flight cap, method). About three
        requests a second in all at --rate 1: a few short completions, a document every few
        seconds, an image every ten; sized for 2 cores."""
        return [
            ("signin", 4.0, 4, self.signin),
            ("logout", 30.0, 2, self.logout),
            ("complete", 3.0, 6, self.complete),
            ("stream", 3.0, 6, self.stream),
            ("v1", 6.0, 4, self.v1),
            ("v1-stream", 6.0, 4, self.v1_stream),
            ("stop", 20.0, 2, self.stream_stopped),
            ("cut", 4.0, 4, self.cut),
            ("markdown", 4.0, 4, self.markdown),
            ("hostile", 10.0, 2, self.hostile_upload),
            ("image", 12.0, 2, self.image),
            ("metrics", 15.0, 1, self.metrics),
        ]
