"""The documents uploaded to the markdown service: generated benign ones, the real test documents
when fetched, and the hostile set (truncated, random, bombs, lying zips, billion laughs)."""

import io
import json
import os
import random
import zipfile

from common import TEST_DOCS


def tiny_pdf(text):
    """A one-page PDF with a line of text, its xref offsets computed (no library needed)."""
    content = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
               b"/Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for i, obj in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (i, obj))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for off in offsets:
        out.write(b"%010d 00000 n \n" % off)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


DOCX_TYPES = ('<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
              '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
              '<Default Extension="xml" ContentType="application/xml"/>'
              '<Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>')
DOCX_RELS = ('<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
             '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="word/document.xml"/></Relationships>')
DOCX_HEAD = '<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>'
DOCX_TAIL = '</w:body></w:document>'


def docx(paragraphs):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", DOCX_TYPES)
        z.writestr("_rels/.rels", DOCX_RELS)
        body = "".join(f"<w:p><w:r><w:t>{p}</w:t></w:r></w:p>" for p in paragraphs)
        z.writestr("word/document.xml", DOCX_HEAD + body + DOCX_TAIL)
    return buf.getvalue()


def docx_bomb(unpacked_mib=600):
    """A DOCX whose document.xml inflates past the converter's 512 MiB budget for unpacking
    (about 2 MB on the wire): it must be refused, not unpacked into the host."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("[Content_Types].xml", DOCX_TYPES)
        z.writestr("_rels/.rels", DOCX_RELS)
        with z.open("word/document.xml", "w", force_zip64=True) as f:
            f.write(DOCX_HEAD.encode())
            chunk = b"<w:p><w:r><w:t>a</w:t></w:r></w:p>" * 30000
            for _ in range(unpacked_mib * 2**20 // len(chunk)):
                f.write(chunk)
            f.write(DOCX_TAIL.encode())
    return buf.getvalue()


def zip_lying_sizes():
    """A zip whose member claims 4 GiB unpacked in both headers while holding a few bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("notes.txt", "hello " * 10)
    data = bytearray(buf.getvalue())
    for sig, field in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = data.find(sig)
        data[at + field:at + field + 4] = (0xFFFFFFFE).to_bytes(4, "little")
    return bytes(data)


def laughs(levels=8):
    """The billion-laughs XML: each entity ten of the one before; the converter must never
    expand DTD entities."""
    names = [chr(ord("a") + i) for i in range(levels + 1)]
    dtd = '<!ENTITY a "lol">' + "".join(f'<!ENTITY {n} "{("&" + p + ";") * 10}">' for p, n in zip(names, names[1:]))
    return f'<?xml version="1.0"?><!DOCTYPE lolz [{dtd}]><lolz>&{names[-1]};</lolz>'.encode()


def corpus():
    """(benign, hostile): lists of (filename, bytes). Benign documents must convert (200); the
    hostile ones may be refused, each class by the status the service documents for it."""
    benign = [
        ("plan.html", b"<h1>Plan</h1><p>Ship <b>Friday</b>.</p><table><tr><th>task</th><th>who</th></tr>"
                      b"<tr><td>docs</td><td>ann</td></tr></table>"),
        ("data.csv", b"name,count\napples,3\npears,5\nplums,8\n"),
        ("doc.json", json.dumps({"title": "soak", "items": list(range(20))}).encode()),
        ("notes.md", b"# Notes\n\n- one\n- two\n\nSome *text*.\n"),
        ("letter.docx", docx(["Dear reader,", "This is a soak test.", "Regards"])),
        ("page.pdf", tiny_pdf("Hello from the soak benchmark")),
        ("mail.eml", b"From: a@example.com\r\nTo: b@example.com\r\nSubject: soak\r\n\r\nHello there.\r\n"),
    ]
    real = []
    if os.path.isdir(TEST_DOCS):
        for dirpath, dirs, files in os.walk(TEST_DOCS):
            # Generated OCR pages and their ground truth (scripts/ocr/pages.py) are not documents.
            dirs[:] = [d for d in dirs if d != "ocr-pages"]
            for name in sorted(files):
                # The encrypted ones are refused by design: they go to the hostile set.
                if "password" in name or name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                if os.path.getsize(path) <= 4 * 2**20:
                    real.append(path)
    for path in sorted(real):
        with open(path, "rb") as f:
            benign.append((os.path.basename(path), f.read()))

    pdf = next((d for n, d in benign if n == "crazyones.pdf"), tiny_pdf("a PDF to cut short"))
    some_docx = next((d for n, d in benign if n == "test.docx"), benign[4][1])
    rnd = random.Random(7)
    hostile = [
        ("truncated.pdf", pdf[: len(pdf) * 2 // 5]),
        ("truncated.docx", some_docx[: len(some_docx) // 2]),
        ("random.bin", rnd.randbytes(64 * 1024)),
        ("random.pdf", b"%PDF-1.7\n" + rnd.randbytes(32 * 1024)),
        ("random.docx", b"PK\x03\x04" + rnd.randbytes(32 * 1024)),
        ("bomb.docx", docx_bomb()),
        ("lying.zip", zip_lying_sizes()),
        ("deep.html", b"<div>" * 200_000 + b"deep" + b"</div>" * 200_000),
        ("laughs.xml", laughs()),
        ("empty.txt", b""),
    ]
    if os.path.isdir(TEST_DOCS):
        for dirpath, _, files in os.walk(TEST_DOCS):
            for name in files:
                if "password" in name:
                    with open(os.path.join(dirpath, name), "rb") as f:
                        hostile.append((name, f.read()))
    return benign, hostile
