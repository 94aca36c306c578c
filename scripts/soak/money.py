"""The money and the server's own counts: /metrics scrapes, money in flight, and the check of
every soak user's ledger against its balance and against what the answers reported."""

import os
import re
from decimal import Decimal

from common import INITIAL_BALANCE
from wire import call


def scrape(url):
    """The samples of a /metrics answer: {name{labels}: value}."""
    out = {}
    for line in call(url, "GET", "/metrics", timeout=10).body.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def money_in_flight(urls):
    """Per service with money: held, charged, released (credits, from /metrics)."""
    out = {}
    for service in ("completion", "imagine"):
        m = scrape(urls[service])
        get = lambda name: m.get(f'hearth_billing_{name}_credits_total{{service="{service}"}}', 0.0)
        out[service] = (get("held"), get("charged"), get("released"))
    return out


def server_counts(urls):
    """What the server says it did: completions finished and aborted (the cut ones should be
    aborted, not run to their end), conversions by outcome."""
    text = scrape(urls["completion"])
    total = lambda name: sum(v for k, v in text.items() if k.startswith(f"hearth_completion_{name}_total{{"))
    outcomes = {}
    for key, value in scrape(urls["markdown"]).items():
        m = re.match(r'hearth_markdown_conversions_total\{.*outcome="([^"]+)"', key)
        if m:
            outcomes[m.group(1)] = outcomes.get(m.group(1), 0) + int(value)
    return {"finished": int(total("finished")), "aborted": int(total("aborted")),
            "rejected": int(total("rejected")), "conversions": outcomes}


def parse_ledger(text):
    rows = []
    for line in text.splitlines()[1:]:
        m = re.match(r"\s*(\d+)\s+(\S+)\s+(-?\d+\.\d+)\s+(-?\d+\.\d+)\s+(.*)$", line)
        if m:
            rows.append((Decimal(m.group(3)), Decimal(m.group(4)), m.group(5)))
    return rows


def parse_users(text):
    out = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 2:
            out[parts[0]] = Decimal(parts[1])
    return out


def multiset_minus(have, take):
    """`have` minus `take` as multisets; (rest of have, what of take was missing)."""
    rest = sorted(have)
    missing = []
    for x in take:
        try:
            rest.remove(x)
        except ValueError:
            missing.append(x)
    return rest, missing


def money_check(server, users, balances_live, report):
    """After the server stopped: the ledger of every soak user against its balance and against
    what the answers said. Returns (every check holds, the debits of all soak users)."""
    ok = True
    all_debits = Decimal(0)
    listed = parse_users(server.cli("users", "list"))
    released = server.cli("holds", "release", "--node", open(os.path.join(server.data_dir, "node-id")).read().strip())
    m = re.search(r"released (\d+) hold", released)
    open_holds = int(m.group(1)) if m else -1
    if open_holds != 0:
        ok = False
    report(f"- holds left open in the store after a clean stop: {open_holds} "
           f"({'ok' if open_holds == 0 else 'FAIL'})")
    report("")
    report("| user | kind | initial | ledger debits | rows | end balance | reported by answers | cuts | check |")
    report("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for user in users:
        rows = parse_ledger(server.cli("ledger", user.name))
        end = listed.get(user.name)
        problems = []
        initial = rows[0][0] if rows and rows[0][2] == "initial balance" else None
        if initial != INITIAL_BALANCE:
            problems.append(f"first ledger row is not the initial balance {INITIAL_BALANCE}")
        debits = [-amount for amount, _, reason in rows[1:] if amount < 0]
        credits = [amount for amount, _, reason in rows[1:] if amount > 0]
        if credits:
            problems.append(f"{len(credits)} unexpected credit rows")
        total = sum((amount for amount, _, _ in rows), Decimal(0))
        if end is None:
            problems.append("not in `users list`")
        elif end != total:
            problems.append(f"balance {end} != ledger sum {total}")
        if balances_live.get(user.name) is not None and balances_live[user.name] != end:
            problems.append(f"live balance {balances_live[user.name]} != stopped {end}")
        all_debits += sum(debits, Decimal(0))
        reported = [c for c in user.reported if c != 0]
        debits_nz = [d for d in debits if d != 0]
        if not user.cutter:
            # Never hung up: every debit is an answer's reported cost, one for one.
            extra, missing = multiset_minus(debits_nz, reported)
            if extra or missing:
                problems.append(f"{len(extra)} debits no answer reported ({sum(extra, Decimal(0))}), "
                                f"{len(missing)} reported costs not in the ledger ({sum(missing, Decimal(0))})")
        else:
            # Hung up on some: the reported costs are all there, and what is left is the cut
            # requests', at most one row each, each at most what such a request can cost.
            extra, missing = multiset_minus(debits_nz, reported)
            if missing:
                problems.append(f"{len(missing)} reported costs not in the ledger ({sum(missing, Decimal(0))})")
            if len(extra) > user.cuts:
                problems.append(f"{len(extra)} unexplained debits for {user.cuts} cut requests")
            if sum(extra, Decimal(0)) > user.cut_bound:
                problems.append(f"cut requests cost {sum(extra, Decimal(0))}, over their bound {user.cut_bound:.6f}")
        ok = ok and not problems
        report(f"| {user.name} | {'cutter' if user.cutter else 'clean'} | {initial} | {sum(debits, Decimal(0))} | "
               f"{len(rows)} | {end} | {sum(reported, Decimal(0))} | {user.cuts} | "
               f"{'ok' if not problems else 'FAIL: ' + '; '.join(problems)} |")
    return ok, all_debits
