//! The speculative-decoding benchmark's tasks: work a team gives a box like this, grounded in an
//! input (a document to summarise or extract from, code to change, a retrieved passage to answer
//! from, JSON to pull out of a text) and open chat that no input grounds. Every text here was
//! written for this benchmark.

/// (name, grounded in its input).
pub const TASKS: [(&str, bool); 6] = [
    ("summarise", true),
    ("extract", true),
    ("code-edit", true),
    ("rag-answer", true),
    ("json", true),
    ("open-chat", false),
];

const REPORT: &str = "Quarterly report of the Northfield water cooperative. In the third quarter \
the cooperative delivered 41,200 cubic metres of water to 1,930 households, four percent more \
than in the second quarter. The new pumping station at Alder Creek started work on the 2nd of \
August and now supplies the eastern villages on its own. Two pipe bursts, on the 14th of July in \
Millbrook and on the 9th of September in Harlow, were repaired within six hours each. The board \
approved a price of 1.85 per cubic metre for next year, unchanged from this year, and agreed to \
replace the old meters in Harlow before the end of March. Customer complaints fell from 37 to \
22, most of them about billing dates. The cooperative thanks the volunteers of Millbrook for \
their help during the July repair.";

const SUMMARISE: &str = "Summarise the following report in a few sentences, keeping its \
figures and place names exactly as written.\n\nReport:\n";

const EXTRACT: &str = "From the report below, list every date and every place it mentions, one \
per line, each followed by the sentence of the report it comes from, quoted exactly.\n\nReport:\n";

const CODE: &str = "def parse_line(line):\n    fields = line.strip().split(\",\")\n    if \
len(fields) != 4:\n        raise ValueError(\"expected 4 fields, got %d\" % len(fields))\n    \
name, city, age, score = fields\n    return {\"name\": name, \"city\": city, \"age\": int(age), \
\"score\": float(score)}\n\n\ndef load(path):\n    rows = []\n    with open(path) as f:\n        \
for number, line in enumerate(f, start=1):\n            if not line.strip():\n                \
continue\n            try:\n                rows.append(parse_line(line))\n            except \
ValueError as e:\n                print(\"line %d: %s\" % (number, e))\n    return rows\n\n\ndef \
average_score(rows):\n    if not rows:\n        return 0.0\n    return sum(r[\"score\"] for r in \
rows) / len(rows)\n";

const CODE_EDIT: &str = "Rewrite the following Python code so that the function parse_line is \
called parse_record everywhere. Output the whole code and nothing else.\n\n";

const PASSAGE: &str = "Passage (from the cooperative's handbook): Members who move house must \
tell the office at least ten days before the move, in writing or through the members' page. The \
office then reads the meter on the last day at the old address and opens an account at the new \
one. A member who leaves the area may ask for their share of 120 to be paid back; the board \
decides such requests at its next monthly meeting and pays within thirty days of the decision. \
Members who fall behind with payments receive a reminder after fifteen days and a second \
reminder after thirty; the supply is never cut off during the winter months from November to \
February.";

const RAG_ANSWER: &str = "Answer the question using only the passage, and quote the sentences \
of the passage that support your answer.\n\n";

const JSON: &str = "Extract the people and organisations in the text below as JSON: a list of \
objects with the fields \"name\", \"kind\" and \"sentence\", where sentence is the sentence of \
the text that mentions them, copied exactly.\n\nText: Maria Keller, the chair of the Northfield \
water cooperative, met Tomas Brandt of the regional water authority on Tuesday. Keller asked the \
authority to fund the new meters in Harlow. Brandt said the authority would decide in January. \
The Millbrook volunteers, led by Ana Duarte, were thanked for their help in July.";

const OPEN_CHAT: &str = "I am planning a weekend hike with two friends in late autumn. What \
should we think about, and what should we pack?";

/// The task's full prompt: its instruction and the input it is grounded in.
pub fn prompt(task: &str) -> String {
    match task {
        "summarise" => format!("{SUMMARISE}{REPORT}"),
        "extract" => format!("{EXTRACT}{REPORT}"),
        "code-edit" => format!("{CODE_EDIT}{CODE}"),
        "rag-answer" => format!(
            "{RAG_ANSWER}{PASSAGE}\n\nQuestion: What happens when a member who has fallen \
             behind with payments does not pay, and can the water be cut off in December?"
        ),
        "json" => JSON.to_string(),
        _ => OPEN_CHAT.to_string(),
    }
}
