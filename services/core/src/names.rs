//! Identifier charsets. Tenant slugs end up inside Redis hash tags (`{acme}`), target ids and
//! route names inside usage hash fields (`route|target`), so each charset excludes the
//! characters those encodings use.

/// Tenant slug: 1–63 of `a-z 0-9 -`, starting with a letter or digit.
pub fn check_tenant_slug(s: &str) -> Result<(), String> {
    let ok_len = (1..=63).contains(&s.len());
    let ok_chars = s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ok_start = s.bytes().next().is_some_and(|b| b != b'-');
    if ok_len && ok_chars && ok_start {
        Ok(())
    } else {
        Err("must be 1-63 characters of a-z, 0-9 and '-', not starting with '-'".into())
    }
}

/// Target id: 1–64 of letters, digits, `.`, `_`, `-`.
pub fn check_target_id(s: &str) -> Result<(), String> {
    check_charset(s, 64, b"._-", "letters, digits, '.', '_' and '-'")
}

/// Route name (seed §3.2): 1–128 of letters, digits, `.`, `_`, `-`, `/` (e.g. `shield/cheap`);
/// no leading, trailing or doubled `/`.
pub fn check_route_name(s: &str) -> Result<(), String> {
    check_charset(s, 128, b"._-/", "letters, digits, '.', '_', '-' and '/'")?;
    if s.starts_with('/') || s.ends_with('/') || s.contains("//") {
        return Err("must not start or end with '/' or contain '//'".into());
    }
    Ok(())
}

/// Secret name (the part after `shield://`): 1–64 of letters, digits, `.`, `_`, `-`.
pub fn check_secret_name(s: &str) -> Result<(), String> {
    check_charset(s, 64, b"._-", "letters, digits, '.', '_' and '-'")
}

fn check_charset(s: &str, max: usize, extra: &[u8], described: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > max {
        return Err(format!("must be 1-{max} characters of {described}"));
    }
    if let Some(c) = s.chars().find(|c| !(c.is_ascii_alphanumeric() || (c.is_ascii() && extra.contains(&(*c as u8))))) {
        return Err(format!("contains {c:?}; allowed: {described}"));
    }
    Ok(())
}

/// RFC 9110 `token`: the characters a header name may contain.
pub fn is_header_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_names() {
        for ok in ["smart", "shield/cheap", "gpt-4o.mini_v2", "a"] {
            assert!(check_route_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "/x", "x/", "a//b", "sm art", "a|b", "ü", "x{y}", &"a".repeat(129)] {
            assert!(check_route_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn slugs_and_ids() {
        assert!(check_tenant_slug("acme-2").is_ok());
        for bad in ["", "-a", "Acme", "a_b", "a{b}", &"a".repeat(64)] {
            assert!(check_tenant_slug(bad).is_err(), "{bad}");
        }
        assert!(check_target_id("openai-4o").is_ok());
        assert!(check_target_id("a/b").is_err());
        assert!(check_target_id("a|b").is_err());
    }

    #[test]
    fn header_tokens() {
        assert!(is_header_token("X-Provider-Key"));
        assert!(is_header_token("api-key"));
        for bad in ["", "Bad Header", "x:y", "ключ", "a\r\nb"] {
            assert!(!is_header_token(bad), "{bad}");
        }
    }
}
