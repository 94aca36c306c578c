#!/usr/bin/env bash
# OCR engines side by side on the same pages, to choose the markdown service's engine by
# measurement (issue 34): Tesseract 5 (Debian's tesseract-ocr, installed here when missing and
# this runs as root) against PP-OCR on onnxruntime as PyPI's RapidOCR wheels ship it (PP-OCRv4
# mobile in rapidocr-onnxruntime, PP-OCRv6 small in rapidocr), each on the same number of
# threads, one page at a time, in one run.
#
#   scripts/bench-ocr.sh [--threads 2] [--runs 2]
#   scripts/bench-ocr.sh --tesseract-langs eng,eng+fra,Latin   # Tesseract's language settings
#
# The pages (scripts/ocr/pages.py, into .cache/bench-ocr/pages): A4 text in DejaVu Serif at 300
# and 150 dpi, with noise and blur, skewed 2 degrees, turned a quarter, in two columns, and in
# accented French, each beside its ground truth. Prints a JSON line per engine and page (seconds,
# word recall, bigram recall), then a table (scripts/ocr/bench.py). Figures: docs/benchmarks.md.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
WORK="$ROOT/.cache/bench-ocr"
VENV="$WORK/venv"
mkdir -p "$WORK"

if ! command -v tesseract >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        pkgs=(tesseract-ocr tesseract-ocr-fra tesseract-ocr-deu tesseract-ocr-script-latn)
        apt-get install -y -q "${pkgs[@]}" >/dev/null ||
            { apt-get update -q >/dev/null && apt-get install -y -q "${pkgs[@]}" >/dev/null; }
    else
        echo "bench-ocr: needs tesseract (apt-get install tesseract-ocr tesseract-ocr-fra" \
            "tesseract-ocr-deu tesseract-ocr-script-latn)" >&2
        exit 1
    fi
fi
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet pillow==13.0.0 rapidocr-onnxruntime==1.4.4 rapidocr==3.10.0 \
        onnxruntime==1.32.0
fi
"$VENV/bin/python" scripts/ocr/pages.py "$WORK/pages"
{ tesseract --version 2>&1 | head -1; uptime; } >&2
"$VENV/bin/python" scripts/ocr/bench.py "$WORK/pages" "$@"
