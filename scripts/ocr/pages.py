"""Scanned-looking pages with known text, for measuring OCR engines (scripts/bench-ocr.sh) and
for the markdown service's OCR tests (scripts/test.sh writes them to .cache/test-docs/ocr-pages).

Each page is drawn with Debian's DejaVu fonts (fonts-dejavu-core) and then degraded the way scans
are: a lower resolution, speckle noise and blur, skew of 2 and 6 degrees, turns of 90, 180 and 270
degrees, two columns (one under a full-width title), accented French, German and Spanish, a
heading over paragraphs with words hyphenated at line ends, two pages in one TIFF, and tables
(ruled, and aligned without rules) between paragraphs. The text is this project's own. Writes
PAGE.png (PAGE.tif for the two-page file) and PAGE.txt, the ground truth: the title, then the
paragraphs (a table's rows each one, its cells space-separated), blank-line separated, in reading
order, with no line-end hyphens; a page with a table also gets PAGE.cells, the table's rows with
tab-separated cells; the 150 dpi page is also written in colour as JPEG 2000 (clean-150dpi.jp2),
as scanners put pages into PDFs. Does nothing when OUT_DIR already holds this version's pages.

    python3 scripts/ocr/pages.py OUT_DIR
"""
import hashlib
import os
import random
import sys
import textwrap

import PIL
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
GERMAN = [
    "Das Hafenamt öffnet um sieben Uhr morgens, wenn die ersten Fähren von den Inseln einlaufen. "
    "Die Angestellten tragen jede Ankunft in ein Buch ein, das neben dem Fenster liegt, und der "
    "Hafenmeister unterschreibt jede Seite vor dem Mittag. Die Fischer bringen ihren Fang in die "
    "Markthalle am Platz, wo Händler aus den Dörfern im Landesinneren mit ihren Wagen warten.",
    "Die Arbeiten an der nördlichen Mole begannen im letzten Frühjahr und sollen vor den "
    "Herbststürmen abgeschlossen sein. Die Ingenieure ersetzten die hölzernen Pfähle durch Säulen "
    "aus Beton, verbreiterten den Fußweg für Lieferwagen und stellten entlang der ganzen Kaimauer "
    "neue Laternen auf. Besucher dürfen die südliche Treppe weiterhin benutzen.",
    "Fragen zu Liegegebühren, zur Winterlagerung oder zum Fahrplan der Lotsenboote richten Sie "
    "bitte schriftlich an das Büro. Zahlungen werden per Überweisung oder persönlich während der "
    "Öffnungszeiten angenommen; für jede Zahlung gibt es eine Quittung, die drei Jahre lang "
    "aufzubewahren ist.",
]
SPANISH = [
    "La oficina del puerto abre a las siete de la mañana, cuando llegan los primeros barcos de las "
    "islas. Los empleados anotan cada llegada en un libro junto a la ventana, y el capitán del "
    "puerto firma cada página antes del mediodía. Los pescadores llevan su captura al mercado de "
    "la plaza, donde esperan los compradores de los pueblos del interior.",
    "¿Cuándo terminarán las obras del muelle norte? Según los ingenieros, antes de las tormentas "
    "de otoño. Ya han sustituido los pilotes de madera por columnas de hormigón, ensanchado el "
    "paseo y colocado farolas nuevas a lo largo de todo el muelle. ¡Los visitantes también pueden "
    "usar la escalera del sur!",
    "Las preguntas sobre tarifas de amarre, almacenamiento en invierno o el horario de las lanchas "
    "del práctico deben enviarse por escrito a la oficina. Se aceptan pagos por transferencia "
    "bancaria o en persona durante el horario de atención, y cada recibo debe guardarse tres años.",
]
# Long words, so that many lines end in a word broken with a hyphen (hyphenate=True); "~" marks
# where a word may be broken, and is no part of the text.
NOTICE = [
    "Following extra~ordi~nary main~te~nance, the admin~is~tra~tion announces that "
    "re~frig~er~a~tion facil~i~ties beside the northern ware~houses will remain un~avail~able "
    "through~out November. Ship~owners requiring tem~po~rary ac~com~mo~da~tion for per~ish~able "
    "con~sign~ments should contact the harbour~master's rep~re~sen~ta~tives, who will arrange "
    "al~ter~na~tive storage at the mu~nic~i~pal depot.",
    "Cor~re~spon~dence concerning au~thor~i~sa~tions, in~sur~ance cer~tif~i~cates or "
    "en~vi~ron~men~tal doc~u~men~ta~tion must mention the vessel's reg~is~tra~tion number. "
    "In~com~plete ap~pli~ca~tions cannot be pro~cessed, and re~spon~si~bil~i~ties arising from "
    "un~au~tho~rised berthing remain with the owners not~with~stand~ing any verbal "
    "un~der~stand~ing with harbour per~son~nel.",
    "Elec~tric~ity and fresh~water con~nec~tions along the eastern quay have been mod~ern~ised. "
    "Con~sump~tion is measured in~di~vid~u~ally, invoiced monthly and payable within fourteen "
    "days; out~stand~ing balances ac~cu~mu~late interest at the stat~u~tory rate.",
]
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf"
BOLD = "/usr/share/fonts/truetype/dejavu/DejaVuSerif-Bold.ttf"


