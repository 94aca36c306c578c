#!/usr/bin/env bash
# OCR engines side by side on the same pages, to choose the markdown service's engine by
# measurement (issue 34): Tesseract 5 (Debian's tesseract-ocr, installed here when missing and
# this runs as root) against PP-OCR on onnxruntime as PyPI's RapidOCR wheels ship it (PP-OCRv4
# mobile in rapidocr-onnxruntime, PP-OCRv6 small in rapidocr), each on the same number of
# threads, one page at a time, in one run; with --hearth, Hearth's markdown library too (the
# md_convert example, release build, built here).
#
#   scripts/bench-ocr.sh [--threads 2] [--runs 2] [--engines tesseract,pp-ocrv4,pp-ocrv6]
#   scripts/bench-ocr.sh --hearth --scans --engines tesseract   # Hearth against Tesseract's CLI
#   scripts/bench-ocr.sh --tesseract-langs eng,eng+fra,Latin   # Tesseract's language settings
#
# The pages (scripts/ocr/pages.py, into .cache/bench-ocr/pages): A4 text in DejaVu Serif at 300
# and 150 dpi, with noise and blur, skewed 2 and 6 degrees, turned 90, 180 and 270 degrees, in two
# columns (also under a title), in accented French, German and Spanish, a heading over hyphenated
# paragraphs, and two pages in one TIFF, each beside its ground truth. With --scans, also the
# real scans that scripts/fetch-test-docs.sh fetches (ocrmypdf's and tesserocr's test images and
# image-only PDFs), scored by the phrases listed for each in $HEARTH_OCR_PHRASES (default
# crates/markdown/tests/ocr_scans.json). Tesseract reads with --psm 1 and Hearth's default
# languages (--langs to change). Prints a JSON line per engine and file (seconds, word and bigram
# recall, or phrase recall), then tables (scripts/ocr/bench.py). Figures: docs/benchmarks.md.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
WORK="$ROOT/.cache/bench-ocr"
VENV="$WORK/venv"
mkdir -p "$WORK"

ARGS=()
HEARTH=0
SCANS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --hearth) HEARTH=1 ;;
        --scans) SCANS=1 ;;
        *) ARGS+=("$1") ;;
    esac
    shift
done

if ! command -v tesseract >/dev/null; then
    pkgs=(tesseract-ocr tesseract-ocr-fra tesseract-ocr-deu tesseract-ocr-spa tesseract-ocr-ita
        tesseract-ocr-por tesseract-ocr-nld tesseract-ocr-script-latn)
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y -q "${pkgs[@]}" >/dev/null ||
            { apt-get update -q >/dev/null && apt-get install -y -q "${pkgs[@]}" >/dev/null; }
    else
        echo "bench-ocr: needs tesseract (apt-get install ${pkgs[*]})" >&2
        exit 1
    fi
fi
PACKAGES=(pillow==13.0.0 rapidocr-onnxruntime==1.4.4 rapidocr==3.10.0 onnxruntime==1.32.0
    pypdfium2==5.15.2)
if [ ! -x "$VENV/bin/python" ] ||
    [ "$(cat "$VENV/.packages" 2>/dev/null)" != "${PACKAGES[*]}" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet "${PACKAGES[@]}"
    echo "${PACKAGES[*]}" >"$VENV/.packages"
fi
"$VENV/bin/python" scripts/ocr/pages.py "$WORK/pages"
if [ "$HEARTH" = 1 ]; then
    echo "building md_convert (release)..." >&2
    cargo build --quiet --release -p hearth-markdown --example md_convert
    ARGS+=(--hearth "${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/md_convert")
fi
if [ "$SCANS" = 1 ]; then
    PHRASES="${HEARTH_OCR_PHRASES:-$ROOT/crates/markdown/tests/ocr_scans.json}"
    if [ ! -f "$PHRASES" ]; then
        echo "bench-ocr: no phrases file $PHRASES (HEARTH_OCR_PHRASES)" >&2
        exit 1
    fi
    scripts/fetch-test-docs.sh >/dev/null
    ARGS+=(--scans "${HEARTH_TEST_DOCS:-$ROOT/.cache/test-docs}" --phrases "$PHRASES")
fi
{ tesseract --version 2>&1 | head -1; uptime; } >&2
"$VENV/bin/python" scripts/ocr/bench.py "$WORK/pages" "${ARGS[@]}"
