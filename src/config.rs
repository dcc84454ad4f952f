//! Tier selection and `/etc/agentvm/config.toml`.
//!
//! Precedence: `--isolation` flag > the container's `io.agentvm.isolation`
//! annotation > the config file > the default, `microvm`. A tier that cannot
//! be provided is an error; a weaker tier is never substituted silently.
//!
//! The file's keys are the fields of [`Config`] and, under `[microvm]`,
//! [`MicrovmConfig`] (README.md, "Configuration", shows them all).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/agentvm/config.toml";

/// OCI annotation that picks the tier of one container.
pub const ISOLATION_ANNOTATION: &str = "io.agentvm.isolation";

/// Largest `microvm.default_memory_mib` (16 TiB): a VM's size in bytes
/// must be a number the VMM can take.
pub const MAX_MEMORY_MIB: u64 = 16 << 20;
/// `microvm.boot_timeout_secs` when the file sets none.
pub const DEFAULT_BOOT_TIMEOUT_SECS: u64 = 120;
/// Largest `microvm.boot_timeout_secs` (a day).
pub const MAX_BOOT_TIMEOUT_SECS: u64 = 24 * 60 * 60;
/// Most booted microVMs a pool may keep (`microvm.pool`).
pub const MAX_POOL: u32 = 16;
/// The kernel's largest pid (`PID_MAX_LIMIT` on 64-bit): QEMU's uid is
/// the base plus its supervisor's pid, so the range is this long.
pub const PID_MAX_LIMIT: u32 = 1 << 22;
/// `microvm.vmm_uid_base` when the file sets none: 2,000,000,000 to
/// 2,004,194,303, above the ids of users, systemd's dynamic users and
/// the usual subordinate-id ranges, below 2^31.
pub const DEFAULT_VMM_UID_BASE: u32 = 2_000_000_000;
/// Smallest `microvm.vmm_uid_base`: never root or a system or login user.
pub const MIN_VMM_UID_BASE: u32 = 65_536;
/// Largest `microvm.vmm_uid_base`: the range must end below the invalid
/// id `u32::MAX` (-1).
pub const MAX_VMM_UID_BASE: u32 = u32::MAX - 1 - PID_MAX_LIMIT;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// The container boots its own kernel in a microVM.
    #[default]
    Microvm,
    /// Namespaces, cgroups, seccomp and capabilities on the host kernel.
    Container,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Microvm => "microvm",
            Isolation::Container => "container",
        }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Isolation {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "microvm" => Ok(Isolation::Microvm),
            "container" => Ok(Isolation::Container),
            other => Err(ConfigError::UnknownIsolation(other.to_string())),
        }
    }
}

/// Where the chosen tier came from, for the runtime log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsolationSource {
    Flag,
    Annotation,
    ConfigFile,
    Default,
}

impl fmt::Display for IsolationSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IsolationSource::Flag => "--isolation flag",
            IsolationSource::Annotation => "annotation io.agentvm.isolation",
            IsolationSource::ConfigFile => "config file",
            IsolationSource::Default => "default",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown isolation {0:?}: expected \"microvm\" or \"container\"")]
    UnknownIsolation(String),
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
}

/// The contents of `config.toml`. Unknown keys are refused so that a typo
/// does not silently leave a setting at its default.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Default tier for containers that do not choose one.
    pub isolation: Option<Isolation>,
    #[serde(default)]
    pub microvm: MicrovmConfig,
    #[serde(default)]
    pub egress: EgressConfig,
    #[serde(default)]
    pub audit: AuditConfig,
}

/// `[audit]`: where the audit trail goes (see `audit/`).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// The host-wide audit file; default `/var/log/agentvm/audit.jsonl`.
    pub path: Option<PathBuf>,
    /// An OTLP/HTTP endpoint (`http://HOST:PORT`) that the audit lines are
    /// exported to as OpenTelemetry logs (docs/audit.md).
    pub otlp_endpoint: Option<String>,
}

impl AuditConfig {
    /// Refuses an endpoint that is not an `http://` URL, naming the key.
    fn validate(&self) -> Result<(), String> {
        if let Some(e) = &self.otlp_endpoint {
            e.parse::<crate::audit::otlp::Endpoint>()
                .map_err(|err| format!("audit.otlp_endpoint: {err}"))?;
        }
        if self.path.as_ref().is_some_and(|p| !p.is_absolute()) {
            return Err("audit.path: must be an absolute path".to_string());
        }
        Ok(())
    }