def hyphenated(p, width):
    """`p` in lines of at most `width` characters, greedily filled; a word that does not fit is
    broken with a hyphen at its last "~" that leaves the line within `width`."""
    lines, line = [], ""
    for word in p.split():
        plain = word.replace("~", "")
        if not line or len(line) + 1 + len(plain) <= width:
            line = f"{line} {plain}" if line else plain
            continue
        parts = word.split("~")
        cut = max((i for i in range(1, len(parts))
                   if len(line) + 1 + len("".join(parts[:i])) + 1 <= width), default=0)
        if cut:
            lines.append(f"{line} {''.join(parts[:cut])}-")
            line = "".join(parts[cut:])
        else:
            lines.append(line)
            line = plain
    return lines + [line]


def draw(paragraphs, dpi=300, columns=1, font_pt=11, title=None, hyphenate=False):
    """An A4 page at `dpi` with `paragraphs` set in `columns`, under `title` (bold, twice the size,
    across the page) when given; returns (image, text)."""
    w, h = int(8.27 * dpi), int(11.69 * dpi)
    img = Image.new("L", (w, h), 255)
    d = ImageDraw.Draw(img)
    font = ImageFont.truetype(FONT, int(font_pt * dpi / 72))
    margin, gutter = int(0.9 * dpi), int(0.35 * dpi)
    col_w = (w - 2 * margin - gutter * (columns - 1)) // columns
    char_w = d.textlength("abcdefghijklmnopqrstuvwxyz", font=font) / 26
    line_h = int(font.size * 1.35)
    top = margin
    if title:
        big = ImageFont.truetype(BOLD, int(2 * font_pt * dpi / 72))
        d.text((margin, top), title, font=big, fill=0)
        top += int(big.size * 1.35) + line_h
    per_col = (len(paragraphs) + columns - 1) // columns
    width = max(10, int(col_w / char_w))
    for c in range(columns):
        x, y = margin + c * (col_w + gutter), top
        for p in paragraphs[c * per_col:(c + 1) * per_col]:
            plain = p.replace("~", "")
            for line in hyphenated(p, width) if hyphenate else textwrap.wrap(plain, width=width):
                d.text((x, y), line, font=font, fill=0)
                y += line_h
            y += line_h // 2
    return img, "\n\n".join([title] * bool(title) + [p.replace("~", "") for p in paragraphs])


SCHEDULE = [
    ["Vessel", "Arrives", "Berth", "Cargo"],
    ["Northern Star", "07:15", "3", "Timber"],
    ["Island Queen", "08:40", "1", "Passengers"],
    ["Marie Louise", "10:05", "5", "Grain and flour"],
    ["Cormorant", "12:30", "2", "Fish"],
    ["Westward Ho", "14:50", "4", "Steel pipes"],
    ["Seven Sisters", "17:20", "1", "Passengers"],
]


