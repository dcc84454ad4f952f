//! Results per runtime, the known-differences list and the comparison table.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

/// The outcome of one check on one runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Fail(String),
    Skip(String),
}

/// Everything one runtime produced.
#[derive(Debug, Default)]
pub struct RuntimeResults {
    pub name: String,
    pub checks: Vec<(String, Outcome)>,
    /// Cases that stopped early, with the reason: their unreported checks fail.
    pub aborted: HashMap<String, String>,
}

/// One entry of known-differences.toml.
#[derive(Debug, Clone, Deserialize)]
pub struct Difference {
    pub runtime: String,
    /// A check name, or a prefix ending in `*`.
    pub check: String,
    pub reason: String,
}

#[derive(Debug, Default, Deserialize)]
struct DifferenceFile {
    #[serde(default)]
    difference: Vec<Difference>,
}

/// Loads the known-differences list; a missing file is an empty list.
pub fn load_known(path: &Path) -> Result<Vec<Difference>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let f: DifferenceFile =
        toml::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    Ok(f.difference)
}

fn known<'a>(list: &'a [Difference], runtime: &str, check: &str) -> Option<&'a Difference> {
    list.iter().find(|d| {
        d.runtime == runtime
            && match d.check.strip_suffix('*') {
                Some(prefix) => check.starts_with(prefix),
                None => d.check == check,
            }
    })
}

/// The comparison tally of the final line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Tally {
    pub fn line(&self) -> String {
        let mut s = format!("{} passed, {} failed", self.passed, self.failed);
        if self.skipped > 0 {
            s.push_str(&format!(", {} skipped", self.skipped));
        }
        s
    }
}

/// The union of check names in first-seen order, reference runtime first.
fn check_names(all: &[RuntimeResults]) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut names = Vec::new();
    for r in all {
        for (n, _) in &r.checks {
            if seen.insert(n.clone()) {
                names.push(n.clone());
            }
        }
    }
    names
}

fn outcome_of(r: &RuntimeResults, map: &HashMap<&str, &Outcome>, check: &str) -> Outcome {
    if let Some(o) = map.get(check) {
        return (*o).clone();
    }
    let case = check.split('/').next().unwrap_or(check);
    match r.aborted.get(case) {
        Some(why) => Outcome::Fail(format!("not reached: {why}")),
        None => Outcome::Fail("not reported".to_string()),
    }
}

/// Prints the table, the failure details, the totals and the final line;
/// returns the comparison tally.
pub fn print(all: &[RuntimeResults], known_list: &[Difference]) -> Tally {
    let names = check_names(all);
    let maps: Vec<HashMap<&str, &Outcome>> = all
        .iter()
        .map(|r| r.checks.iter().map(|(n, o)| (n.as_str(), o)).collect())
        .collect();
    let grid: Vec<Vec<Outcome>> = names
        .iter()
        .map(|n| {
            all.iter()
                .zip(&maps)
                .map(|(r, m)| outcome_of(r, m, n))
                .collect()
        })
        .collect();
    let width = names.iter().map(String::len).max().unwrap_or(4).max(4);
    let mut header = format!("{:width$}", "case");
    for r in all {
        header.push_str(&format!(" | {:9}", r.name));
    }
    let header = header.trim_end();
    println!("{header}");
    println!("{}", "-".repeat(header.len()));
    for (n, row) in names.iter().zip(&grid) {
        let mut line = format!("{n:width$}");
        for (r, o) in all.iter().zip(row) {
            let cell = match o {
                Outcome::Ok => "ok",
                Outcome::Skip(_) => "skip",
                Outcome::Fail(_) if known(known_list, &r.name, n).is_some() => "FAIL*",
                Outcome::Fail(_) => "FAIL",
            };
            line.push_str(&format!(" | {cell:9}"));
        }
        println!("{}", line.trim_end());
    }
    println!("(FAIL* = known difference, listed in known-differences.toml)");
    print_details(all, &names, &grid, known_list);
    print_totals(all, &grid);
    println!("distinct checks: {}", names.len());
    let tally = compare(all, &names, &grid, known_list);
    println!("{}", tally.line());
    tally
}

