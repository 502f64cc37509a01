//! Tool search on the gateway side: SQLite FTS5 over the name, description and tags of every
//! tool the outbound role knows (paired peers, skills, EAT catalogs), ranked with BM25.
//!
//! The caller's text is never passed as FTS5 query syntax: it is cut into words, each word is
//! quoted as an FTS5 string (a `"` inside doubled) and matched as a prefix, and the words are
//! OR-ed, so `"`, `*`, `NEAR`, `-` or `AND` are just text and any query answers results or
//! nothing, never an error.

use std::sync::Mutex;

use rusqlite::{params, Connection};
use serde::Serialize;

/// Longest query read, in bytes; words beyond [`MAX_WORDS`] are ignored.
pub const MAX_QUERY_BYTES: usize = 512;
pub const MAX_WORDS: usize = 16;

/// One tool to index.
#[derive(Debug, Clone)]
pub struct Indexed {
    pub name: String,
    pub description: String,
    pub tags: Vec<String>,
    /// Who serves it: the peer, skill or catalog id.
    pub provider: String,
    /// `peer`, `skill` or `eat`.
    pub kind: &'static str,
}

/// One result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hit {
    pub name: String,
    pub description: String,
    pub tags: Vec<String>,
    pub provider: String,
    pub kind: String,
    /// BM25 (lower is better), as SQLite computes it.
    pub rank: f64,
}

/// The index, rebuilt after every discovery.
pub struct ToolIndex {
    conn: Mutex<Connection>,
}

impl ToolIndex {
    pub fn new() -> Result<Self, rusqlite::Error> {
        let conn = Connection::open_in_memory()?;
        conn.execute_batch(
            "CREATE VIRTUAL TABLE tools USING fts5(
                name, description, tags, provider UNINDEXED, kind UNINDEXED,
                tokenize = 'unicode61 remove_diacritics 2'
            );",
        )?;
        Ok(ToolIndex {
            conn: Mutex::new(conn),
        })
    }

    /// Replace what is indexed with `tools`.
    pub fn replace(&self, tools: &[Indexed]) -> Result<(), rusqlite::Error> {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let tx = conn.transaction()?;
        tx.execute("DELETE FROM tools", [])?;
        {
            let mut insert = tx.prepare(
                "INSERT INTO tools (name, description, tags, provider, kind) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for t in tools {
                insert.execute(params![
                    t.name,
                    t.description,
                    t.tags.join(" "),
                    t.provider,
                    t.kind
                ])?;
            }
        }
        tx.commit()
    }

    /// The best `limit` matches of `text` whose name `keep` accepts, best first; nothing for a
    /// query without words. Matches are read in rank order until `limit` are kept, so a caller
    /// allowed only a few tools still gets the best of those, however many better ones it may
    /// not call.
    pub fn search(
        &self,
        text: &str,
        limit: usize,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<Hit>, rusqlite::Error> {
        let Some(query) = fts_query(text) else {
            return Ok(Vec::new());
        };
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        // Names weigh most, then tags, then descriptions.
        let mut stmt = conn.prepare_cached(
            "SELECT name, description, tags, provider, kind, bm25(tools, 10.0, 1.0, 5.0)
             FROM tools WHERE tools MATCH ?1 ORDER BY 6, name",
        )?;
        let mut rows = stmt.query(params![query])?;
        let mut hits = Vec::new();
        while hits.len() < limit {
            let Some(r) = rows.next()? else { break };
            let name: String = r.get(0)?;
            if !keep(&name) {
                continue;
            }
            let tags: String = r.get(2)?;
            hits.push(Hit {
                name,
                description: r.get(1)?,
                tags: tags.split_whitespace().map(str::to_string).collect(),
                provider: r.get(3)?,
                kind: r.get(4)?,
                rank: r.get(5)?,
            });
        }
        Ok(hits)
    }
}

