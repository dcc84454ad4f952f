//! Checks on what the caller hands us — the container id and the bundle —
//! before anything is created, so bad input fails with one line naming the
//! problem and leaves nothing behind.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{Capability, Spec};

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("invalid container id {0:?}: {1}")]
    InvalidId(String, &'static str),
    #[error("bundle {0} does not exist")]
    BundleMissing(PathBuf),
    #[error("bundle {0} is not a directory")]
    BundleNotDir(PathBuf),
    #[error("cannot read {path}: {source}")]
    ReadConfig {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}")]
    NotJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path} is not a valid OCI runtime config: {source}")]
    InvalidSpec {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{0}: the \"{1}\" field is missing")]
    Missing(PathBuf, &'static str),
    #[error("{0}: process.args must not be empty")]
    EmptyArgs(PathBuf),
    #[error("{0}: unsupported ociVersion {1:?} (only 1.x is supported)")]
    Version(PathBuf, String),
    #[error("rootfs {0} does not exist")]
    RootfsMissing(PathBuf),
    #[error("rootfs {0} is not a directory")]
    RootfsNotDir(PathBuf),
}

/// Container ids become directory names: same rule as runc.
pub fn validate_id(id: &str) -> Result<(), BundleError> {
    let bad = |why| Err(BundleError::InvalidId(id.to_string(), why));
    if id.is_empty() {
        return bad("it is empty");
    }
    if id == "." || id == ".." {
        return bad("it is a path component");
    }
    if id.len() > 1024 {
        return bad("it is longer than 1024 bytes");
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'-' | b'.'))
    {
        return bad("only letters, digits, '_', '+', '-' and '.' are allowed");
    }
    Ok(())
}

/// A bundle whose config.json parsed and whose rootfs exists.
pub struct Bundle {
    pub path: PathBuf,
    pub spec: Spec,
    pub rootfs: PathBuf,
    /// `spec` is not what config.json says (capability names runc does
    /// not know were dropped from it): whoever reads the file again must
    /// be handed `spec` instead.
    pub edited: bool,
}

/// The capability a name in `process.capabilities` (or `exec --cap`)
/// stands for, spelled as runc spells it: `CAP_` and upper case. runc
/// ignores any other name, and so do we (oci-spec alone would also take
/// `SYS_ADMIN`, and refuse the whole config for one name it does not know).
pub fn known_capability(name: &str) -> Option<Capability> {
    let spelled = name.starts_with("CAP_") && name == name.to_ascii_uppercase();
    if !spelled {
        return None;
    }
    serde_json::from_value(serde_json::Value::String(name.to_string())).ok()
}

/// Removes from each capability set of `process` (a process's JSON) the
/// names [`known_capability`] does not know, as runc leaves them out;
/// returns them.
pub fn drop_unknown_capabilities(process: &mut serde_json::Value) -> Vec<String> {
    let mut dropped = Vec::new();
    let Some(sets) = process
        .get_mut("capabilities")
        .and_then(|c| c.as_object_mut())
    else {
        return dropped;
    };
    for names in sets.values_mut().filter_map(|v| v.as_array_mut()) {
        names.retain(|n| match n.as_str() {
            Some(name) if known_capability(name).is_none() => {
                dropped.push(name.to_string());
                false
            }
            // A name that is not a string is left for the parser to refuse.
            _ => true,
        });
    }
    dropped
}

/// Logs runc's warning for capability names it ignores: each once, sorted.
pub fn warn_unknown_capabilities(mut names: Vec<String>) {
    names.sort_unstable();
    names.dedup();
    if !names.is_empty() {
        tracing::warn!(
            "ignoring unknown or unavailable capabilities: [{}]",
            names.join(" ")
        );
    }
}

