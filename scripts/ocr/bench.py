"""OCR engines side by side on the same pages (scripts/bench-ocr.sh), each limited to the same
number of threads, one file at a time: Tesseract 5's CLI (Debian's tesseract-ocr; `--psm 1`,
page segmentation with orientation detection, so a turned page is read too; the languages
Hearth reads by default), RapidOCR on onnxruntime with the PP-OCR models its PyPI wheels ship:
PP-OCRv4 mobile (rapidocr-onnxruntime 1.4) and PP-OCRv6 small (rapidocr 3.10), and, with
`--hearth`, Hearth's markdown library through its md_convert example (the time it reports, best
of `--runs` in one process; the text of the Markdown it writes).

Two sets of files. The generated pages (scripts/ocr/pages.py: PAGE.png or PAGE.tif beside
PAGE.txt): seconds, word recall (the share of the ground truth's words, counted with repeats,
that the output holds, case-folded, punctuation stripped) and bigram recall (the same for pairs
of neighbouring words: it falls when lines of two columns are read across, or pages out of
order). The real scans (`--scans DIR --phrases FILE`: files under DIR named by the keys of a
JSON object whose values hold `phrases`, optionally `hard_phrases` and `pages_with_each_phrase`):
seconds and phrase recall (the share of the phrases found, case-folded, runs of whitespace as
one space, each as often as the pages that carry it). Engines other than Hearth get one image per
page: a TIFF's frames and a PDF's pages (rendered at 300 dpi with pypdfium2) are written out
before timing, and their times are summed. Prints a JSON line per engine and file, then tables.

    python3 scripts/ocr/bench.py PAGES_DIR [--threads 2] [--runs 2] [--engines tesseract]
    python3 scripts/ocr/bench.py PAGES_DIR --hearth target/release/examples/md_convert
    python3 scripts/ocr/bench.py [PAGES_DIR] --scans .cache/test-docs --phrases SCANS.json
    python3 scripts/ocr/bench.py PAGES_DIR --tesseract-langs eng,eng+fra,Latin

With `--tesseract-langs`, only Tesseract runs, once per language setting given (`eng+fra`: both
models; `Latin`: the script model for every Latin-script language), all pages read with it
(`--psm 3`, so the turned pages are left out): what reading accented text without configuration
costs.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import tempfile
import time
import unicodedata

# Hearth's default OCR languages (issue 34): English and the six Western European models.
LANGS = "eng+fra+deu+spa+ita+por+nld"


def words(text):
    text = unicodedata.normalize("NFC", text).lower().replace("’", "'")
    return re.findall(r"[^\W_]+(?:'[^\W_]+)?", text)


def recall(truth, got):
    want, have = collections.Counter(truth), collections.Counter(got)
    return sum(min(n, have[w]) for w, n in want.items()) / max(1, sum(want.values()))


def bigrams(ws):
    return list(zip(ws, ws[1:]))


def flat(text):
    """Text for phrase matching: Markdown's backslash escapes and bold marks taken out, NFC,
    case-folded, runs of whitespace as one space."""
    text = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text).replace("**", "")
    return re.sub(r"\s+", " ", unicodedata.normalize("NFC", text).casefold()).strip()


def phrase_recall(entry, text):
    """(share found, phrases missed) for one scan's entry of the phrases file."""
    phrases = entry["phrases"] + entry.get("hard_phrases", [])
    need = entry.get("pages_with_each_phrase", 1)
    have = flat(text)
    counts = {p: min(need, have.count(flat(p))) for p in phrases}
    missed = [p for p, n in counts.items() if n < need]
    return sum(counts.values()) / max(1, need * len(phrases)), missed


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


class Hearth:
    """Hearth's markdown library (the md_convert example), given the file as it is."""

    whole_files = True

    def __init__(self, binary, runs):
        self.binary, self.runs = binary, runs
        self.out = tempfile.mkdtemp(prefix="bench-ocr-hearth-")

    def __call__(self, path, lang, threads):
        env = dict(os.environ, OMP_THREAD_LIMIT=str(threads))
        line = subprocess.run([self.binary, "--repeat", str(self.runs), "--out", self.out, path],
                              capture_output=True, text=True, env=env, check=True).stdout
        _, _, _, ms, _, self.status = line.rstrip("\n").split("\t", 5)
        if self.status != "ok":
            return "", float(ms) / 1000
        with open(os.path.join(self.out, os.path.basename(path) + ".md"), encoding="utf-8") as f:
            return f.read(), float(ms) / 1000