/// The FTS5 query for the caller's text: each word a quoted prefix, OR-ed. `None` when the
/// text has no word.
pub fn fts_query(text: &str) -> Option<String> {
    let mut end = text.len().min(MAX_QUERY_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let text = &text[..end];
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(MAX_WORDS)
        .map(|w| format!("\"{}\"*", w.replace('"', "\"\"")))
        .collect();
    (!words.is_empty()).then(|| words.join(" OR "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(_: &str) -> bool {
        true
    }

    fn index() -> ToolIndex {
        let i = ToolIndex::new().unwrap();
        i.replace(&[
            Indexed {
                name: "memory.append".into(),
                description: "Store a memory entry".into(),
                tags: vec!["memory-east".into()],
                provider: "memory-east".into(),
                kind: "peer",
            },
            Indexed {
                name: "memory.query".into(),
                description: "Find memory entries containing a text".into(),
                tags: vec!["memory-east".into()],
                provider: "memory-east".into(),
                kind: "peer",
            },
            Indexed {
                name: "weather.forecast".into(),
                description: "Forecast for a city, NEAR or far".into(),
                tags: vec!["weather".into(), "forecast".into()],
                provider: "wx".into(),
                kind: "eat",
            },
        ])
        .unwrap();
        i
    }

    #[test]
    fn words_find_tools_by_name_tag_and_description_best_first() {
        let i = index();
        let hits = i.search("query memory", 10, all).unwrap();
        assert_eq!(hits[0].name, "memory.query");
        assert_eq!(hits.len(), 2);
        let hits = i.search("forec", 10, all).unwrap();
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].tags, ["weather", "forecast"]);
        assert_eq!(
            i.search("city", 10, all).unwrap()[0].name,
            "weather.forecast"
        );
        assert!(i.search("nothing-like-it", 10, all).unwrap().is_empty());
        assert_eq!(i.search("memory", 1, all).unwrap().len(), 1);
    }

    #[test]
    fn a_caller_allowed_few_tools_gets_the_best_of_those_below_many_better_ones() {
        let i = ToolIndex::new().unwrap();
        // Forty tools rank above the one the caller may call (their names match too).
        let mut tools: Vec<Indexed> = (0..40)
            .map(|n| Indexed {
                name: format!("memory.tool{n:02}"),
                description: "memory memory".into(),
                tags: vec!["memory".into()],
                provider: "memory-east".into(),
                kind: "peer",
            })
            .collect();
        tools.push(Indexed {
            name: "notes.find".into(),
            description: "Find notes in memory".into(),
            tags: Vec::new(),
            provider: "notes".into(),
            kind: "peer",
        });
        i.replace(&tools).unwrap();
        let everything = i.search("memory", 100, all).unwrap();
        assert_eq!(everything.len(), 41);
        assert_eq!(everything.last().unwrap().name, "notes.find");
        let allowed = |name: &str| name == "notes.find";
        let hits = i.search("memory", 1, allowed).unwrap();
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].name, "notes.find");
        // Stops at `limit` kept.
        let even = |name: &str| name.ends_with(['0', '2', '4', '6', '8']);
        let hits = i.search("memory", 3, even).unwrap();
        let names: Vec<_> = hits.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["memory.tool00", "memory.tool02", "memory.tool04"]);
    }

    #[test]
    fn fts_syntax_in_the_query_is_text_never_an_error() {
        let i = index();
        for q in [
            "\"",
            "\"\"\"",
            "*",
            "memory*",
            "NEAR",
            "NEAR(memory query, 2)",
            "-memory",
            "memory - query",
            "AND OR NOT",
            "memory AND",
            "(",
            ")",
            "^memory",
            "name:memory",
            "{name}: x",
            "'",
            "\u{0}",
            "",
            "   ",
            "é ü 記憶",
            &"a".repeat(5000),
            &"w ".repeat(100),
        ] {
            let got = i.search(q, 10, all);
            assert!(got.is_ok(), "{q:?}: {got:?}");
        }
        // `NEAR` is a word like any other (it is in a description).
        assert_eq!(
            i.search("NEAR", 10, all).unwrap()[0].name,
            "weather.forecast"
        );
        assert_eq!(i.search("-memory", 10, all).unwrap().len(), 2);
    }

    #[test]
    fn the_query_quotes_every_word() {
        assert_eq!(
            fts_query("a\"b c"),
            Some("\"a\"* OR \"b\"* OR \"c\"*".into())
        );
        assert_eq!(fts_query("* - ()"), None);
    }
}