    /// The endpoint, checked when the config was loaded.
    pub fn endpoint(&self) -> Option<crate::audit::otlp::Endpoint> {
        self.otlp_endpoint.as_deref().and_then(|e| e.parse().ok())
    }

    pub fn path(&self) -> PathBuf {
        self.path
            .clone()
            .unwrap_or_else(|| PathBuf::from(crate::audit::DEFAULT_PATH))
    }
}

/// `[egress]`: the host-wide egress policy (see `egress.rs`).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressConfig {
    /// `allow`, `deny` or an allowlist; the default when a container sets
    /// none.
    pub policy: Option<String>,
    /// The flag and the annotation may only narrow `policy`.
    #[serde(default)]
    pub locked: bool,
}

/// Settings of the microvm tier.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MicrovmConfig {
    /// Guest kernel (an uncompressed `vmlinux`).
    pub kernel: Option<PathBuf>,
    /// virtiofsd binary for the qemu backend.
    pub virtiofsd: Option<PathBuf>,
    /// Guest memory when the container sets no memory limit, in MiB.
    pub default_memory_mib: Option<u64>,
    /// The RAM every microVM boots with when the container needs less, in
    /// MiB: a balloon keeps the guest at what its limit needs, and
    /// `update` can raise the limit up to this without a restart. Unset:
    /// a VM's RAM is what its limit needs, and fixed.
    pub memory_ceiling_mib: Option<u64>,
    /// vCPUs when the container sets no CPU limit.
    pub default_vcpus: Option<u32>,
    /// Seconds to wait for the guest to boot before giving up.
    pub boot_timeout_secs: Option<u64>,
    /// A static binary to boot as the guest's `/init` instead of agentvm
    /// itself (which is the guest agent when unset). For debugging a guest
    /// agent and for testing how the host copes with a misbehaving one; the
    /// binary must speak the control protocol of `crates/protocol` (`agentvm-protocol`).
    pub guest_agent: Option<PathBuf>,
    /// First uid (and gid) of the range QEMU runs as: a VM's QEMU is
    /// `vmm_uid_base` + its supervisor's pid, so no two running VMs share
    /// an identity. The range, [`PID_MAX_LIMIT`] ids long, must belong to
    /// no user and no subordinate-id range of the host.
    pub vmm_uid_base: Option<u32>,
    /// Which VMM boots the microVMs: `auto` (the default), `builtin` or
    /// `qemu` (`microvm::vmm::choice`); the `io.agentvm.vmm` annotation
    /// picks it per container.
    pub vmm: Option<crate::microvm::vmm::choice::VmmChoice>,
    /// How many booted microVMs to keep waiting, per `--root`, for the
    /// containers that fit them (`microvm::pool`): 0 or unset, none.
    pub pool: Option<u32>,
}

impl MicrovmConfig {
    /// Refuses values that parse but that no VM could use, naming the key:
    /// found by the `config` fuzz target (docs/fuzzing.md).
    fn validate(&self) -> Result<(), String> {
        use crate::microvm::spec::MIN_MEMORY_MIB;
        if let Some(m) = self.default_memory_mib {
            if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&m) {
                return Err(format!(
                    "microvm.default_memory_mib = {m}: must be {MIN_MEMORY_MIB} to {MAX_MEMORY_MIB} (MiB)"
                ));
            }
        }
        if let Some(m) = self.memory_ceiling_mib {
            if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&m) {
                return Err(format!(
                    "microvm.memory_ceiling_mib = {m}: must be {MIN_MEMORY_MIB} to {MAX_MEMORY_MIB} (MiB)"
                ));
            }
        }
        if let Some(b) = self.vmm_uid_base {
            if !(MIN_VMM_UID_BASE..=MAX_VMM_UID_BASE).contains(&b) {
                return Err(format!(
                    "microvm.vmm_uid_base = {b}: must be {MIN_VMM_UID_BASE} to {MAX_VMM_UID_BASE} \
                     (the range is {PID_MAX_LIMIT} ids long)"
                ));
            }
        }
        if let Some(n) = self.pool {
            if n > MAX_POOL {
                return Err(format!("microvm.pool = {n}: must be 0 to {MAX_POOL}"));
            }
        }
        if let Some(t) = self.boot_timeout_secs {
            if !(1..=MAX_BOOT_TIMEOUT_SECS).contains(&t) {
                return Err(format!(
                    "microvm.boot_timeout_secs = {t}: must be 1 to {MAX_BOOT_TIMEOUT_SECS} (seconds)"
                ));
            }
        }
        Ok(())
    }

    /// How many booted microVMs the pool keeps (0: no pool).
    pub fn pool_size(&self) -> u32 {
        self.pool.unwrap_or(0).min(MAX_POOL)
    }

    /// The first uid of QEMU's identity range.
    pub fn vmm_uid_base(&self) -> u32 {
        self.vmm_uid_base.unwrap_or(DEFAULT_VMM_UID_BASE)
    }

    /// How long the supervisor waits for the guest agent's hello.
    pub fn boot_timeout(&self) -> Duration {
        Duration::from_secs(
            self.boot_timeout_secs
                .unwrap_or(DEFAULT_BOOT_TIMEOUT_SECS)
                .clamp(1, MAX_BOOT_TIMEOUT_SECS),
        )
    }
}

