//! Errors about a store URL, and the secrets kept out of them: an error
//! quotes the URL with every password, token and nkey hidden — wherever a
//! mistyped URL puts them — and shows a URL that works.

use std::fmt;

use crate::store::StoreError;

pub(super) fn bad(url: &str, problem: impl fmt::Display, example: &str) -> StoreError {
    // The problem may quote a piece of the URL (an option's name): what
    // `redact` hides is hidden there too.
    // (piece by piece: the parser may have cut the secret anywhere).
    let mut problem = problem.to_string();
    for (from, to) in secret_ranges(url) {
        for piece in url[from..to].split([':', '@', '?', '/', '&', '=', ',']) {
            if piece.len() >= 3 {
                problem = problem.replace(piece, "***");
            }
        }
    }
    StoreError::config(format!(
        "store URL {:?}: {problem}; for example {example:?}",
        redact(url)
    ))
}

/// Whether `s` is a URL scheme: a letter, then letters, digits, `+ - .`.
pub(super) fn is_scheme(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// Query options whose values are secrets.
const SECRET_OPTIONS: [&str; 3] = ["password", "token", "nkey"];

/// Hides passwords, tokens and nkeys in a URL for messages, wherever a
/// mistyped URL puts them ([`secret_ranges`]).
fn redact(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut done = 0;
    for (from, to) in secret_ranges(url) {
        if to < done {
            continue;
        }
        out.push_str(&url[done..from.max(done)]);
        out.push_str("***");
        done = to;
    }
    out.push_str(&url[done..]);
    out
}

/// Where a URL may hold secrets, in order: the user-info up to the last
/// `@` (all but the user name), read as such even without `//` or with a
/// `/` or `?` in the secret, and the value of every secret option, however
/// often it comes.
fn secret_ranges(url: &str) -> Vec<(usize, usize)> {
    let mut hide: Vec<(usize, usize)> = Vec::new();
    // Where the user-info would start: after `scheme:` and any slashes (or
    // at the start, when what precedes the first `:` is no scheme).
    let after = url
        .find(':')
        .filter(|c| is_scheme(&url[..*c]))
        .map_or(0, |c| c + 1);
    let start = after + (url[after..].len() - url[after..].trim_start_matches('/').len());
    // The user-info as the parser reads it (up to the last `@` before the
    // options), and as a secret holding a `?` would make it.
    let options = url[start..].find('?').map_or(url.len(), |i| start + i);
    for end in [options, url.len()] {
        if let Some(at) = url[start..end].rfind('@').map(|i| start + i) {
            // All but the user name; all of it if it holds another `@`
            // (`token@host:@host2` reads as user `token@host`).
            let info = &url[start..at];
            let from = match info.find(':') {
                Some(i) if !info.contains('@') => start + i + 1,
                _ => start,
            };
            hide.push((from, at));
        }
    }
    // Every `key=value` after a `?` or `&`, wherever it is (a stray `?`
    // makes the parser read `x?password` as one key; the user meant one).
    for (i, _) in url.match_indices(['?', '&']) {
        let rest = &url[i + 1..];
        let pair = &rest[..rest.find('&').unwrap_or(rest.len())];
        if let Some(eq) = pair.find('=') {
            let key = pair[..eq].trim_matches(|c: char| !c.is_ascii_alphanumeric());
            if SECRET_OPTIONS.iter().any(|s| key.eq_ignore_ascii_case(s)) {
                hide.push((i + 1 + eq + 1, i + 1 + pair.len()));
            }
        }
    }
    hide.sort_unstable();
    hide
}
