//! OAuth scopes mapped to permissions, in the same policy model as paired peers.
//!
//! The configuration maps each scope to permission patterns (`tool.call:<name>`,
//! `tool.call:memory.*`, `resource.read:*`, ...). Scopes form a hierarchy along `:`: a token
//! holding `tools` also holds `tools:read` and `tools:read:files`, never the reverse. A token's
//! permissions are the patterns of every configured scope it holds; anything else is denied.

use std::collections::BTreeMap;

use crate::authorization::{matches_action, Permissions, Policy};

/// Configured scopes and what each grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeMap {
    grants: BTreeMap<String, Vec<String>>,
}

/// Whether the token scope `held` covers the configured scope `scope`.
pub fn covers(held: &str, scope: &str) -> bool {
    scope == held
        || scope
            .strip_prefix(held)
            .is_some_and(|rest| rest.starts_with(':'))
}

impl ScopeMap {
    pub fn new(grants: BTreeMap<String, Vec<String>>) -> Self {
        ScopeMap { grants }
    }

    /// Every configured scope, in name order (`scopes_supported` of the metadata).
    pub fn scopes(&self) -> impl Iterator<Item = &str> {
        self.grants.keys().map(String::as_str)
    }

    /// The permission patterns a token holding `held` gets.
    pub fn patterns<'a>(&'a self, held: &'a [String]) -> impl Iterator<Item = &'a String> + 'a {
        self.grants
            .iter()
            .filter(|(scope, _)| held.iter().any(|h| covers(h, scope)))
            .flat_map(|(_, patterns)| patterns)
    }

    /// The permissions of a token holding `held`.
    pub fn permissions(&self, held: &[String]) -> Permissions {
        let mut allow: Vec<String> = self.patterns(held).cloned().collect();
        allow.sort();
        allow.dedup();
        Permissions::new(
            "oauth",
            Policy {
                allow,
                ..Policy::default()
            },
        )
    }

    /// The scope to ask for so that `action` is allowed: of the configured scopes granting
    /// it, the narrowest: the one whose granting pattern is the most specific (an exact action
    /// before a wildcard, a longer prefix before a shorter), then the deepest scope name.
    pub fn needed_for(&self, action: &str) -> Option<&str> {
        let specificity = |p: &String| (!p.ends_with('*'), p.len());
        self.grants
            .iter()
            .filter_map(|(scope, patterns)| {
                let best = patterns
                    .iter()
                    .filter(|p| matches_action(p, action))
                    .map(specificity)
                    .max()?;
                Some(((best, scope.len()), scope.as_str()))
            })
            .max_by_key(|(key, _)| *key)
            .map(|(_, scope)| scope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> ScopeMap {
        let mut g = BTreeMap::new();
        g.insert("tools".into(), vec!["tool.call:*".into()]);
        g.insert(
            "tools:read".into(),
            vec!["tool.call:search".into(), "tool.call:get_*".into()],
        );
        g.insert("notes".into(), vec!["resource.read:notes://*".into()]);
        ScopeMap::new(g)
    }

    #[test]
    fn a_parent_scope_holds_its_children_and_not_the_reverse() {
        assert!(covers("tools", "tools:read"));
        assert!(covers("tools", "tools"));
        assert!(!covers("tools:read", "tools"));
        assert!(!covers("tool", "tools:read"), "a prefix is not a parent");
        let m = map();
        let read = m.permissions(&["tools:read".into()]);
        assert!(read.may_call("search", 0));
        assert!(read.may_call("get_note", 0));
        assert!(!read.may_call("delete", 0));
        let all = m.permissions(&["tools".into()]);
        assert!(all.may_call("delete", 0) && all.may_call("search", 0));
        assert!(!all.may_read("notes://a", 0));
        let none = m.permissions(&["unknown".into(), "".into()]);
        assert!(!none.may_call("search", 0), "unknown scopes grant nothing");
    }

    #[test]
    fn the_narrowest_scope_is_asked_for() {
        let m = map();
        assert_eq!(m.needed_for("tool.call:search"), Some("tools:read"));
        assert_eq!(m.needed_for("tool.call:delete"), Some("tools"));
        assert_eq!(m.needed_for("resource.read:notes://x"), Some("notes"));
        assert_eq!(m.needed_for("prompt.get:x"), None);
    }
}