impl Config {
    /// Loads the config file. The default path may be absent; a path the
    /// user named explicitly must exist.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        let (path, required) = match explicit {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                return Ok(Config::default())
            }
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        Self::parse(&text).map_err(|message| ConfigError::Parse { path, message })
    }

    /// Parses the text of a config file; the error is the parser's message
    /// (the caller names the file). Public for the fuzz targets.
    pub fn parse(text: &str) -> Result<Config, String> {
        let config: Config = toml::from_str(text).map_err(|e| e.message().to_string())?;
        config.microvm.validate()?;
        config.audit.validate()?;
        Ok(config)
    }

    /// Picks the tier for a container, following the documented precedence.
    pub fn select_isolation(
        &self,
        flag: Option<Isolation>,
        annotations: Option<&HashMap<String, String>>,
    ) -> Result<(Isolation, IsolationSource), ConfigError> {
        if let Some(i) = flag {
            return Ok((i, IsolationSource::Flag));
        }
        if let Some(value) = annotations.and_then(|a| a.get(ISOLATION_ANNOTATION)) {
            return Ok((value.parse()?, IsolationSource::Annotation));
        }
        if let Some(i) = self.isolation {
            return Ok((i, IsolationSource::ConfigFile));
        }
        Ok((Isolation::default(), IsolationSource::Default))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(v: &str) -> HashMap<String, String> {
        HashMap::from([(ISOLATION_ANNOTATION.to_string(), v.to_string())])
    }

    #[test]
    fn flag_beats_annotation_beats_file_beats_default() {
        let file = Config {
            isolation: Some(Isolation::Container),
            ..Default::default()
        };
        let ann = annotations("microvm");
        assert_eq!(
            file.select_isolation(Some(Isolation::Container), Some(&ann))
                .unwrap(),
            (Isolation::Container, IsolationSource::Flag)
        );
        assert_eq!(
            file.select_isolation(None, Some(&ann)).unwrap(),
            (Isolation::Microvm, IsolationSource::Annotation)
        );
        assert_eq!(
            file.select_isolation(None, None).unwrap(),
            (Isolation::Container, IsolationSource::ConfigFile)
        );
        assert_eq!(
            Config::default().select_isolation(None, None).unwrap(),
            (Isolation::Microvm, IsolationSource::Default)
        );
    }

    #[test]
    fn bad_annotation_is_an_error_not_a_fallback() {
        let err = Config::default()
            .select_isolation(None, Some(&annotations("vm")))
            .unwrap_err();
        assert!(err.to_string().contains("unknown isolation \"vm\""));
    }

    #[test]
    fn config_file_parses_and_refuses_unknown_keys() {
        let c = Config::parse("isolation = \"container\"\n[microvm]\nkernel = \"/k\"\n").unwrap();
        assert_eq!(c.isolation, Some(Isolation::Container));
        assert_eq!(c.microvm.kernel, Some(PathBuf::from("/k")));
        assert!(Config::parse("isolaton = \"container\"").is_err());
        assert!(Config::parse("isolation = \"vm\"").is_err());
    }

    #[test]
    fn microvm_numbers_no_vm_could_use_are_refused() {
        for (text, key) in [
            (
                "[microvm]\ndefault_memory_mib = 0\n",
                "microvm.default_memory_mib = 0",
            ),
            (
                "[microvm]\ndefault_memory_mib = 9223372036854775807\n",
                "default_memory_mib",
            ),
            (
                "[microvm]\nmemory_ceiling_mib = 64\n",
                "microvm.memory_ceiling_mib = 64",
            ),
            (
                "[microvm]\nboot_timeout_secs = 0\n",
                "microvm.boot_timeout_secs = 0",
            ),
            // QEMU as root, or an identity range that wraps past -1.
            ("[microvm]\nvmm_uid_base = 0\n", "microvm.vmm_uid_base = 0"),
            (
                "[microvm]\nvmm_uid_base = 4294967000\n",
                "microvm.vmm_uid_base = 4294967000",
            ),
            // Once a panic in the supervisor (the deadline overflowed Instant).
            (
                "microvm.boot_timeout_secs = 0x7fffffffffffffff\n",
                "boot_timeout_secs",
            ),
        ] {
            let err = Config::parse(text).unwrap_err();
            assert!(err.contains(key), "{text:?}: {err}");
        }
        let ok = Config::parse("[microvm]\ndefault_memory_mib = 128\n").unwrap();
        assert_eq!(ok.microvm.default_memory_mib, Some(128));
        assert_eq!(ok.microvm.vmm_uid_base(), DEFAULT_VMM_UID_BASE);
        let ok = Config::parse("[microvm]\nvmm_uid_base = 300000\n").unwrap();
        assert_eq!(ok.microvm.vmm_uid_base(), 300_000);
        assert_eq!(ok.microvm.boot_timeout(), Duration::from_secs(120));
    }

    #[test]
    fn vmm_is_a_microvm_setting_with_three_values() {
        use crate::microvm::vmm::choice::VmmChoice;
        for (text, want) in [
            ("auto", VmmChoice::Auto),
            ("builtin", VmmChoice::Builtin),
            ("qemu", VmmChoice::Qemu),
        ] {
            let c = Config::parse(&format!("[microvm]\nvmm = \"{text}\"\n")).unwrap();
            assert_eq!(c.microvm.vmm, Some(want));
        }
        assert_eq!(Config::default().microvm.vmm, None);
        let err = Config::parse("[microvm]\nvmm = \"firecracker\"\n").unwrap_err();
        assert!(
            err.contains("firecracker") || err.contains("variant"),
            "{err}"
        );
        assert!(Config::parse("vmm = \"qemu\"\n").is_err());
    }

    #[test]
    fn guest_agent_is_a_microvm_setting() {
        let c = Config::parse("[microvm]\nguest_agent = \"/opt/agent\"\n").unwrap();
        assert_eq!(c.microvm.guest_agent, Some(PathBuf::from("/opt/agent")));
        assert!(Config::parse("guest_agent = \"/opt/agent\"\n").is_err());
    }

    #[test]
    fn audit_settings_are_checked_and_name_the_key() {
        let c = Config::parse(
            "[audit]\npath = \"/tmp/a.jsonl\"\notlp_endpoint = \"http://127.0.0.1:4318\"\n",
        )
        .unwrap();
        assert_eq!(c.audit.path(), PathBuf::from("/tmp/a.jsonl"));
        assert_eq!(
            c.audit.endpoint().map(|e| e.url()).as_deref(),
            Some("http://127.0.0.1:4318/v1/logs")
        );
        assert_eq!(
            Config::default().audit.path(),
            PathBuf::from(crate::audit::DEFAULT_PATH)
        );
        for (text, key) in [
            (
                "[audit]\notlp_endpoint = \"https://c:4318\"\n",
                "audit.otlp_endpoint",
            ),
            (
                "[audit]\notlp_endpoint = \"c:4318\"\n",
                "audit.otlp_endpoint",
            ),
            ("[audit]\npath = \"audit.jsonl\"\n", "audit.path"),
            ("[audit]\nendpoint = \"http://c\"\n", "endpoint"),
        ] {
            let err = Config::parse(text).unwrap_err();
            assert!(err.contains(key), "{text:?}: {err}");
        }
    }

    #[test]
    fn missing_default_file_is_fine_missing_explicit_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.toml");
        assert!(Config::load(Some(&missing)).is_err());
    }
}