impl Bundle {
    pub fn load(path: &Path) -> Result<Bundle, BundleError> {
        match std::fs::metadata(path) {
            Err(_) => return Err(BundleError::BundleMissing(path.to_path_buf())),
            Ok(m) if !m.is_dir() => return Err(BundleError::BundleNotDir(path.to_path_buf())),
            Ok(_) => {}
        }
        let (spec, dropped) = Self::read_spec(&path.join("config.json"))?;
        let edited = !dropped.is_empty();
        warn_unknown_capabilities(dropped);
        let mut bundle = Self::with_spec(path, spec)?;
        bundle.edited = edited;
        Ok(bundle)
    }

    /// The bundle at `path` whose config is `spec`, already read and
    /// checked as [`Bundle::parse_spec`] checks it (the microVM guest gets
    /// the spec from the host, which loaded the bundle). Checks the root.
    pub fn with_spec(path: &Path, spec: Spec) -> Result<Bundle, BundleError> {
        let config = path.join("config.json");
        let root = spec
            .root()
            .as_ref()
            .ok_or_else(|| BundleError::Missing(config.clone(), "root"))?;
        let rootfs = if root.path().is_absolute() {
            root.path().clone()
        } else {
            path.join(root.path())
        };
        match std::fs::metadata(&rootfs) {
            Err(_) => return Err(BundleError::RootfsMissing(rootfs)),
            Ok(m) if !m.is_dir() => return Err(BundleError::RootfsNotDir(rootfs)),
            Ok(_) => {}
        }
        Ok(Bundle {
            path: path.to_path_buf(),
            spec,
            rootfs,
            edited: false,
        })
    }

    /// Whether the container's process wants a terminal.
    pub fn terminal(&self) -> bool {
        self.spec
            .process()
            .as_ref()
            .and_then(|p| p.terminal())
            .unwrap_or(false)
    }

    /// Parses the text of `config` (a bundle's config.json) into a spec,
    /// with the checks `load` makes before it looks at the filesystem;
    /// capability names runc does not know are left out with runc's
    /// warning.
    pub fn parse_spec(config: &Path, text: &[u8]) -> Result<Spec, BundleError> {
        let (spec, dropped) = Self::parse(config, text)?;
        warn_unknown_capabilities(dropped);
        Ok(spec)
    }

    /// Reads the spec of a bundle's `config` as [`Bundle::parse_spec`]
    /// does (for a container made from it), returning the capability names
    /// it left out instead of warning about them again.
    pub fn read_spec(config: &Path) -> Result<(Spec, Vec<String>), BundleError> {
        let text = std::fs::read(config).map_err(|source| BundleError::ReadConfig {
            path: config.to_path_buf(),
            source,
        })?;
        Self::parse(config, &text)
    }

