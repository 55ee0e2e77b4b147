//! The tests' one XML reader, for what the crate writes (SVG heatmaps and charts, GraphML): a
//! tokenizer that checks well-formedness as it goes and unescapes attribute values and text.
//!
//! Checked: one root element and nothing but white space after it; every element closed, in
//! order; names made of XML name characters; attributes `name="value"` only; no raw `<` in an
//! attribute, no raw `>` in text, and `&` only as an entity. Skipped: the XML declaration
//! (before the root only) and comments.

use std::collections::HashMap;

/// A start tag: its name and its unescaped attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Element {
    pub name: String,
    pub attrs: HashMap<String, String>,
}

impl Element {
    /// The unescaped value of attribute `name`.
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs.get(name).map(String::as_str)
    }
}

/// One token of a document.
#[derive(Clone, Debug, PartialEq)]
pub enum Xml {
    /// A start tag (or an empty-element tag, which is followed by no `Close`).
    Open(Element),
    Close(String),
    /// A non-blank text run, unescaped.
    Text(String),
}

/// `&lt;` `&gt;` `&quot;` `&apos;` `&amp;` and numeric references replaced; panics on any
/// other `&`.
pub fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let end = rest[i..]
            .find(';')
            .unwrap_or_else(|| panic!("raw & in {s:?}"))
            + i;
        let entity = &rest[i + 1..end];
        let c = match entity {
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            "amp" => '&',
            _ => {
                let code = match entity.strip_prefix("#x") {
                    Some(hex) => u32::from_str_radix(hex, 16).ok(),
                    None => entity.strip_prefix('#').and_then(|d| d.parse().ok()),
                };
                code.and_then(char::from_u32)
                    .unwrap_or_else(|| panic!("unknown entity &{entity}; in {s:?}"))
            }
        };
        out.push(c);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

fn check_name(name: &str, tag: &str) {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    assert!(
        first_ok && chars.all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c)),
        "bad name {name:?} in <{tag}>"
    );
}

/// Reads `doc` into tokens, panicking with the reason on anything not well-formed.
pub fn read_xml(doc: &str) -> Vec<Xml> {
    let mut out = Vec::new();
    let mut stack: Vec<String> = Vec::new();
    let mut root_seen = false;
    let mut rest = doc;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("<?") {
            assert!(!root_seen, "<?…?> after the root");
            let end = after.find("?>").expect("unterminated <?");
            rest = &after[end + 2..];
        } else if let Some(after) = rest.strip_prefix("<!--") {
            let end = after.find("-->").expect("unterminated <!--");
            rest = &after[end + 3..];
        } else if let Some(after) = rest.strip_prefix("</") {
            let end = after.find('>').expect("unterminated </");
            let name = after[..end].trim().to_string();
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.as_str()),
                "mismatched </{name}>"
            );
            out.push(Xml::Close(name));
            rest = &after[end + 1..];
        } else if let Some(after) = rest.strip_prefix('<') {
            // Attribute values hold no raw '>' in what the crate writes (it is escaped), so the
            // tag ends at the first '>'.
            let end = after.find('>').expect("unterminated <");
            let tag = &after[..end];
            let (body, empty) = match tag.strip_suffix('/') {
                Some(body) => (body, true),
                None => (tag, false),
            };
            let (name, mut attrs_src) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
            check_name(name, tag);
            let mut attrs = HashMap::new();
            loop {
                attrs_src = attrs_src.trim_start();
                if attrs_src.is_empty() {
                    break;
                }
                let (k, v) = attrs_src
                    .split_once("=\"")
                    .unwrap_or_else(|| panic!("attribute not name=\"value\" in <{tag}>"));
                let k = k.trim();
                check_name(k, tag);
                let close = v.find('"').expect("unterminated attribute");
                assert!(!v[..close].contains('<'), "raw < in attribute of <{tag}>");
                let value = unescape(&v[..close]);
                assert!(
                    attrs.insert(k.to_string(), value).is_none(),
                    "repeated attribute {k} in <{tag}>"
                );
                attrs_src = &v[close + 1..];
            }
            if stack.is_empty() {
                assert!(!root_seen, "a second root element <{name}>");
                root_seen = true;
            }
            if !empty {
                stack.push(name.to_string());
            }
            out.push(Xml::Open(Element {
                name: name.to_string(),
                attrs,
            }));
            rest = &after[end + 1..];
        } else {
            let end = rest.find('<').unwrap_or(rest.len());
            let text = &rest[..end];
            assert!(!text.contains('>'), "raw > in text {text:?}");
            if stack.is_empty() {
                assert!(text.trim().is_empty(), "text outside the root: {text:?}");
            } else if !text.trim().is_empty() {
                out.push(Xml::Text(unescape(text)));
            }
            rest = &rest[end..];
        }
    }
    assert!(stack.is_empty(), "unclosed elements {stack:?}");
    assert!(root_seen, "no root element");
    out
}

/// The start tags of `doc` in document order (after checking it as [`read_xml`] does).
pub fn elements(doc: &str) -> Vec<Element> {
    read_xml(doc)
        .into_iter()
        .filter_map(|t| match t {
            Xml::Open(e) => Some(e),
            _ => None,
        })
        .collect()
}

/// The start tags named `name` whose `class` attribute is `class`.
pub fn with_class<'a>(elements: &'a [Element], name: &str, class: &str) -> Vec<&'a Element> {
    elements
        .iter()
        .filter(|e| e.name == name && e.attr("class") == Some(class))
        .collect()
}
