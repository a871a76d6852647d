//! Slugs: URL- and DNS-friendly names derived from display names.
//!
//! A slug is a DNS label: 1–63 characters of `[a-z0-9-]`, starting and
//! ending with a letter or digit, with no `--` runs produced by the
//! conversion. Latin letters with diacritics are transliterated when it is
//! trivial (`ü` → `u`, `ß` → `ss`); other letters (CJK, Cyrillic, …) are
//! dropped rather than guessed at; every other run of characters becomes
//! one `-`.

/// Longest slug, in characters (a DNS label).
pub const MAX_SLUG_LEN: usize = 63;

/// The slug for `name`, or `None` when nothing usable is left.
pub fn slugify(name: &str) -> Option<String> {
    let mut out = String::with_capacity(name.len().min(MAX_SLUG_LEN + 8));
    let mut pending_dash = false;
    for c in name.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() {
            let mut buf = [0u8; 4];
            push_piece(&mut out, &mut pending_dash, c.encode_utf8(&mut buf));
        } else if let Some(ascii) = transliterate(c) {
            push_piece(&mut out, &mut pending_dash, ascii);
        } else if is_combining_mark(c) || c.is_alphanumeric() {
            // Accents of decomposed text belong to the letter before them;
            // letters and digits we cannot transliterate are dropped rather
            // than turned into separators.
        } else {
            pending_dash = true;
        }
        if out.len() > MAX_SLUG_LEN {
            break;
        }
    }
    out.truncate(MAX_SLUG_LEN);
    let trimmed = out.trim_end_matches('-');
    (!trimmed.is_empty()).then(|| trimmed.to_owned())
}

/// Appends `piece`, preceded by one `-` if a separator run came before it
/// and something was already written (so the slug never starts with `-`).
fn push_piece(out: &mut String, pending_dash: &mut bool, piece: &str) {
    if *pending_dash && !out.is_empty() {
        out.push('-');
    }
    *pending_dash = false;
    out.push_str(piece);
}

/// Combining diacritical marks (U+0300–U+036F), as in decomposed `e\u{301}`.
fn is_combining_mark(c: char) -> bool {
    ('\u{300}'..='\u{36f}').contains(&c)
}

/// ASCII for a lowercase Latin letter with a diacritic, when obvious.
fn transliterate(c: char) -> Option<&'static str> {
    Some(match c {
        'à' | 'á' | 'â' | 'ã' | 'ä' | 'å' | 'ā' | 'ă' | 'ą' => "a",
        'æ' => "ae",
        'ç' | 'ć' | 'ĉ' | 'ċ' | 'č' => "c",
        'ð' | 'ď' | 'đ' => "d",
        'è' | 'é' | 'ê' | 'ë' | 'ē' | 'ĕ' | 'ė' | 'ę' | 'ě' => "e",
        'ĝ' | 'ğ' | 'ġ' | 'ģ' => "g",
        'ĥ' | 'ħ' => "h",
        'ì' | 'í' | 'î' | 'ï' | 'ĩ' | 'ī' | 'ĭ' | 'į' | 'ı' => "i",
        'ĵ' => "j",
        'ķ' => "k",
        'ĺ' | 'ļ' | 'ľ' | 'ŀ' | 'ł' => "l",
        'ñ' | 'ń' | 'ņ' | 'ň' => "n",
        'ò' | 'ó' | 'ô' | 'õ' | 'ö' | 'ø' | 'ō' | 'ŏ' | 'ő' => "o",
        'œ' => "oe",
        'ŕ' | 'ŗ' | 'ř' => "r",
        'ś' | 'ŝ' | 'ş' | 'š' | 'ș' => "s",
        'ß' => "ss",
        'ţ' | 'ť' | 'ŧ' | 'ț' => "t",
        'þ' => "th",
        'ù' | 'ú' | 'û' | 'ü' | 'ũ' | 'ū' | 'ŭ' | 'ů' | 'ű' | 'ų' => "u",
        'ŵ' => "w",
        'ý' | 'ÿ' | 'ŷ' => "y",
        'ź' | 'ż' | 'ž' => "z",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples() {
        let cases = [
            ("Frankfurt 1 (Main)", Some("frankfurt-1-main")),
            ("  --  ", None),
            ("", None),
            ("eu-west-1", Some("eu-west-1")),
            ("EU_West__1", Some("eu-west-1")),
            ("--a--b--", Some("a-b")),
            ("Zürich Straße", Some("zurich-strasse")),
            ("São Paulo", Some("sao-paulo")),
            ("İstanbul", Some("istanbul")),
            ("Cafe\u{301} Noir", Some("cafe-noir")),
            ("Łódź", Some("lodz")),
            ("東京 DC 2", Some("dc-2")),
            ("東京", None),
            ("a東b", Some("ab")),
            ("rack🚀7", Some("rack-7")),
        ];
        for (name, want) in cases {
            assert_eq!(slugify(name).as_deref(), want, "{name:?}");
        }
    }

    #[test]
    fn long_names_are_truncated_and_retrimmed() {
        let long = "a".repeat(200);
        assert_eq!(slugify(&long).unwrap(), "a".repeat(63));

        // A separator landing on position 63 is trimmed after truncation.
        let name = format!("{} {}", "b".repeat(63), "c".repeat(100));
        assert_eq!(slugify(&name).unwrap(), "b".repeat(63));
        let name = format!("{} {}", "b".repeat(62), "c".repeat(100));
        assert_eq!(slugify(&name).unwrap(), "b".repeat(62));

        let words = "Word ".repeat(40);
        let slug = slugify(&words).unwrap();
        assert!(slug.len() <= MAX_SLUG_LEN);
        assert!(!slug.ends_with('-'));
    }

    #[test]
    fn slugs_are_dns_labels() {
        for name in ["Frankfurt 1 (Main)", "x", "ÄÖÜ äöü", &"Ab-".repeat(50)] {
            let slug = slugify(name).unwrap();
            let mut v = crate::Violations::new();
            crate::validate::dns_label(&mut v, "slug", &slug);
            assert!(v.is_empty(), "{name:?} -> {slug:?}: {v}");
        }
    }
}
