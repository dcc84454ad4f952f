//! The runtime options a CRI runtime handler gives its shim.
//!
//! containerd's CRI plugin decodes a handler's `options` table
//! (`[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.<handler>.options]`)
//! into `runtimeoptions.v1.Options` for every runtime type but runc's, and
//! hands it to the shim with each task's `Create`. Its `ConfigPath` is the
//! one field agentvm takes: the agentvm config file (`--config`) for the
//! handler's containers, which is how a handler picks a tier
//! (`isolation = "container"`) without the pods' annotations.
//!
//! The message is two strings, `type_url = 1` and `config_path = 2`; it is
//! decoded here by hand rather than generating code for one message.

use std::path::PathBuf;

use containerd_shim::protos::protobuf::well_known_types::any::Any;

/// The Any type of CRI's options for a runtime other than runc.
const RUNTIME_OPTIONS_TYPE: &str = "runtimeoptions.v1.Options";
/// Field number of `config_path`.
const CONFIG_PATH_FIELD: u64 = 2;

#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error("runtime options ({RUNTIME_OPTIONS_TYPE}) cannot be decoded: {0}")]
    Decode(&'static str),
    #[error("runtime option ConfigPath is not UTF-8")]
    NotUtf8,
}

/// The config file the handler's options name, if any. Options of another
/// type (none, or runc's given to this runtime by mistake) name none.
pub fn config_path(options: Option<&Any>) -> Result<Option<PathBuf>, OptionsError> {
    let Some(any) = options else {
        return Ok(None);
    };
    let type_name = any.type_url.rsplit('/').next().unwrap_or_default();
    if type_name != RUNTIME_OPTIONS_TYPE {
        if !any.type_url.is_empty() {
            log::warn!(
                "runtime options of type {:?} ignored: agentvm takes {RUNTIME_OPTIONS_TYPE}",
                any.type_url
            );
        }
        return Ok(None);
    }
    let mut path = None;
    let mut rest = any.value.as_slice();
    while !rest.is_empty() {
        let key = varint(&mut rest)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                varint(&mut rest)?;
            }
            1 => {
                rest = rest
                    .get(8..)
                    .ok_or(OptionsError::Decode("truncated field"))?
            }
            5 => {
                rest = rest
                    .get(4..)
                    .ok_or(OptionsError::Decode("truncated field"))?
            }
            2 => {
                let len = usize::try_from(varint(&mut rest)?)
                    .map_err(|_| OptionsError::Decode("length too large"))?;
                if len > rest.len() {
                    return Err(OptionsError::Decode("truncated field"));
                }
                let (bytes, tail) = rest.split_at(len);
                rest = tail;
                if field == CONFIG_PATH_FIELD {
                    let text = std::str::from_utf8(bytes).map_err(|_| OptionsError::NotUtf8)?;
                    path = Some(PathBuf::from(text));
                }
            }
            _ => return Err(OptionsError::Decode("unknown wire type")),
        }
    }
    Ok(path.filter(|p| !p.as_os_str().is_empty()))
}

/// One base-128 varint off the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> Result<u64, OptionsError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes
            .split_first()
            .ok_or(OptionsError::Decode("truncated varint"))?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(OptionsError::Decode("varint too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(type_url: &str, value: Vec<u8>) -> Any {
        Any {
            type_url: type_url.into(),
            value,
            ..Default::default()
        }
    }

    /// `type_url: "x"`, `config_path: "/etc/agentvm/container.toml"`.
    fn encoded() -> Vec<u8> {
        let path = b"/etc/agentvm/container.toml";
        let mut v = vec![0x0a, 1, b'x', 0x12, path.len() as u8];
        v.extend_from_slice(path);
        v
    }

    #[test]
    fn config_path_is_read_from_cri_options() {
        let o = any("runtimeoptions.v1.Options", encoded());
        assert_eq!(
            config_path(Some(&o)).expect("decoded"),
            Some(PathBuf::from("/etc/agentvm/container.toml"))
        );
        let o = any("type.googleapis.com/runtimeoptions.v1.Options", encoded());
        assert!(config_path(Some(&o)).expect("decoded").is_some());
    }

    #[test]
    fn no_options_or_other_types_name_no_file() {
        assert_eq!(config_path(None).expect("none"), None);
        let o = any("containerd.runc.v1.Options", encoded());
        assert_eq!(config_path(Some(&o)).expect("ignored"), None);
        let o = any("runtimeoptions.v1.Options", Vec::new());
        assert_eq!(config_path(Some(&o)).expect("empty"), None);
    }

    #[test]
    fn bad_encodings_are_errors() {
        let mut truncated = encoded();
        truncated.pop();
        let o = any("runtimeoptions.v1.Options", truncated);
        assert!(config_path(Some(&o)).is_err());
        let o = any("runtimeoptions.v1.Options", vec![0x12, 2, 0xff, 0xfe]);
        assert!(matches!(config_path(Some(&o)), Err(OptionsError::NotUtf8)));
        let o = any("runtimeoptions.v1.Options", vec![0x80; 11]);
        assert!(config_path(Some(&o)).is_err());
    }
}
