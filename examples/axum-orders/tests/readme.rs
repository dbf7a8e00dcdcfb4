//! The README's Rust is this example's code, so it compiles and runs: `src/orders.rs` is the quick start's
//! first block verbatim, and every other ```rust block of the README is a part of the example's sources
//! (```rust,ignore marks a fragment shown for its shape, such as a struct out of context).

const README: &str = include_str!("../../../README.md");
const SOURCES: [(&str, &str); 3] = [
    ("src/orders.rs", include_str!("../src/orders.rs")),
    ("src/lib.rs", include_str!("../src/lib.rs")),
    ("src/main.rs", include_str!("../src/main.rs")),
];

/// Every fenced block of the README: its info string and its text.
fn blocks(markdown: &str) -> Vec<(&str, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(&str, String)> = None;
    for line in markdown.lines() {
        match (line.strip_prefix("```"), open.take()) {
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
    assert!(open.is_none(), "README.md has an unclosed ``` block");
    blocks
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
        assert!(
            SOURCES.iter().any(|(_, source)| source.contains(block.as_str())),
            "this ```rust block of README.md is in none of {:?}; keep it a verbatim part of the example:\n{block}",
            SOURCES.map(|(path, _)| path)
        );
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
