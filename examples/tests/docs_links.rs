//! Relative links in the Markdown documentation lead somewhere: README.md, CHANGELOG.md,
//! every crate's README.md and every `docs/**/*.md` are scanned for inline links
//! (`[text](path)`, `![alt](path)`, `[text](path#anchor)`) and reference definitions
//! (`[label]: path`). A link with a scheme (`https:`, `mailto:`, ...) is left alone; the
//! path of any other must exist in the repository (relative to the file, or to the root
//! when it starts with `/`, as on GitHub), and an `#anchor` into a Markdown file (the
//! same file when the path is empty) must be the slug GitHub gives one of its headings,
//! or an `id`/`name` of an HTML anchor in it. Code blocks and code spans are skipped.
//! The test fails listing every broken link with its file and line.
//!
//! Only std: the checker is below, with tests of its own that show it can fail.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Component, Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root above examples/")
        .to_path_buf()
}

/// README.md, CHANGELOG.md, the README.md of every directory at the root with a
/// Cargo.toml (the crates), and every .md under docs/, sorted.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = BTreeSet::new();
    for name in ["README.md", "CHANGELOG.md"] {
        let path = root.join(name);
        assert!(path.is_file(), "{} is missing", path.display());
        files.insert(path);
    }
    for entry in fs::read_dir(root).expect("read the workspace root") {
        let dir = entry.expect("a directory entry").path();
        if dir.join("Cargo.toml").is_file() && dir.join("README.md").is_file() {
            files.insert(dir.join("README.md"));
        }
    }
    fn walk(dir: &Path, files: &mut BTreeSet<PathBuf>) {
        for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, files);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.insert(path);
            }
        }
    }
    walk(&root.join("docs"), &mut files);
    files.into_iter().collect()
}

/// The lines of `text` with fenced code blocks (``` or ~~~) blanked out, so that the line
/// numbers stay those of the file.
fn without_code_blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence: Option<(char, usize)> = None;
    for line in text.lines() {
        let trimmed = line.trim_start_matches(' ');
        let indent = line.len() - trimmed.len();
        let run = |c: char| trimmed.chars().take_while(|&x| x == c).count();
        match fence {
            Some((c, n)) => {
                if indent <= 3 && run(c) >= n && trimmed[run(c)..].trim().is_empty() {
                    fence = None;
                }
                out.push(String::new());
            }
            None => {
                let opening = ['`', '~']
                    .into_iter()
                    .map(|c| (c, run(c)))
                    .find(|&(_, n)| n >= 3);
                match opening {
                    Some(open) if indent <= 3 => {
                        fence = Some(open);
                        out.push(String::new());
                    }
                    _ => out.push(line.to_string()),
                }
            }
        }
    }
    out
}

/// `text` with the content of every code span replaced by spaces (newlines kept).
fn without_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = chars.clone();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let n = chars[i..].iter().take_while(|&&c| c == '`').count();
        // The closing run: the same number of backticks, not part of a longer run.
        let mut j = i + n;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let m = chars[j..].iter().take_while(|&&c| c == '`').count();
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                for c in &mut out[i..j + n] {
                    if *c != '\n' {
                        *c = ' ';
                    }
                }
                i = j + n;
            }
            None => i += n,
        }
    }
    out.into_iter().collect()
}

/// A link's destination and the 1-based line it is on.
#[derive(Debug, PartialEq)]
struct Link {
    line: usize,
    dest: String,
}

/// The destinations of the inline links, images and reference definitions of a file.
fn links(text: &str) -> Vec<Link> {
    let lines = without_code_blocks(text);
    let mut found = Vec::new();
    // Reference definitions: `[label]: dest`, up to three spaces in.
    for (n, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start_matches(' ');
        if line.len() - trimmed.len() > 3 || !trimmed.starts_with('[') {
            continue;
        }
        if let Some(end) = trimmed.find("]:")
            && end > 1
            && !trimmed[1..end].contains(['[', ']'])
        {
            let dest = trimmed[end + 2..].split_whitespace().next().unwrap_or("");
            let dest = dest.trim_start_matches('<').trim_end_matches('>');
            found.push(Link {
                line: n + 1,
                dest: dest.to_string(),
            });
        }
    }
    let text = without_code_spans(&lines.join("\n"));
    let chars: Vec<char> = text.chars().collect();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '\n' {
            line += 1;
        }
        let is_link =
            chars[i] == ']' && chars.get(i + 1) == Some(&'(') && (i == 0 || chars[i - 1] != '\\');
        if !is_link {
            i += 1;
            continue;
        }
        let mut j = i + 2;
        let mut dest_line = line;
        while j < chars.len() && chars[j].is_whitespace() {
            if chars[j] == '\n' {
                dest_line += 1;
            }
            j += 1;
        }
        let mut dest = String::new();
        if chars.get(j) == Some(&'<') {
            j += 1;
            while j < chars.len() && chars[j] != '>' && chars[j] != '\n' {
                dest.push(chars[j]);
                j += 1;
            }
        } else {
            let mut depth = 0;
            while j < chars.len() && !chars[j].is_whitespace() {
                match chars[j] {
                    '(' => depth += 1,
                    ')' if depth == 0 => break,
                    ')' => depth -= 1,
                    _ => {}
                }
                dest.push(chars[j]);
                j += 1;
            }
        }
        found.push(Link {
            line: dest_line,
            dest,
        });
        i += 2;
    }
    found.sort_by_key(|l| l.line);
    found
}

