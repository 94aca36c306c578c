#!/usr/bin/env bash
# Benchmark: markitdown (PyPI, in a git-ignored venv) against Hearth's markdown converter, on the
# same corpus (scripts/fetch-test-docs.sh), in one run. Hearth is measured twice: the library
# (release build of the md_convert example, in-process timing per file, best of N) and the
# service over HTTP (the hearth binary's markdown listener, one keep-alive connection, timing per
# request).
# markitdown is timed in-process too, after its imports, so neither side pays start-up costs.
# Prints per-format and total times with ratios, and a content check per document: word counts
# and the share of markitdown's distinct words that Hearth's output also contains (words of
# letters only, found whole or inside a longer word; markitdown's own labels and comments, data
# URIs, pandas placeholders, raw RTF control words and, for e-mail, MIME transfer encodings are
# taken out of its side first). Hearth runs with its defaults, which list e-mail attachments as
# markitdown leaves them out; a second total has Hearth convert them (--attachments convert) and
# adds markitdown's time on the same attachment files (saved from the .msg with olefile).
#
# Usage: scripts/bench-markdown.sh [--no-service] [--repeat N]
# (HEARTH_BIN=path/to/release/hearth measures that binary instead of building one.)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
SERVICE=1
REPEAT=3
while [ $# -gt 0 ]; do
  case "$1" in
    --no-service) SERVICE=0 ;;
    --repeat) REPEAT="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
CORPUS="$ROOT/.cache/test-docs"
WORK="$ROOT/.cache/bench-markdown"
VENV="$ROOT/.venv-markitdown"
mkdir -p "$WORK"

scripts/fetch-test-docs.sh >/dev/null
# The corpus: every fetched document except the deliberately unreadable ones (encrypted) and the
# scans (markitdown reads no text from pictures; scripts/bench-ocr.sh measures OCR), plus a zip
# of a few of them, built here.
FILES=()
while IFS= read -r f; do FILES+=("$f"); done < <(find "$CORPUS" -type f ! -name 'r6-user-password.pdf' ! -name 'password.xlsx' \
  ! -path "$CORPUS/ocr-pages/*" ! -path "$CORPUS/ocrmypdf/*" ! -path "$CORPUS/tesserocr/*" | sort)
python3 - "$WORK/bundle.zip" "$CORPUS" <<'PY'
import sys, zipfile, os
out, corpus = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    for rel in ["python-docx/test.docx", "csvkit/iris.csv", "pypdf/crazyones.pdf", "nbformat/test4.ipynb"]:
        z.write(os.path.join(corpus, rel), os.path.basename(rel))
PY
FILES+=("$WORK/bundle.zip")

if [ ! -x "$VENV/bin/python" ]; then
  # 0.1.9 requires a certifi newer than the registry holds here; 0.1.8 is the newest that installs.
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet 'markitdown[pdf,docx,pptx,xlsx,xls,outlook]==0.1.8'
fi

echo "building hearth (release)..." >&2
cargo build --quiet ${BENCH_PROFILE:---release} -p hearth-markdown --example md_convert
# HEARTH_BIN: an already built release `hearth` to measure (skips building it).
HEARTH_BIN="${HEARTH_BIN:-$CARGO_TARGET_DIR/release/hearth}"
if [ "$SERVICE" = 1 ] && [ "$HEARTH_BIN" = "$CARGO_TARGET_DIR/release/hearth" ]; then
  cargo build --quiet --release --bin hearth
fi

printf '%s\n' "${FILES[@]}" > "$WORK/files.txt"