    /// As [`Bundle::parse_spec`], returning the capability names it left
    /// out instead of warning about them.
    fn parse(config: &Path, text: &[u8]) -> Result<(Spec, Vec<String>), BundleError> {
        // Two passes: first "is it JSON at all", then "is it a runtime
        // config", so the message says which of the two went wrong.
        let mut value: serde_json::Value =
            serde_json::from_slice(text).map_err(|source| BundleError::NotJson {
                path: config.to_path_buf(),
                source,
            })?;
        // The fields whose absence users hit most get their own message
        // before the generic "not a valid runtime config".
        let process = value
            .get("process")
            .filter(|p| !p.is_null())
            .ok_or_else(|| BundleError::Missing(config.to_path_buf(), "process"))?;
        if process
            .get("args")
            .and_then(|a| a.as_array())
            .is_none_or(|a| a.is_empty())
        {
            return Err(BundleError::EmptyArgs(config.to_path_buf()));
        }
        let dropped = value
            .get_mut("process")
            .map(drop_unknown_capabilities)
            .unwrap_or_default();
        let spec: Spec =
            serde_json::from_value(value).map_err(|source| BundleError::InvalidSpec {
                path: config.to_path_buf(),
                source,
            })?;
        if !spec.version().starts_with("1.") {
            return Err(BundleError::Version(
                config.to_path_buf(),
                spec.version().clone(),
            ));
        }
        Ok((spec, dropped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle_with(config: &str, make_rootfs: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        if make_rootfs {
            std::fs::create_dir(dir.path().join("rootfs")).unwrap();
        }
        dir
    }

    const GOOD: &str = r#"{"ociVersion":"1.0.2","process":{"cwd":"/","user":{"uid":0,"gid":0},"args":["true"]},"root":{"path":"rootfs"}}"#;

    #[test]
    fn ids() {
        assert!(validate_id("abc-1.2_x+y").is_ok());
        for bad in ["", ".", "..", "a/b", "../x", "a b", "a\0b"] {
            assert!(validate_id(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_id(&"a".repeat(1025)).is_err());
    }

    #[test]
    fn good_bundle_loads() {
        let d = bundle_with(GOOD, true);
        let b = Bundle::load(d.path()).unwrap();
        assert_eq!(b.rootfs, d.path().join("rootfs"));
    }

    #[test]
    fn each_bad_bundle_names_its_problem() {
        let cases: &[(&str, bool, &str)] = &[
            ("not json", true, "is not valid JSON"),
            (
                r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"}}"#,
                true,
                "\"process\" field is missing",
            ),
            (
                &GOOD.replace("[\"true\"]", "[]"),
                true,
                "process.args must not be empty",
            ),
            (GOOD, false, "rootfs"),
            (
                &GOOD.replace("1.0.2", "0.9"),
                true,
                "unsupported ociVersion",
            ),
            (
                r#"{"ociVersion":"1.0.2","process":{"cwd":1,"args":["x"]}}"#,
                true,
                "not a valid OCI runtime config",
            ),
        ];
        for (config, rootfs, want) in cases {
            let d = bundle_with(config, *rootfs);
            let err = Bundle::load(d.path()).err().expect("accepted").to_string();
            assert!(err.contains(want), "{config}: {err}");
        }
    }

    #[test]
    fn bundle_that_is_a_file() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, "").unwrap();
        assert!(matches!(
            Bundle::load(&f),
            Err(BundleError::BundleNotDir(_))
        ));
        assert!(matches!(
            Bundle::load(&d.path().join("nope")),
            Err(BundleError::BundleMissing(_))
        ));
    }

    #[test]
    fn capability_names_runc_does_not_know_are_left_out() {
        let caps = r#""capabilities":{"bounding":["CAP_KILL","CAP_BOGUS","SYS_ADMIN"],"effective":["cap_kill","CAP_KILL"],"ambient":[]}"#;
        let config = GOOD.replace(r#""args":["true"]"#, &format!(r#""args":["true"],{caps}"#));
        let d = bundle_with(&config, true);
        let b = Bundle::load(d.path()).expect("a config with unknown names loads");
        assert!(b.edited, "the spec differs from the file");
        let c = b
            .spec
            .process()
            .as_ref()
            .and_then(|p| p.capabilities().clone())
            .expect("capabilities");
        let kill = || Some([Capability::Kill].into_iter().collect());
        assert_eq!(c.bounding(), &kill());
        assert_eq!(c.effective(), &kill());
        assert_eq!(c.ambient(), &Some(Default::default()));
        let (_, dropped) = Bundle::read_spec(&d.path().join("config.json")).expect("read");
        assert_eq!(dropped, ["CAP_BOGUS", "SYS_ADMIN", "cap_kill"]);
        // A config without such names is handed on as it is.
        let d = bundle_with(GOOD, true);
        assert!(!Bundle::load(d.path()).expect("loads").edited);
        // A name that is not a string is still refused.
        let config = GOOD.replace(
            r#""args":["true"]"#,
            r#""args":["true"],"capabilities":{"bounding":[7]}"#,
        );
        let d = bundle_with(&config, true);
        let err = Bundle::load(d.path()).err().expect("accepted");
        assert!(
            err.to_string().contains("not a valid OCI runtime config"),
            "{err}"
        );
    }
}