/// GitHub's anchor for a heading's text: the rendered text (code, links and emphasis
/// markers gone) lowercased, every character but letters, digits, `_`, `-` and spaces
/// removed, and each space made a `-`.
fn slug(heading: &str) -> String {
    // Links and images: their text only.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(start) = rest.find('[') {
        let Some(mid) = rest[start..].find("](") else {
            break;
        };
        let Some(end) = rest[start + mid..].find(')') else {
            break;
        };
        text.push_str(rest[..start].trim_end_matches('!'));
        text.push_str(&rest[start + 1..start + mid]);
        rest = &rest[start + mid + end + 1..];
    }
    text.push_str(rest);
    // HTML tags go; what is inside them too.
    let mut plain = String::new();
    let mut in_tag = false;
    for c in text.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            _ if !in_tag => plain.push(c),
            _ => {}
        }
    }
    plain
        .trim()
        .to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || c == '_' || c == '-' || c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file: its headings' slugs (the second of a slug gets `-1`,
/// the third `-2`, ...) and the `id`/`name` of its HTML elements.
fn anchors(text: &str) -> BTreeSet<String> {
    let lines = without_code_blocks(text);
    let mut headings = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start_matches(' ');
        if line.len() - trimmed.len() > 3 {
            continue;
        }
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) {
            let rest = &trimmed[hashes..];
            if rest.is_empty() || rest.starts_with([' ', '\t']) {
                // A closing run of #s goes, when a space comes before it.
                let rest = rest.trim();
                let closed = rest.trim_end_matches('#');
                let rest = if closed.is_empty() || closed.ends_with([' ', '\t']) {
                    closed
                } else {
                    rest
                };
                headings.push(rest.trim().to_string());
            }
            continue;
        }
        // Setext: a paragraph line underlined with = or -.
        let next = lines.get(n + 1).map(|l| l.trim()).unwrap_or("");
        let underline =
            !next.is_empty() && (next.chars().all(|c| c == '=') || next.chars().all(|c| c == '-'));
        let previous_blank = n == 0 || lines[n - 1].trim().is_empty();
        if underline
            && !trimmed.trim().is_empty()
            && previous_blank
            && !trimmed.starts_with(['-', '*', '+', '>', '|'])
            && lines[n + 1].len() - lines[n + 1].trim_start_matches(' ').len() <= 3
        {
            headings.push(trimmed.trim().to_string());
        }
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut found = BTreeSet::new();
    for heading in headings {
        // Code spans keep their text, emphasis markers go (the slug is of the rendered text).
        let base = slug(&heading.replace(['*', '`'], "").replace("~~", ""));
        let count = seen.entry(base.clone()).or_insert(0);
        found.insert(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    for attr in ["id=\"", "name=\""] {
        for (at, _) in text.match_indices(attr) {
            let value = &text[at + attr.len()..];
            if let Some(end) = value.find('"') {
                found.insert(value[..end].to_string());
            }
        }
    }
    found
}

/// `%xx` escapes decoded (GitHub links to `a%20b.md` reach `a b.md`).
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` with `.` and `..` taken out lexically; None when it climbs above `root`.
fn normalized(root: &Path, path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out.starts_with(root).then_some(out)
}

/// Every broken relative link of the files, as `file:line: link: why`, the files named
/// relative to `root`.
fn broken_links(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut cache: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    let mut anchors_of = |path: &Path| -> BTreeSet<String> {
        cache
            .entry(path.to_path_buf())
            .or_insert_with(|| anchors(&fs::read_to_string(path).unwrap_or_default()))
            .clone()
    };
    let mut broken = Vec::new();
    for file in files {
        let text =
            fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let shown = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        for Link { line, dest } in links(&text) {
            let mut report = |why: String| broken.push(format!("{shown}:{line}: ({dest}): {why}"));
            if dest.is_empty() {
                report("an empty link".to_string());
                continue;
            }
            // A scheme (https:, mailto:, ...): not a relative link.
            let scheme = dest.split_once(':').is_some_and(|(s, _)| {
                !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                    && s.starts_with(|c: char| c.is_ascii_alphabetic())
            });
            if scheme || dest.starts_with("//") {
                continue;
            }
            let (path, anchor) = match dest.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (dest.as_str(), None),
            };
            let path = percent_decoded(path.split('?').next().unwrap_or(""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                let joined = match path.strip_prefix('/') {
                    Some(from_root) => root.join(from_root),
                    None => file.parent().expect("a file's directory").join(&path),
                };
                match normalized(root, &joined) {
                    Some(target) => target,
                    None => {
                        report("leads out of the repository".to_string());
                        continue;
                    }
                }
            };
            if !target.exists() {
                let missing = target.strip_prefix(root).unwrap_or(&target).display();
                report(format!("{missing} does not exist"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if !target
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("md"))
            {
                continue; // #L12 in a source file and the like: GitHub's, not checked
            }
            let anchor = percent_decoded(anchor);
            let known = anchors_of(&target);
            if !known.contains(&anchor) && !known.contains(&anchor.to_lowercase()) {
                let in_file = target.strip_prefix(root).unwrap_or(&target).display();
                report(format!("no heading of {in_file} has the anchor #{anchor}"));
            }
        }
    }
    broken
}

#[test]
fn relative_links_in_the_documentation_lead_somewhere() {
    let root = repo_root();
    let files = markdown_files(&root);
    let broken = broken_links(&root, &files);
    assert!(
        broken.is_empty(),
        "{} broken relative link(s) in the documentation:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

// The checker's own tests: it finds what is broken, and only that.

/// A fresh directory under the system's temporary one, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("dlm-docs-links-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("docs/guide")).expect("create a scratch directory");
        Scratch(dir)
    }

    fn write(&self, path: &str, text: &str) -> PathBuf {
        let path = self.0.join(path);
        fs::write(&path, text).expect("write a scratch file");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_checker_reports_each_broken_link_with_its_line() {
    let dir = Scratch::new("broken");
    dir.write(
        "docs/guide/other.md",
        "# Other\n\n## A `code` heading!\n\nSetext\n------\n",
    );
    dir.write("docs/guide/image.svg", "<svg/>");
    let readme = dir.write(
        "README.md",
        "# Title\n\
         \n\
         ## Heading one\n\
         ## Heading one\n\
         [ok](docs/guide/other.md) [ok](docs/guide/other.md#a-code-heading)\n\
         [ok](#heading-one-1) [ok](/docs/guide/image.svg) ![ok](docs/guide/image.svg)\n\
         [ok](https://example.com/missing.md) [ok](mailto:a@b.c) [ok](docs/guide/other.md#setext)\n\
         [a link whose text\n\
         spans lines](docs/guide/missing.md)\n\
         ```\n\
         [in a code block](nowhere.md)\n\
         ```\n\
         `[in a code span](nowhere.md)` [bad anchor](#heading-two)\n\
         [bad](docs/guide/other.md#heading-one) [up](../../outside.md)\n\
         \n\
         [ref]: docs/nothing-here.md\n",
    );
    let broken = broken_links(&dir.0, &[readme]);
    assert_eq!(
        broken,
        [
            "README.md:9: (docs/guide/missing.md): docs/guide/missing.md does not exist",
            "README.md:13: (#heading-two): no heading of README.md has the anchor #heading-two",
            "README.md:14: (docs/guide/other.md#heading-one): no heading of \
             docs/guide/other.md has the anchor #heading-one",
            "README.md:14: (../../outside.md): leads out of the repository",
            "README.md:16: (docs/nothing-here.md): docs/nothing-here.md does not exist",
        ],
        "{broken:#?}"
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug("Sentinel's failover window"),
        "sentinels-failover-window"
    );
    assert_eq!(
        slug(
            "From `flock` / `etcdctl lock` to `dlm`"
                .replace('`', "")
                .as_str()
        ),
        "from-flock--etcdctl-lock-to-dlm"
    );
    assert_eq!(
        slug("Which deployment gives which guarantee?"),
        "which-deployment-gives-which-guarantee"
    );
    assert_eq!(
        slug("See [the guide](docs/guide.md) now"),
        "see-the-guide-now"
    );
    assert_eq!(slug("snake_case and 1.2.3"), "snake_case-and-123");
    let text = "# A\n## A\n```\n# not a heading\n```\n## A\n<a id=\"custom\"></a>\n";
    let found = anchors(text);
    assert_eq!(
        found,
        ["a", "a-1", "a-2", "custom"]
            .map(String::from)
            .into_iter()
            .collect()
    );
}