fn print_details(
    all: &[RuntimeResults],
    names: &[String],
    grid: &[Vec<Outcome>],
    known_list: &[Difference],
) {
    println!();
    println!("details:");
    for (n, row) in names.iter().zip(grid) {
        for (r, o) in all.iter().zip(row) {
            match o {
                Outcome::Fail(d) => match known(known_list, &r.name, n) {
                    Some(k) => println!("  {} {n}: FAIL* ({}): {d}", r.name, k.reason),
                    None => println!("  {} {n}: FAIL: {d}", r.name),
                },
                Outcome::Skip(d) => println!("  {} {n}: skipped: {d}", r.name),
                Outcome::Ok => {}
            }
        }
    }
    for r in all.iter().skip(1) {
        for k in known_list.iter().filter(|k| k.runtime == r.name) {
            let matched = names
                .iter()
                .any(|n| known(std::slice::from_ref(k), &r.name, n).is_some());
            if !matched {
                println!(
                    "  note: known difference {:?} for {} matches no check",
                    k.check, r.name
                );
            }
        }
    }
    println!();
}

fn print_totals(all: &[RuntimeResults], grid: &[Vec<Outcome>]) {
    println!("totals:");
    for (i, r) in all.iter().enumerate() {
        let col = grid.iter().filter_map(|row| row.get(i));
        let (mut ok, mut fail, mut skip) = (0, 0, 0);
        for o in col {
            match o {
                Outcome::Ok => ok += 1,
                Outcome::Fail(_) => fail += 1,
                Outcome::Skip(_) => skip += 1,
            }
        }
        println!("  {:12} {ok} ok, {fail} FAIL, {skip} skipped", r.name);
    }
}

/// Compares every other runtime with the reference (the first); with only
/// the reference, counts its own results.
pub fn compare(
    all: &[RuntimeResults],
    names: &[String],
    grid: &[Vec<Outcome>],
    known_list: &[Difference],
) -> Tally {
    let mut t = Tally::default();
    let others = if all.len() > 1 { 1..all.len() } else { 0..1 };
    for (n, row) in names.iter().zip(grid) {
        let Some(reference) = row.first() else {
            continue;
        };
        for i in others.clone() {
            let (Some(r), Some(o)) = (all.get(i), row.get(i)) else {
                continue;
            };
            match (reference, o) {
                // A check the reference fails is a bug in the case.
                (Outcome::Fail(_), _) => t.failed += 1,
                (Outcome::Skip(_), _) | (_, Outcome::Skip(_)) => t.skipped += 1,
                (Outcome::Ok, Outcome::Ok) => t.passed += 1,
                (Outcome::Ok, Outcome::Fail(_)) => match known(known_list, &r.name, n) {
                    Some(_) => t.skipped += 1,
                    None => t.failed += 1,
                },
            }
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rr(name: &str, checks: &[(&str, Outcome)]) -> RuntimeResults {
        RuntimeResults {
            name: name.into(),
            checks: checks
                .iter()
                .map(|(n, o)| ((*n).to_string(), o.clone()))
                .collect(),
            aborted: HashMap::new(),
        }
    }

    #[test]
    fn compares_against_the_reference() {
        let fail = Outcome::Fail("x".into());
        let all = vec![
            rr(
                "runc",
                &[
                    ("a/1", Outcome::Ok),
                    ("a/2", Outcome::Ok),
                    ("a/3", Outcome::Ok),
                ],
            ),
            rr("c", &[("a/1", Outcome::Ok), ("a/2", fail.clone())]),
        ];
        let names = check_names(&all);
        let maps: Vec<HashMap<&str, &Outcome>> = all
            .iter()
            .map(|r| r.checks.iter().map(|(n, o)| (n.as_str(), o)).collect())
            .collect();
        let grid: Vec<Vec<Outcome>> = names
            .iter()
            .map(|n| {
                all.iter()
                    .zip(&maps)
                    .map(|(r, m)| outcome_of(r, m, n))
                    .collect()
            })
            .collect();
        let t = compare(&all, &names, &grid, &[]);
        assert_eq!(
            t,
            Tally {
                passed: 1,
                failed: 2,
                skipped: 0
            }
        );
        let known_list = vec![Difference {
            runtime: "c".into(),
            check: "a/*".into(),
            reason: "r".into(),
        }];
        let t = compare(&all, &names, &grid, &known_list);
        assert_eq!(
            t,
            Tally {
                passed: 1,
                failed: 0,
                skipped: 2
            }
        );
        assert_eq!(t.line(), "1 passed, 0 failed, 2 skipped");
    }

    #[test]
    fn parses_the_known_differences_file() {
        let f: DifferenceFile = toml::from_str(
            "[[difference]]\nruntime = \"microvm\"\ncheck = \"ns/x\"\nreason = \"own kernel\"\n",
        )
        .unwrap();
        assert_eq!(f.difference.len(), 1);
        assert_eq!(f.difference[0].runtime, "microvm");
    }
}
