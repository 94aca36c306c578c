//! The languages OCR reads with: what a request may name, and, when it names none, the choice
//! made per page: English first, then the page's own language where its commonest words say it
//! is another one the engine has (one model with the accents costs a tenth more time; all seven
//! Western European models together 60% more, docs/benchmarks.md).

use super::OcrEngine;

/// The languages the engine reads with, `+`-joined model names (`eng+fra`), first the main one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Languages(String);

/// The most models one request may name.
const MAX_LANGUAGES: usize = 8;

impl Languages {
    /// The model names, main one first.
    pub fn parts(&self) -> impl Iterator<Item = &str> {
        self.0.split('+')
    }

    /// As the engine takes them (`eng+fra`).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first reading's languages when a request names none: English.
    pub(crate) fn first() -> Languages {
        Languages("eng".into())
    }
}

/// Words common in one language and rare in the others (none shared between two lists), by
/// the engine's model name.
const COMMON_WORDS: [(&str, &[&str]); 7] = [
    (
        "eng",
        &[
            "the", "and", "of", "to", "with", "that", "this", "from", "which", "was", "were",
            "have",
        ],
    ),
    (
        "fra",
        &[
            "les", "des", "et", "est", "une", "du", "dans", "pour", "sur", "au", "aux", "avec",
            "qui", "pas", "ce", "sont",
        ],
    ),
    (
        "deu",
        &[
            "der", "die", "das", "und", "ist", "nicht", "mit", "den", "dem", "ein", "eine", "zu",
            "von", "für", "auf", "auch", "sich",
        ],
    ),
    (
        "spa",
        &[
            "el", "los", "las", "del", "y", "por", "con", "para", "una", "más", "como", "está",
            "pero", "muy",
        ],
    ),
    (
        "ita",
        &[
            "il", "di", "che", "della", "per", "non", "sono", "gli", "nel", "alla", "anche",
            "delle", "questo",
        ],
    ),
    (
        "por",
        &[
            "os", "do", "da", "dos", "em", "não", "um", "uma", "ao", "na", "pela", "são", "também",
            "mais",
        ],
    ),
    (
        "nld",
        &[
            "het", "een", "van", "dat", "op", "te", "niet", "voor", "zijn", "ook", "bij", "worden",
            "wordt", "naar",
        ],
    ),
];

/// The languages to read a page again with, after a first reading in English, when its common
/// words say it is in another language the engine has (that one first, then English), or in
/// several (all those the engine has of [`COMMON_WORDS`], English first). `None`: English it is.
pub(crate) fn second_reading(engine: &OcrEngine, text: &str) -> Option<Languages> {
    let mut counts = [0usize; COMMON_WORDS.len()];
    for word in text
        .split(|c: char| !c.is_alphabetic())
        .filter(|w| !w.is_empty())
    {
        let word = word.to_lowercase();
        for (i, (_, words)) in COMMON_WORDS.iter().enumerate() {
            if words.contains(&word.as_str()) {
                counts[i] += 1;
            }
        }
    }
    let installed = |model: &str| engine.languages.iter().any(|l| l == model);
    let english = counts[0];
    let others: usize = counts[1..].iter().sum();
    let mut ranked: Vec<(usize, &str)> = counts[1..]
        .iter()
        .zip(&COMMON_WORDS[1..])
        .map(|(&n, (model, _))| (n, *model))
        .filter(|&(n, model)| n > 0 && installed(model))
        .collect();
    ranked.sort_by_key(|r| std::cmp::Reverse(r.0));
    let (best, model) = *ranked.first()?;
    let runner_up = ranked.get(1).map_or(0, |r| r.0);
    if best >= 4 && best > english * 2 && best >= runner_up * 2 {
        return Some(Languages(format!("{model}+eng")));
    }
    // Several languages on one page (or one that is not clearly any): every model there is.
    if others >= 3 && others * 2 >= english {
        let all: Vec<&str> = COMMON_WORDS
            .iter()
            .map(|(m, _)| *m)
            .filter(|m| installed(m))
            .collect();
        return Some(Languages(all.join("+")));
    }
    None
}

impl std::str::FromStr for Languages {
    type Err = String;
    /// Parses `eng`, `eng+fra`, `chi_sim`, `script/Latin`: up to eight model names of letters,
    /// digits, `_` and one `/`.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let bad =
            || format!("lang must be model names joined by '+' (such as \"eng+fra\"), not {s:?}");
        let parts: Vec<&str> = s.split('+').collect();
        if parts.len() > MAX_LANGUAGES {
            return Err(format!("lang names at most {MAX_LANGUAGES} models"));
        }
        for p in &parts {
            let ok = !p.is_empty()
                && p.len() <= 40
                && p.matches('/').count() <= 1
                && !p.starts_with('/')
                && !p.ends_with('/')
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '/');
            if !ok {
                return Err(bad());
            }
        }
        Ok(Languages(s.to_string()))
    }
}

impl std::fmt::Display for Languages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(languages: &[&str]) -> OcrEngine {
        OcrEngine {
            program: "tesseract".into(),
            version: "tesseract 5".into(),
            languages: languages.iter().map(|l| l.to_string()).collect(),
        }
    }

    #[test]
    fn a_page_in_one_language_is_read_again_in_it_and_english_is_not() {
        let all = engine(&["eng", "fra", "deu", "spa", "por", "ita", "nld"]);
        let french = "Le bureau du port ouvre a sept heures, quand les premiers bateaux des iles \
                      arrivent. Les employes notent chaque arrivee dans un registre pour le port.";
        assert_eq!(second_reading(&all, french).unwrap().as_str(), "fra+eng");
        let english = "The harbour office opens at seven in the morning, when the first ferries \
                       come in from the islands, and the clerks record every arrival.";
        assert_eq!(second_reading(&all, english), None);
        // Not installed: nothing to read it again with.
        assert_eq!(second_reading(&engine(&["eng"]), french), None);
    }

    #[test]
    fn a_page_of_several_languages_is_read_with_them_all() {
        let all = engine(&["eng", "fra", "deu", "spa", "ita"]);
        let mixed = "The quick brown fox jumps over the lazy dog. Der schnelle braune Fuchs \
                     springt uber den faulen Hund. La volpe marrone salta sopra il cane pigro. \
                     El zorro marron salta sobre el perro.";
        assert_eq!(
            second_reading(&all, mixed).unwrap().as_str(),
            "eng+fra+deu+spa+ita"
        );
    }

    #[test]
    fn requested_languages_are_checked_for_shape() {
        for ok in ["eng", "eng+fra", "chi_sim", "script/Latin"] {
            assert!(ok.parse::<Languages>().is_ok(), "{ok}");
        }
        for bad in ["", "eng+", "../eng", "eng fra", "/x", "a+b+c+d+e+f+g+h+i"] {
            assert!(bad.parse::<Languages>().is_err(), "{bad}");
        }
    }
}
