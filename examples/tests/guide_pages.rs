//! Every page of the guide is compiled as doc-tests: each `docs/guide/*.md` is listed in
//! `dlm_examples::GUIDE_PAGES` (and included in `dlm_examples::guide`), and every listed
//! page exists.

use std::path::Path;

#[test]
fn guide_pages_are_all_compiled() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/guide");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = dlm_examples::GUIDE_PAGES
        .iter()
        .map(|s| s.to_string())
        .collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "docs/guide/*.md and dlm_examples::GUIDE_PAGES differ: add the page to both the list \
         and the `guide` module in examples/src/lib.rs, so that its Rust blocks are compiled"
    );
}
