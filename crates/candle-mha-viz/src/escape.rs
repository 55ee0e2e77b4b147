//! Escaping text for the formats the analysis writes: XML (SVG pictures, GraphML), DOT and
//! CSV. Labels are arbitrary tokens (quotes, `<`, commas, newlines), so every writer goes
//! through these.

/// `s` inside a DOT double-quoted string.
pub(crate) fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .replace('\r', "")
}

/// `s` as XML character data or attribute value; characters XML 1.0 forbids become U+FFFD.
pub(crate) fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// `s` as one CSV field: RFC 4180 quoting when needed, and a field a spreadsheet would run as
/// a formula (starting with `=`, `+`, `-`, `@`, a tab or a carriage return) prefixed with `'`
/// and quoted, as OWASP recommends against CSV injection (`=HYPERLINK(…)` as a token).
pub(crate) fn csv_field(s: &str) -> String {
    let formula = s.starts_with(['=', '+', '-', '@', '\t', '\r']);
    let s = match formula {
        true => format!("'{s}"),
        false => s.to_string(),
    };
    if formula || s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::csv_field;

    #[test]
    fn csv_fields_are_quoted_and_formulas_defused() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(
            csv_field("=HYPERLINK(\"http://x\",\"y\")"),
            "\"'=HYPERLINK(\"\"http://x\"\",\"\"y\"\")\""
        );
        for f in ["+1", "-2", "@sum", "\tx"] {
            assert_eq!(csv_field(f), format!("\"'{f}\""));
        }
    }
}