# markitdown, in-process, best of N per file.
: > "$WORK/attachments.tsv"
"$VENV/bin/python" - "$WORK" "$REPEAT" <<'PY' > "$WORK/markitdown.tsv"
import os, sys, time, warnings
warnings.filterwarnings("ignore")
from markitdown import MarkItDown
work, repeat = sys.argv[1], int(sys.argv[2])
md = MarkItDown()
os.makedirs(f"{work}/out-markitdown", exist_ok=True)
for path in open(f"{work}/files.txt").read().split("\n"):
    if not path: continue
    best, text, status = None, "", "ok"
    for _ in range(repeat):
        t = time.perf_counter()
        try:
            text = md.convert(path).text_content or ""
        except Exception as e:
            text, status = "", "error: " + type(e).__name__
        dt = (time.perf_counter() - t) * 1000
        best = dt if best is None else min(best, dt)
    open(f"{work}/out-markitdown/{os.path.basename(path)}.md", "w").write(text)
    print(f"{path}\t{best:.3f}\t{len(text.split())}\t{status}")
    if path.lower().endswith(".msg"):
        # markitdown leaves an e-mail's attachments out; Hearth converts them on request. For
        # that comparison, save the file attachments (olefile, as markitdown reads .msg) and time
        # markitdown on each, once (embedded messages are not counted).
        import olefile
        ole = olefile.OleFileIO(path)
        folder = f"{work}/attachments/{os.path.basename(path)}"
        os.makedirs(folder, exist_ok=True)
        ms, words = 0.0, 0
        for att in sorted({e[0] for e in ole.listdir() if e[0].startswith("__attach_version1.0_")}):
            def stream(name):
                return ole.openstream([att, name]).read() if ole.exists(f"{att}/{name}") else None
            data = stream("__substg1.0_37010102")
            name = (stream("__substg1.0_3707001F") or stream("__substg1.0_3704001F") or b"").decode("utf-16-le")
            if not data or not name:
                continue
            target = os.path.join(folder, os.path.basename(name))
            open(target, "wb").write(data)
            t = time.perf_counter()
            try:
                words += len((md.convert(target).text_content or "").split())
            except Exception:
                pass
            ms += (time.perf_counter() - t) * 1000
        with open(f"{work}/attachments.tsv", "a") as out:
            out.write(f"{path}\t{ms:.3f}\t{words}\n")
PY

# Hearth library, in-process, best of N per file (as markitdown above); then the e-mails again,
# converting their attachments.
MD_CONVERT="$CARGO_TARGET_DIR/${BENCH_DIR:-release}/examples/md_convert"
EMAILS=()
for f in "${FILES[@]}"; do case "$f" in *.msg|*.eml) EMAILS+=("$f") ;; esac; done
"$MD_CONVERT" --repeat "$REPEAT" --out "$WORK/out-hearth" "${FILES[@]}" > "$WORK/hearth-lib.tsv"
"$MD_CONVERT" --repeat "$REPEAT" --attachments convert --out "$WORK/out-hearth-attachments" \
  "${EMAILS[@]}" > "$WORK/hearth-lib-attachments.tsv"

# Hearth service over HTTP.
if [ "$SERVICE" = 1 ]; then
  PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$HEARTH_BIN" serve --services markdown --data-dir "$WORK/data" \
    --markdown-addr "127.0.0.1:$PORT" > "$WORK/service.log" 2>&1 &
  SERVER_PID=$!
  trap 'kill $SERVER_PID 2>/dev/null || true' EXIT
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/" >/dev/null 2>&1 && break; sleep 0.1; done
  python3 - "$WORK" "$PORT" "$REPEAT" <<'PY' > "$WORK/hearth-http.tsv"
import http.client, os, sys, time, uuid, json
work, port, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
for path in open(f"{work}/files.txt").read().split("\n"):
    if not path: continue
    data = open(path, "rb").read()
    boundary = uuid.uuid4().hex
    name = os.path.basename(path)
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    best, status, words = None, "", 0
    for _ in range(repeat):
        t = time.perf_counter()
        conn.request("POST", "/", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})
        resp = conn.getresponse()
        payload = resp.read()
        dt = (time.perf_counter() - t) * 1000
        best = dt if best is None else min(best, dt)
        status = "ok" if resp.status == 200 else f"http {resp.status}"
        if resp.status == 200:
            words = len(json.loads(payload)["markdown"].split())
    print(f"{path}\t{best:.3f}\t{words}\t{status}")
