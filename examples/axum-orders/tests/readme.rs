//! The README's and the guide's Rust is this example's code, so it compiles and runs: `src/orders.rs` is the
//! quick start's first block verbatim, and every other ```rust block of the README and of `docs/*.md` is a
//! part of the example's sources (```rust,ignore marks a fragment shown for its shape, such as a struct out
//! of context). Every block says what it is, and every relative link (and `#anchor`) leads somewhere.

use std::path::{Path, PathBuf};

const README: &str = include_str!("../../../README.md");
const SOURCES: [(&str, &str); 3] = [
    ("src/orders.rs", include_str!("../src/orders.rs")),
    ("src/lib.rs", include_str!("../src/lib.rs")),
    ("src/main.rs", include_str!("../src/main.rs")),
];

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The guide's pages, `docs/*.md`, read when the test runs (so a new page is checked without a rebuild).
fn guide() -> Vec<(String, String)> {
    let mut pages: Vec<(String, String)> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("a readable docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| {
            let name = format!("docs/{}", path.file_name().expect("a file").to_string_lossy());
            (name, std::fs::read_to_string(&path).expect("a readable page"))
        })
        .collect();
    pages.sort();
    assert!(pages.len() >= 2, "docs/ should hold the guide's pages");
    pages
}

/// Every fenced block of a markdown text: its info string and its text.
fn blocks(markdown: &str) -> Vec<(&str, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(&str, String)> = None;
    for line in markdown.lines() {
        // A block may be indented (inside a list item); its lines are compared without the indent.
        let bare = line.trim_start();
        match (bare.strip_prefix("```"), open.take()) {
            (Some(info), None) => open = Some((info.trim(), String::new())),
            (Some(_), Some(block)) => blocks.push(block),
            (None, Some((info, mut text))) => {
                text.push_str(line);
                text.push('\n');
                open = Some((info, text));
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed ``` block");
    blocks
}

/// Panics unless `block` is a verbatim part of one of the example's sources.
fn assert_in_sources(page: &str, block: &str) {
    assert!(
        SOURCES.iter().any(|(_, source)| source.contains(block)),
        "this ```rust block of {page} is in none of {:?}; keep it a verbatim part of the example (or mark a \
         fragment shown for its shape ```rust,ignore):\n{block}",
        SOURCES.map(|(path, _)| path)
    );
}

#[test]
fn the_quick_start_is_src_orders_rs_verbatim() {
    let rust: Vec<String> =
        blocks(README).into_iter().filter(|(info, _)| *info == "rust").map(|(_, text)| text).collect();
    assert!(rust.len() >= 2, "README.md should show the quick start in ```rust blocks");
    assert_eq!(
        rust[0], SOURCES[0].1,
        "README.md's first ```rust block differs from src/orders.rs; copy one to the other"
    );
    for block in &rust[1..] {
        assert_in_sources("README.md", block);
    }
}

#[test]
fn every_rust_block_of_the_guide_is_part_of_the_example() {
    for (page, text) in guide() {
        for (_, block) in blocks(&text).into_iter().filter(|(info, _)| *info == "rust") {
            assert_in_sources(&page, &block);
        }
    }
}

#[test]
fn every_readme_block_says_what_it_is() {
    for (info, text) in blocks(README) {
        assert!(
            ["rust", "rust,ignore", "sh", "toml", "text"].contains(&info),
            "a README.md block is marked {info:?}, not rust, rust,ignore, sh, toml or text (only rust is checked):\n{text}"
        );
    }
}

#[test]
fn every_guide_block_says_what_it_is() {
    for (page, markdown) in guide() {
        for (info, text) in blocks(&markdown) {
            assert!(
                ["rust", "rust,ignore", "sh", "toml", "text", "sql"].contains(&info),
                "a {page} block is marked {info:?}, not rust, rust,ignore, sh, toml, text or sql:\n{text}"
            );
        }
    }
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown text's headings (outside fenced blocks).
fn anchors(markdown: &str) -> Vec<String> {
    let mut fenced = false;
    let mut found = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            found.push(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

/// The targets of a markdown text's `[text](target)` links.
fn links(markdown: &str) -> Vec<&str> {
    markdown.split("](").skip(1).filter_map(|rest| rest.split_once(')').map(|(target, _)| target)).collect()
}

#[test]
fn every_relative_link_leads_somewhere() {
    let mut pages = vec![("README.md".to_owned(), README.to_owned())];
    pages.extend(guide());
    for (page, markdown) in &pages {
        let dir = root().join(page).parent().unwrap().to_path_buf();
        for target in links(markdown) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
            let file = if path.is_empty() { root().join(page) } else { dir.join(path) };
            assert!(file.exists(), "{page} links to {target}, which does not exist");
            if !fragment.is_empty() {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                assert!(
                    anchors(&text).iter().any(|a| a == fragment),
                    "{page} links to {target}, but that page has no heading with the anchor #{fragment}"
                );
            }
        }
    }
}
