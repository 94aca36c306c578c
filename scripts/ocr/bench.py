"""OCR engines side by side on the same pages (scripts/bench-ocr.sh), each limited to the same
number of threads, one page at a time: Tesseract 5's CLI (Debian's tesseract-ocr; `--psm 1`,
page segmentation with orientation detection, so a page turned a quarter is read too), and
RapidOCR on onnxruntime with the PP-OCR models its PyPI wheels ship: PP-OCRv4 mobile
(rapidocr-onnxruntime 1.4) and PP-OCRv6 small (rapidocr 3.10).

For each page: seconds, word recall (the share of the ground truth's words, counted with
repeats, that the output holds, case-folded, punctuation stripped) and bigram recall (the same
for pairs of neighbouring words: it falls when lines of two columns are read across). Prints a
JSON line per engine and page, then a table.

    python3 scripts/ocr/bench.py PAGES_DIR [--threads 2] [--runs 2]
    python3 scripts/ocr/bench.py PAGES_DIR --tesseract-langs eng,eng+fra,Latin

With `--tesseract-langs`, only Tesseract runs, once per language setting given (`eng+fra`: both
models; `Latin`: the script model for every Latin-script language), all pages read with it
(`--psm 3`): what reading accented text without configuration costs.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import time
import unicodedata


def words(text):
    text = unicodedata.normalize("NFC", text).lower().replace("’", "'")
    return re.findall(r"[^\W_]+(?:'[^\W_]+)?", text)


def recall(truth, got):
    want, have = collections.Counter(truth), collections.Counter(got)
    return sum(min(n, have[w]) for w, n in want.items()) / max(1, sum(want.values()))


def bigrams(ws):
    return list(zip(ws, ws[1:]))


def tesseract(path, lang, threads, psm="1"):
    env = dict(os.environ, OMP_THREAD_LIMIT=str(threads))
    out = subprocess.run(["tesseract", path, "stdout", "-l", lang, "--psm", psm],
                         capture_output=True, text=True, env=env, check=True)
    return out.stdout


class RapidV4:
    """rapidocr-onnxruntime 1.4: PP-OCRv4 mobile detection and (Chinese-English) recognition."""

    def __init__(self, threads):
        from rapidocr_onnxruntime import RapidOCR
        self.engine = RapidOCR(intra_op_num_threads=threads, inter_op_num_threads=1)

    def __call__(self, path, lang, threads):
        result, _ = self.engine(path)
        # Lines top to bottom (the engine's order), one per detected box.
        return "\n".join(r[1] for r in (result or []))


class RapidV6:
    """rapidocr 3.10: PP-OCRv6 small detection and recognition."""

    def __init__(self, threads):
        from rapidocr import RapidOCR
        self.engine = RapidOCR(params={
            "Global.log_level": "critical",
            "EngineConfig.onnxruntime.intra_op_num_threads": threads,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        })

    def __call__(self, path, lang, threads):
        return "\n".join(self.engine(path).txts or [])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pages")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--tesseract-langs", help="comma-separated Tesseract language settings")
    a = ap.parse_args()
    names = sorted(n[:-4] for n in os.listdir(a.pages) if n.endswith(".png"))
    if a.tesseract_langs:
        engines = {f"tesseract-{l}": (lambda path, _, threads, l=l: tesseract(path, l, threads, "3"))
                   for l in a.tesseract_langs.split(",")}
        names = [n for n in names if not n.startswith("turned")]  # --psm 3 does not turn pages
    else:
        engines = {"tesseract": tesseract}
        for name, make in (("pp-ocrv4", RapidV4), ("pp-ocrv6", RapidV6)):
            t = time.monotonic()
            engines[name] = make(a.threads)
            print(f"{name} loaded in {time.monotonic() - t:.2f} s", flush=True)
    rows = []
    for name in names:
        path = os.path.join(a.pages, name + ".png")
        truth = words(open(os.path.join(a.pages, name + ".txt"), encoding="utf-8").read())
        lang = "fra" if name.startswith("french") else "eng"
        for engine, run in engines.items():
            times = []
            for _ in range(a.runs):
                t = time.monotonic()
                text = run(path, lang, a.threads)
                times.append(time.monotonic() - t)
            got = words(text)
            row = {"engine": engine, "page": name, "s": round(min(times), 3),
                   "word_recall": round(recall(truth, got), 4),
                   "bigram_recall": round(recall(bigrams(truth), bigrams(got)), 4)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    heads = " | ".join(f"{e} s | recall | bigrams" for e in engines)
    print(f"\n| page | {heads} |")
    print("|---|" + "---:|" * 3 * len(engines))
    by = {(r["engine"], r["page"]): r for r in rows}
    for name in names:
        cells = " | ".join(
            f"{by[(e, name)]['s']:.2f} | {by[(e, name)]['word_recall']:.1%} | "
            f"{by[(e, name)]['bigram_recall']:.1%}" for e in engines)
        print(f"| {name} | {cells} |")
    for engine in engines:
        rs = [r for r in rows if r["engine"] == engine]
        print(f"{engine}: mean word recall {sum(r['word_recall'] for r in rs) / len(rs):.1%}, "
              f"{sum(r['s'] for r in rs):.2f} s for {len(rs)} pages")


if __name__ == "__main__":
    main()