PY
fi

python3 - "$WORK" "$SERVICE" <<'PY'
import os, re, sys, collections
work, service = sys.argv[1], sys.argv[2] == "1"
def load(path, cols):
    rows = {}
    for line in open(path):
        parts = line.rstrip("\n").split("\t")
        rows[parts[0]] = dict(zip(cols, parts[1:]))
    return rows
mk = load(f"{work}/markitdown.tsv", ["ms", "words", "status"])
lib = load(f"{work}/hearth-lib.tsv", ["format", "bytes", "ms", "words", "status"])
http = load(f"{work}/hearth-http.tsv", ["ms", "words", "status"]) if service else {}
def ext(p):
    e = os.path.splitext(p)[1].lower().lstrip(".")
    return {"jpg": "image", "tsv": "csv"}.get(e, e)
# Content words: runs of two or more letters (digit runs and numbers are not prose), after
# Unicode compatibility folding (so the ligature "ﬁ" and "fi" compare equal).
import unicodedata
def words(t):
    return set(re.findall(r"[^\W\d_]{2,}", unicodedata.normalize("NFKC", t).lower()))
# What markitdown adds that is not the document's: its slide-number comments, its own headings
# and labels ("# Email Message", "## Content", "Content from the zip file `<path>`"), inline
# image data URIs, and pandas' placeholders for empty cells and headers (NaN, NaT, "Unnamed: 3").
PLACEHOLDERS = {"nan", "nat", "unnamed"}
def reference(text, path):
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"data:[\w/+.-]+;base64[,.][A-Za-z0-9+/=.]*", " ", text)
    text = re.sub(r"^# Email Message$|^## Content$|^\*\*(From|To|Cc|Subject):\*\*", " ", text, flags=re.M)
    text = re.sub(r"Content from the zip file `[^`]*`", " ", text)
    lower = path.lower()
    if lower.endswith(".eml") and text:
        # markitdown passes e-mail through as its raw MIME source; read the same file's parts
        # (transfer encodings undone) so that the same words can be compared.
        import email, email.policy, html
        msg = email.message_from_bytes(open(path, "rb").read(), policy=email.policy.default)
        parts = [str(msg[k]) for k in ("From", "To", "Cc", "Subject", "Date") if msg[k]]
        def leaves(part):
            if part.get_content_type() == "multipart/alternative":
                kids = part.get_payload()
                plain = [k for k in kids if k.get_content_type() == "text/plain"]
                yield from leaves((plain or kids)[0])  # one alternative: the plain text
            elif part.is_multipart():
                for k in part.get_payload():
                    yield from leaves(k)
            else:
                yield part
        for part in leaves(msg):
            if part.get_content_maintype() == "text":
                body = part.get_content()
                if part.get_content_subtype() == "html":
                    body = re.sub(r"<(head|style|script)\b.*?</\1\s*>", " ", body, flags=re.S | re.I)
                    body = html.unescape(re.sub(r"<[^>]*>", " ", body))
                parts.append(body)
            elif part.get_filename():
                parts.append(part.get_filename())
        text = "\n".join(parts)
    if lower.endswith(".rtf"):
        # markitdown passes RTF through raw: drop control words and hex picture data.
        text = re.sub(r"\\'[0-9a-fA-F]{2}|\\[a-zA-Z]+-?\d* ?", " ", text)
        text = re.sub(r"[0-9a-fA-F]{16,}", " ", text)
    return words(text) - PLACEHOLDERS
def missing(mw, hw, h_text):
    # A word markitdown split differently (a PDF word broken at a line or by a stray space) is
    # kept when Hearth's text holds it inside a longer word.
    flat = unicodedata.normalize("NFKC", h_text).lower()
    return {w for w in mw - hw if w not in flat}
per = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
worse = []
print(f"{'document':44} {'fmt':6} {'markitdown ms':>13} {'hearth ms':>10} {'http ms':>9} {'ratio':>7} {'mk words':>9} {'h words':>8} {'kept':>6}")
for path in mk:
    lib_ms = float(lib[path]["ms"])
    m_ms = float(mk[path]["ms"])
    h_ms = float(http[path]["ms"]) if path in http else float("nan")
    f = ext(path)
    per[f][0] += 1; per[f][1] += m_ms; per[f][2] += lib_ms; per[f][3] += h_ms if path in http else 0
    name = os.path.basename(path)
    mk_text = open(f"{work}/out-markitdown/{name}.md", errors="replace").read()
    h_text = open(f"{work}/out-hearth/{name}.md", errors="replace").read()
    mw, hw = reference(mk_text, path), words(h_text)
    lost = missing(mw, hw, h_text)
    kept = 100.0 * (len(mw) - len(lost)) / len(mw) if mw else 100.0
    if mw and kept < 97.0:
        worse.append((name, kept, sorted(lost)[:12]))
    status = "" if mk[path]["status"] == "ok" else f"  (markitdown {mk[path]['status']})"
    print(f"{name[:44]:44} {f:6} {m_ms:13.1f} {lib_ms:10.2f} {h_ms:9.2f} {m_ms / max(lib_ms, 1e-3):6.0f}x {len(mk_text.split()):9} {len(h_text.split()):8} {kept:5.1f}%{status}")
print()
print(f"{'format':8} {'files':>5} {'markitdown ms':>14} {'hearth lib ms':>14} {'lib ratio':>10} {'hearth http ms':>15} {'http ratio':>11}")
tot = [0, 0.0, 0.0, 0.0]
for f in sorted(per):
    n, m, l, h = per[f]
    tot = [tot[0] + n, tot[1] + m, tot[2] + l, tot[3] + h]
    print(f"{f:8} {n:5} {m:14.1f} {l:14.2f} {m / max(l, 1e-3):9.1f}x {h:15.2f} {(m / h if h else float('nan')):10.1f}x")
n, m, l, h = tot
print(f"{'TOTAL':8} {n:5} {m:14.1f} {l:14.2f} {m / max(l, 1e-3):9.1f}x {h:15.2f} {(m / h if h else float('nan')):10.1f}x")
# The same corpus with Hearth converting e-mail attachments, against markitdown converting the
# same attachment files on their own.
conv = load(f"{work}/hearth-lib-attachments.tsv", ["format", "bytes", "ms", "words", "status"])
att = load(f"{work}/attachments.tsv", ["ms", "words"])
if conv:
    listed = sum(float(lib[p]["ms"]) for p in conv)
    converted = sum(float(c["ms"]) for c in conv.values())
    am = sum(float(a["ms"]) for a in att.values())
    la = l - listed + converted
    print(f"{'ATTACHED':8} {n:5} {m + am:14.1f} {la:14.2f} {(m + am) / max(la, 1e-3):9.1f}x"
          "   (Hearth converting e-mail attachments; markitdown also given the attachment files)")
    for p, c in conv.items():
        print(f"  {os.path.basename(p)}: Hearth with attachments {float(c['ms']):.1f} ms,"
              f" {c['words']} words" + (f"; markitdown on its file attachments, one run: {float(att[p]['ms']):.1f} ms,"
              f" {att[p]['words']} words" if p in att else ""))
print()
if worse:
    print("documents where Hearth kept less than 97% of markitdown's distinct words:")
    for name, kept, missing in worse:
        print(f"  {name}: {kept:.1f}% kept; missing e.g. {' '.join(missing)}")
else:
    print("no document where Hearth kept less than 97% of markitdown's distinct words")
PY
