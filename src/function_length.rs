//! The house rule that a function fits in a reader's head, enforced: every `fn` under `src/`
//! (free, in an `impl` or a trait, test functions included: a test is read as often as the
//! code it checks) whose body runs over [`MAX_BODY_LINES`] fails the test, named with its file,
//! line and length.
//!
//! The scanner blanks comments, strings and character literals first (keeping line breaks,
//! so offsets still give line numbers), then matches braces: what is left of the code has
//! only real braces in it.

use std::path::Path;

use crate::layering::{rust_files, src_dir};

/// The most lines a function's body may have, its braces' lines included.
const MAX_BODY_LINES: usize = 100;

/// One function found in a file.
#[derive(Debug, PartialEq)]
struct Function {
    name: String,
    /// The line of its `fn` keyword (1-based).
    line: usize,
    /// The lines from its opening brace to its closing brace, both included.
    body_lines: usize,
}

/// `text` with comments, strings and character literals replaced by spaces (line breaks
/// kept), so the braces left are the code's own. Lifetimes and labels are kept as they are.
fn blank_non_code(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let end = match chars[i] {
            '/' if chars.get(i + 1) == Some(&'/') => line_comment_end(&chars, i),
            '/' if chars.get(i + 1) == Some(&'*') => block_comment_end(&chars, i),
            '"' => string_end(&chars, i + 1),
            'r' if starts_token(&chars, i) => raw_string_end(&chars, i + 1),
            'b' if starts_token(&chars, i) && chars.get(i + 1) == Some(&'r') => {
                raw_string_end(&chars, i + 2)
            }
            '\'' => char_literal_end(&chars, i),
            _ => None,
        };
        match end {
            Some(end) => {
                for &c in &chars[i..end] {
                    out.push(if c == '\n' { '\n' } else { ' ' });
                }
                i = end;
            }
            None => {
                out.push(chars[i]);
                i += 1;
            }
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether `chars[at]` begins a token (nothing of an identifier just before it).
fn starts_token(chars: &[char], at: usize) -> bool {
    at == 0 || !is_ident(chars[at - 1])
}

/// Where the `//` comment at `start` ends: at its line break, which stays code.
fn line_comment_end(chars: &[char], start: usize) -> Option<usize> {
    let len = chars[start..].iter().position(|&c| c == '\n');
    Some(len.map_or(chars.len(), |n| start + n))
}

/// Where the `/* … */` comment at `start` ends; they nest.
fn block_comment_end(chars: &[char], start: usize) -> Option<usize> {
    let (mut depth, mut i) = (0, start);
    while i < chars.len() {
        match (chars[i], chars.get(i + 1)) {
            ('/', Some('*')) => (depth, i) = (depth + 1, i + 2),
            ('*', Some('/')) if depth == 1 => return Some(i + 2),
            ('*', Some('/')) => (depth, i) = (depth - 1, i + 2),
            _ => i += 1,
        }
    }
    Some(chars.len())
}

/// Where the string whose contents begin at `from` ends (after its closing quote).
fn string_end(chars: &[char], from: usize) -> Option<usize> {
    let mut i = from;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    Some(chars.len())
}

/// Where the raw string whose `#`s or quote begin at `from` ends; `None` when what follows
/// the `r` is no raw string (an identifier, or a raw identifier such as `r#type`).
fn raw_string_end(chars: &[char], from: usize) -> Option<usize> {
    let hashes = chars[from..].iter().take_while(|&&c| c == '#').count();
    if chars.get(from + hashes) != Some(&'"') {
        return None;
    }
    let mut i = from + hashes + 1;
    while i < chars.len() {
        let hashes_after = || chars[i + 1..].iter().take_while(|&&c| c == '#').count();
        if chars[i] == '"' && hashes_after() >= hashes {
            return Some(i + 1 + hashes);
        }
        i += 1;
    }
    Some(chars.len())
}

/// Where the character literal at `start` ends; `None` for a lifetime or a label (`'a`).
fn char_literal_end(chars: &[char], start: usize) -> Option<usize> {
    match chars.get(start + 1) {
        Some('\\') => {
            // The escaped character is skipped: `'\''` closes at its last quote.
            let close = chars.get(start + 3..)?.iter().position(|&c| c == '\'')?;
            Some(start + 3 + close + 1)
        }
        Some(_) if chars.get(start + 2) == Some(&'\'') => Some(start + 3),
        _ => None,
    }
}

/// Every function with a body in `code` (already blanked), in order of appearance.
fn functions(code: &str) -> Vec<Function> {
    let chars: Vec<char> = code.chars().collect();
    let line_at = line_starts(&chars);
    let mut found = Vec::new();
    let mut i = 0;
    while i + 2 <= chars.len() {
        let is_fn_keyword = chars[i] == 'f'
            && chars[i + 1] == 'n'
            && starts_token(&chars, i)
            && chars.get(i + 2).is_some_and(|c| c.is_whitespace());
        if is_fn_keyword {
            if let Some(function) = function_at(&chars, i, &line_at) {
                found.push(function);
            }
        }
        i += 1;
    }
    found
}

/// For each char, its line (1-based).
fn line_starts(chars: &[char]) -> Vec<usize> {
    let mut line = 1;
    chars
        .iter()
        .map(|&c| {
            let this = line;
            if c == '\n' {
                line += 1;
            }
            this
        })
        .collect()
}

/// The function whose `fn` keyword is at `at`; `None` for a declaration without a body
/// (`fn f();` in a trait or an `extern` block) or a `fn` that names no function.
fn function_at(chars: &[char], at: usize, line_at: &[usize]) -> Option<Function> {
    let mut i = at + 2;
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    let name_start = i;
    if chars.get(i) == Some(&'r') && chars.get(i + 1) == Some(&'#') {
        i += 2; // a raw identifier
    }
    while chars.get(i).is_some_and(|&c| is_ident(c)) {
        i += 1;
    }
    if !chars[name_start..i].iter().any(|&c| is_ident(c)) {
        return None;
    }
    let name: String = chars[name_start..i].iter().collect();
    let open = body_open(chars, i)?;
    let close = matching_close(chars, open)?;
    Some(Function {
        name,
        line: line_at[at],
        body_lines: line_at[close] - line_at[open] + 1,
    })
}

/// The opening brace of the body of the signature that continues at `from`: the first `{`
/// outside brackets and parentheses. A `;` there first means no body.
fn body_open(chars: &[char], from: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, &c) in chars.iter().enumerate().skip(from) {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            '{' if depth == 0 => return Some(i),
            ';' if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

/// The brace that closes the one at `open`.
fn matching_close(chars: &[char], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, &c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Every function under `src/` with a body over [`MAX_BODY_LINES`], with its file (relative
/// to the crate), in file order.
fn long_functions() -> Vec<(String, Function)> {
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    files.sort();
    let crate_dir = src_dir().parent().expect("src has a parent").to_owned();
    let mut long = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable source");
        let rel = relative(&file, &crate_dir);
        for f in functions(&blank_non_code(&text)) {
            if f.body_lines > MAX_BODY_LINES {
                long.push((rel.clone(), f));
            }
        }
    }
    long
}

fn relative(file: &Path, crate_dir: &Path) -> String {
    let rel = file.strip_prefix(crate_dir).expect("under the crate");
    rel.to_string_lossy().replace('\\', "/")
}

#[test]
fn no_function_is_over_a_hundred_lines() {
    let found: Vec<String> = long_functions()
        .into_iter()
        .map(|(file, f)| {
            format!(
                "{file}:{}: fn {} has {} lines",
                f.line, f.name, f.body_lines
            )
        })
        .collect();
    assert!(
        found.is_empty(),
        "functions whose body is over {MAX_BODY_LINES} lines (src/function_length.rs): split \
         them into named steps\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scanner_sees_through_strings_chars_lifetimes_and_comments() {
    let code = r####"
fn short<'a>(x: &'a str) -> [u8; 2] {
    let _ = '{'; let _ = '\''; let _ = b'}'; let _ = '\u{7d}';
    let _ = "}\"{"; let _ = r#"}"{"#; let _ = br##"}"#{"##;
    // a } in a comment
    /* nested /* } */ { */
    'outer: loop { break 'outer; }
    [1, 2]
}
trait T { fn declared(&self) -> u8; fn provided(&self) {} }
fn takes(f: fn(u8) -> u8) -> u8 where u8: Copy { f(1) }
fn r#type() {}
"####;
    let found = functions(&blank_non_code(code));
    let named: Vec<(&str, usize, usize)> = found
        .iter()
        .map(|f| (f.name.as_str(), f.line, f.body_lines))
        .collect();
    assert_eq!(
        named,
        vec![
            ("short", 2, 8),
            ("provided", 10, 1),
            ("takes", 11, 1),
            ("r#type", 12, 1),
        ]
    );
}
