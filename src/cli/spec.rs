//! `agentvm spec`: writes a starter config.json, as `runc spec` does.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use oci_spec::runtime::Spec;

#[derive(Args, Debug)]
pub struct SpecArgs {
    /// Directory to write config.json into
    #[arg(short, long, default_value = ".")]
    pub bundle: PathBuf,
    // `--rootless` is the global flag of the same name.
}

pub fn default_spec(rootless: bool) -> anyhow::Result<Spec> {
    let mut spec = if rootless {
        Spec::rootless(
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    } else {
        Spec::default()
    };
    // runc's starter spec runs an interactive shell, with no inheritable
    // capabilities (runc 1.1.2, CVE-2022-29162: an inheritable set lets a
    // program with file capabilities gain them across execve).
    if let Some(mut p) = spec.process().clone() {
        p.set_terminal(Some(true));
        if let Some(mut caps) = p.capabilities().clone() {
            caps.set_inheritable(None);
            p.set_capabilities(Some(caps));
        }
        spec.set_process(Some(p));
    }
    spec.set_hostname(Some("agentvm".to_string()));
    // As runc's: every device denied unless a rule allows it (oci-spec's
    // default has no rule at all, which allows every device).
    if !rootless {
        if let Some(mut linux) = spec.linux().clone() {
            let mut resources = linux.resources().clone().unwrap_or_default();
            let deny_all = oci_spec::runtime::LinuxDeviceCgroupBuilder::default()
                .allow(false)
                .access("rwm")
                .build()
                .context("build the deny-all device rule")?;
            resources.set_devices(Some(vec![deny_all]));
            linux.set_resources(Some(resources));
            spec.set_linux(Some(linux));
        }
    }
    Ok(spec)
}

pub fn run(args: &SpecArgs, rootless: Option<&str>) -> anyhow::Result<()> {
    let rootless = match rootless {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => anyhow::bail!("invalid --rootless value {other:?}: expected true or false"),
    };
    let path = args.bundle.join("config.json");
    if path.exists() {
        anyhow::bail!("file {} exists: remove it first", path.display());
    }
    let spec = default_spec(rootless)?;
    let mut text = serde_json::to_string_pretty(&spec)?;
    text.push('\n');
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
}
