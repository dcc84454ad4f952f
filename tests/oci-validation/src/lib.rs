//! Shared vocabulary of the OCI conformance suite.
//!
//! The harness (`oci-validate`) writes a list of [`expect::Expect`] entries
//! into each bundle's rootfs; the checker (`oci-checker`), running inside the
//! container as its workload, evaluates them and prints one line per check:
//! `ok NAME`, `not ok NAME: detail` or `skip NAME: reason`.

pub mod caps;
pub mod expect;

/// Where the harness puts the checker binary inside every rootfs.
pub const CHECKER_PATH: &str = "/oci-checker";
/// Where the harness puts the default expectations file inside every rootfs.
pub const EXPECT_PATH: &str = "/oci-expect.json";

/// One line of checker output, parsed back by the harness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Ok(String),
    NotOk(String, String),
    Skip(String, String),
}

impl Line {
    /// Parses one output line; lines that are not check results give `None`.
    pub fn parse(line: &str) -> Option<Line> {
        Line::parse_known(line, &[])
    }

    /// As [`Line::parse`], knowing the names of the checks asked for: a
    /// name may itself contain ": " ("no net namespace: the host's"), so the
    /// longest known name that the line starts with wins over the first
    /// ": ".
    pub fn parse_known(line: &str, names: &[&str]) -> Option<Line> {
        let line = line.trim_end_matches(['\r', '\n']);
        if let Some(rest) = line.strip_prefix("not ok ") {
            let (name, detail) = split_detail(rest, names);
            Some(Line::NotOk(name, detail))
        } else if let Some(rest) = line.strip_prefix("skip ") {
            let (name, detail) = split_detail(rest, names);
            Some(Line::Skip(name, detail))
        } else {
            line.strip_prefix("ok ")
                .map(|name| Line::Ok(name.trim().to_string()))
        }
    }

    /// Renders the line as the checker prints it.
    pub fn render(&self) -> String {
        match self {
            Line::Ok(name) => format!("ok {name}"),
            Line::NotOk(name, detail) => format!("not ok {name}: {detail}"),
            Line::Skip(name, detail) => format!("skip {name}: {detail}"),
        }
    }
}

/// The name and the detail of `NAME: detail`: the longest of `names` that
/// fits, else everything before the first ": ".
fn split_detail(rest: &str, names: &[&str]) -> (String, String) {
    let known = names
        .iter()
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
        .filter_map(|n| {
            let after = rest.strip_prefix(n)?;
            if after.trim().is_empty() {
                Some((n, ""))
            } else {
                after.strip_prefix(": ").map(|d| (n, d))
            }
        })
        .max_by_key(|(n, _)| n.len());
    if let Some((name, detail)) = known {
        return (name.to_string(), detail.to_string());
    }
    match rest.split_once(": ") {
        Some((name, detail)) => (name.trim().to_string(), detail.to_string()),
        None => (rest.trim().to_string(), String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_three_forms() {
        assert_eq!(Line::parse("ok a b"), Some(Line::Ok("a b".into())));
        assert_eq!(
            Line::parse("not ok env HOME: got x: y\r"),
            Some(Line::NotOk("env HOME".into(), "got x: y".into()))
        );
        assert_eq!(
            Line::parse("skip kcore: absent"),
            Some(Line::Skip("kcore".into(), "absent".into()))
        );
        assert_eq!(Line::parse("hello"), None);
    }

    #[test]
    fn known_names_may_contain_the_separator() {
        let names = ["no net namespace: the host's", "no net namespace"];
        assert_eq!(
            Line::parse_known("not ok no net namespace: the host's: net is x", &names),
            Some(Line::NotOk(
                "no net namespace: the host's".into(),
                "net is x".into()
            ))
        );
        assert_eq!(
            Line::parse_known("skip no net namespace: absent", &names),
            Some(Line::Skip("no net namespace".into(), "absent".into()))
        );
        assert_eq!(
            Line::parse_known("not ok other: a: b", &names),
            Some(Line::NotOk("other".into(), "a: b".into()))
        );
    }

    #[test]
    fn render_round_trips() {
        for l in [
            Line::Ok("x".into()),
            Line::NotOk("y z".into(), "bad".into()),
            Line::Skip("w".into(), "why".into()),
        ] {
            assert_eq!(Line::parse(&l.render()), Some(l));
        }
    }
}
