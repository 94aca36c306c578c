"""Scanned-looking pages with known text, for measuring OCR engines (scripts/bench-ocr.sh).

Each page is drawn with Debian's DejaVu fonts and then degraded the way scans are: a lower
resolution, speckle noise and blur, a small skew, a quarter turn, two columns, accented French.
The text is this project's own. Writes PAGE.png and PAGE.txt (the ground truth) per page.

    python3 scripts/ocr/pages.py OUT_DIR
"""
import os
import random
import sys
import textwrap

from PIL import Image, ImageDraw, ImageFilter, ImageFont

ENGLISH = [
    "The harbour office opens at seven in the morning, when the first ferries come in from the "
    "islands. Clerks record every arrival in a ledger kept beside the window, and the harbour "
    "master signs each page before noon. Fishermen bring their catch to the market hall across "
    "the square, where buyers from the inland towns wait with their carts.",
    "Repairs to the northern pier began last spring and are expected to finish before the "
    "autumn storms. Engineers replaced the wooden pilings with concrete columns, widened the "
    "walkway for delivery vans, and installed new lamps along the entire length of the quay. "
    "Visitors may still use the southern steps while the work continues.",
    "Questions about mooring fees, winter storage or the schedule of the pilot boats should be "
    "sent in writing to the office. Payments are accepted by bank transfer or in person during "
    "opening hours. Receipts are issued for every transaction and must be kept for three years.",
]
FRENCH = [
    "Le bureau du port ouvre à sept heures, dès l'arrivée des premiers bateaux venus des îles. "
    "Les employés notent chaque entrée dans un registre posé près de la fenêtre, et le "
    "capitaine du port signe chaque page avant midi. Les pêcheurs apportent leur prise à la "
    "halle du marché, où les acheteurs des villages voisins attendent déjà.",
    "Les travaux de la jetée nord ont commencé au printemps dernier et devraient être achevés "
    "avant les tempêtes d'automne. Les ingénieurs ont remplacé les pieux en bois par des "
    "colonnes en béton, élargi la passerelle et installé de nouvelles lampes le long du quai.",
]
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf"


def draw(paragraphs, dpi=300, columns=1, font_pt=11):
    """An A4 page at `dpi` with `paragraphs` set in `columns`; returns (image, text)."""
    w, h = int(8.27 * dpi), int(11.69 * dpi)
    img = Image.new("L", (w, h), 255)
    d = ImageDraw.Draw(img)
    font = ImageFont.truetype(FONT, int(font_pt * dpi / 72))
    margin, gutter = int(0.9 * dpi), int(0.35 * dpi)
    col_w = (w - 2 * margin - gutter * (columns - 1)) // columns
    char_w = d.textlength("abcdefghijklmnopqrstuvwxyz", font=font) / 26
    line_h = int(font.size * 1.35)
    per_col = (len(paragraphs) + columns - 1) // columns
    for c in range(columns):
        x, y = margin + c * (col_w + gutter), margin
        for p in paragraphs[c * per_col:(c + 1) * per_col]:
            for line in textwrap.wrap(p, width=max(10, int(col_w / char_w))):
                d.text((x, y), line, font=font, fill=0)
                y += line_h
            y += line_h // 2
    return img, "\n\n".join(paragraphs)


def degrade(img, noise=0.0, blur=0.0, skew=0.0, turn=0, seed=1):
    rnd = random.Random(seed)
    if blur:
        img = img.filter(ImageFilter.GaussianBlur(blur))
    if noise:
        px = img.load()
        w, h = img.size
        for _ in range(int(w * h * noise)):
            x, y = rnd.randrange(w), rnd.randrange(h)
            px[x, y] = 0 if rnd.random() < 0.5 else 255
    if skew:
        img = img.rotate(skew, resample=Image.BICUBIC, expand=True, fillcolor=255)
    if turn:
        img = img.rotate(turn, expand=True)
    return img


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    pages = {
        "clean-300dpi": (draw(ENGLISH), {}),
        "clean-150dpi": (draw(ENGLISH, dpi=150), {}),
        "noisy-blurred": (draw(ENGLISH), {"noise": 0.004, "blur": 1.2}),
        "skewed-2deg": (draw(ENGLISH), {"skew": 2.0}),
        "turned-90": (draw(ENGLISH), {"turn": 90}),
        "two-columns": (draw(ENGLISH + ENGLISH[:1], columns=2), {}),
        "french": (draw(FRENCH), {}),
    }
    for name, ((img, text), how) in pages.items():
        degrade(img, **how).save(os.path.join(out, name + ".png"), dpi=(300, 300))
        with open(os.path.join(out, name + ".txt"), "w", encoding="utf-8") as f:
            f.write(text)
    print(f"{len(pages)} pages in {out}")


if __name__ == "__main__":
    main()