def page_images(path, work):
    """One image per page of `path`: the file itself, a TIFF's frames or a PDF's pages at 300
    dpi, written under `work`."""
    ext = path.rsplit(".", 1)[-1].lower()
    if ext not in ("tif", "tiff", "pdf"):
        return [path]
    stem = os.path.join(work, os.path.basename(path))
    out = []
    if ext == "pdf":
        import pypdfium2
        pdf = pypdfium2.PdfDocument(path)
        for i in range(len(pdf)):
            out.append(f"{stem}-{i + 1}.png")
            pdf[i].render(scale=300 / 72).to_pil().convert("L").save(out[-1], dpi=(300, 300))
        return out
    from PIL import Image, ImageSequence
    with Image.open(path) as img:
        for i, frame in enumerate(ImageSequence.Iterator(img)):
            out.append(f"{stem}-{i + 1}.png")
            frame.save(out[-1], dpi=frame.info.get("dpi", (300, 300)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pages", nargs="?", help="generated pages (scripts/ocr/pages.py)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--langs", default=LANGS, help="Tesseract's languages (default: Hearth's)")
    ap.add_argument("--engines", default="tesseract,pp-ocrv4,pp-ocrv6")
    ap.add_argument("--hearth", metavar="MD_CONVERT", help="add Hearth, through this md_convert")
    ap.add_argument("--scans", metavar="DIR", help="real scans, named by --phrases' keys")
    ap.add_argument("--phrases", metavar="FILE", help="JSON: scan file -> its phrases")
    ap.add_argument("--tesseract-langs", help="comma-separated Tesseract language settings")
    a = ap.parse_args()
    if bool(a.scans) != bool(a.phrases):
        ap.error("--scans and --phrases go together")
    if not a.pages and not a.scans:
        ap.error("give PAGES_DIR, --scans or both")

    # (set, name, path, truth): truth is a word list for a page, a phrases entry for a scan.
    items = []
    for name in sorted(os.listdir(a.pages) if a.pages else []):
        stem, ext = os.path.splitext(name)
        if ext in (".png", ".tif") and not (a.tesseract_langs and stem.startswith("turned")):
            with open(os.path.join(a.pages, stem + ".txt"), encoding="utf-8") as f:
                items.append(("page", stem, os.path.join(a.pages, name), words(f.read())))
    if a.scans:
        with open(a.phrases, encoding="utf-8") as f:
            phrases = json.load(f)
        items += [("scan", rel, os.path.join(a.scans, rel), entry)
                  for rel, entry in phrases.items() if not rel.startswith("_")]

    if a.tesseract_langs:
        engines = {f"tesseract-{l}": (lambda path, _, threads, l=l: tesseract(path, l, threads, "3"))
                   for l in a.tesseract_langs.split(",")}
    else:
        engines = {}
        makers = {"tesseract": lambda: tesseract, "pp-ocrv4": lambda: RapidV4(a.threads),
                  "pp-ocrv6": lambda: RapidV6(a.threads)}
        for name in a.engines.split(","):
            t = time.monotonic()
            engines[name] = makers[name]()
            if name != "tesseract":
                print(f"{name} loaded in {time.monotonic() - t:.2f} s", flush=True)
        if a.hearth:
            engines["hearth"] = Hearth(a.hearth, a.runs)

    work = tempfile.mkdtemp(prefix="bench-ocr-pages-")
    rows = []
    for kind, name, path, truth in items:
        images = page_images(path, work)
        for engine, run in engines.items():
            if getattr(run, "whole_files", False):
                text, s = run(path, a.langs, a.threads)  # best of --runs, timed by the engine
            else:
                times, texts = [], []
                for image in images:
                    best = None
                    for _ in range(a.runs):
                        t = time.monotonic()
                        out = run(image, a.langs, a.threads)
                        took = time.monotonic() - t
                        best = took if best is None else min(best, took)
                    times.append(best)
                    texts.append(out)
                text, s = "\n\n".join(texts), sum(times)
            row = {"engine": engine, kind: name, "s": round(s, 3)}
            if getattr(run, "status", "ok") != "ok":
                row["status"] = run.status
            if kind == "page":
                got = words(text)
                row["word_recall"] = round(recall(truth, got), 4)
                row["bigram_recall"] = round(recall(bigrams(truth), bigrams(got)), 4)
            else:
                share, missed = phrase_recall(truth, text)
                row["phrase_recall"] = round(share, 4)
                row["missed"] = missed
            rows.append(row)
            print(json.dumps(row, ensure_ascii=False), flush=True)

    by = {(r["engine"], r.get("page") or r.get("scan")): r for r in rows}
    pages = [name for kind, name, _, _ in items if kind == "page"]
    scans = [name for kind, name, _, _ in items if kind == "scan"]
    if pages:
        heads = " | ".join(f"{e} s | recall | bigrams" for e in engines)
        print(f"\n| page | {heads} |")
        print("|---|" + "---:|" * 3 * len(engines))
        for name in pages:
            cells = " | ".join(
                f"{by[(e, name)]['s']:.2f} | {by[(e, name)]['word_recall']:.1%} | "
                f"{by[(e, name)]['bigram_recall']:.1%}" for e in engines)
            print(f"| {name} | {cells} |")
    if scans:
        heads = " | ".join(f"{e} s | phrases" for e in engines)
        print(f"\n| scan | {heads} |")
        print("|---|" + "---:|" * 2 * len(engines))
        for name in scans:
            cells = " | ".join(f"{by[(e, name)]['s']:.2f} | {by[(e, name)]['phrase_recall']:.1%}"
                               for e in engines)
            print(f"| {name} | {cells} |")
    for engine in engines:
        for kind, names, key, what in (("page", pages, "word_recall", "word"),
                                       ("scan", scans, "phrase_recall", "phrase")):
            rs = [by[(engine, n)] for n in names]
            if rs:
                print(f"{engine}: mean {what} recall {sum(r[key] for r in rs) / len(rs):.1%}, "
                      f"{sum(r['s'] for r in rs):.2f} s for {len(rs)} {kind}s")


if __name__ == "__main__":
    main()