def table_page(ruled, dpi=300, font_pt=11):
    """A paragraph, the SCHEDULE table (with ruled cell borders, or aligned columns without any
    rule), then another paragraph; returns (image, text, cells)."""
    w, h = int(8.27 * dpi), int(11.69 * dpi)
    img = Image.new("L", (w, h), 255)
    d = ImageDraw.Draw(img)
    font = ImageFont.truetype(FONT, int(font_pt * dpi / 72))
    bold = ImageFont.truetype(BOLD, int(font_pt * dpi / 72))
    margin = int(0.9 * dpi)
    char_w = d.textlength("abcdefghijklmnopqrstuvwxyz", font=font) / 26
    line_h = int(font.size * 1.35)
    width = int((w - 2 * margin) / char_w)
    before, after = ENGLISH[0], NOTICE[0].replace("~", "")
    y = margin
    for line in textwrap.wrap(before, width=width):
        d.text((margin, y), line, font=font, fill=0)
        y += line_h
    y += line_h
    pad = int(font.size * 0.6)
    widths = [max(d.textlength(row[c], font=bold) for row in SCHEDULE) + 2 * pad
              for c in range(len(SCHEDULE[0]))]
    if not ruled:
        widths = [cw + font.size * 2 for cw in widths]
    xs = [margin]
    for cw in widths:
        xs.append(xs[-1] + int(cw))
    row_h = line_h + (2 * pad if ruled else pad // 2)
    top = y
    for r, row in enumerate(SCHEDULE):
        for c, cell in enumerate(row):
            d.text((xs[c] + pad, y + (pad if ruled else 0)), cell, font=bold if r == 0 else font,
                   fill=0)
        y += row_h
    if ruled:
        stroke = max(2, dpi // 100)
        for r in range(len(SCHEDULE) + 1):
            d.line([(xs[0], top + r * row_h), (xs[-1], top + r * row_h)], fill=0, width=stroke)
        for x in xs:
            d.line([(x, top), (x, top + len(SCHEDULE) * row_h)], fill=0, width=stroke)
    y += line_h
    for line in textwrap.wrap(after, width=width):
        d.text((margin, y), line, font=font, fill=0)
        y += line_h
    text = "\n\n".join([before] + [" ".join(row) for row in SCHEDULE] + [after])
    return img, text, "\n".join("\t".join(row) for row in SCHEDULE) + "\n"


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
    # This script's text and Pillow's version name the pages: when the stamp says they are the
    # ones written last time and all are there, nothing is redrawn.
    with open(__file__, "rb") as f:
        version = hashlib.sha256(f.read() + PIL.__version__.encode()).hexdigest()
    stamp = os.path.join(out, ".pages")
    try:
        with open(stamp, encoding="utf-8") as f:
            head, *files = f.read().split()
        if head == version and all(os.path.exists(os.path.join(out, n)) for n in files):
            print(f"{sum(n.endswith('.txt') for n in files)} pages in {out} (up to date)")
            return
    except (OSError, ValueError):
        pass
    pages = {
        "clean-300dpi": (draw(ENGLISH), {}),
        "clean-150dpi": (draw(ENGLISH, dpi=150), {}),
        "noisy-blurred": (draw(ENGLISH), {"noise": 0.004, "blur": 1.2}),
        "skewed-2deg": (draw(ENGLISH), {"skew": 2.0}),
        "skewed-6deg": (draw(ENGLISH), {"skew": 6.0}),
        "turned-90": (draw(ENGLISH), {"turn": 90}),
        "turned-180": (draw(ENGLISH), {"turn": 180}),
        "turned-270": (draw(ENGLISH), {"turn": 270}),
        "two-columns": (draw(ENGLISH + ENGLISH[:1], columns=2), {}),
        "two-columns-title": (draw(ENGLISH + NOTICE[:1], columns=2, title="Harbour News"), {}),
        "heading-hyphenated": (draw(NOTICE, title="Notice to Harbour Users", hyphenate=True), {}),
        "french": (draw(FRENCH), {}),
        "german": (draw(GERMAN), {}),
        "spanish": (draw(SPANISH), {}),
        # Two pages in one TIFF; the truth is both, first page first.
        "two-pages": ([draw(ENGLISH), draw(NOTICE)], {}),
        "table-ruled": (table_page(ruled=True), {"noise": 0.001}),
        "table-aligned": (table_page(ruled=False), {"noise": 0.001, "skew": 1.0}),
    }
    files = []
    for name, (made, how) in pages.items():
        sheets = made if isinstance(made, list) else [made]
        images = [degrade(img, **how) for img, *_ in sheets]
        if len(images) == 1:
            files.append(name + ".png")
            images[0].save(os.path.join(out, files[-1]), dpi=(300, 300))
        else:
            files.append(name + ".tif")
            images[0].save(os.path.join(out, files[-1]), dpi=(300, 300), compression="tiff_deflate",
                           save_all=True, append_images=images[1:])
        if name == "clean-150dpi":
            files.append(name + ".jp2")
            images[0].convert("RGB").save(os.path.join(out, files[-1]), quality_mode="dB",
                                          quality_layers=[38])
        files.append(name + ".txt")
        with open(os.path.join(out, files[-1]), "w", encoding="utf-8") as f:
            f.write("\n\n".join(text for _, text, *_ in sheets))
        if len(sheets[0]) == 3:
            files.append(name + ".cells")
            with open(os.path.join(out, files[-1]), "w", encoding="utf-8") as f:
                f.write(sheets[0][2])
    with open(stamp, "w", encoding="utf-8") as f:
        f.write("\n".join([version] + files) + "\n")
    print(f"{len(pages)} pages in {out}")


if __name__ == "__main__":
    main()
