//! ferro-cni entry point: CNI_* environment + config on stdin -> result or error JSON on
//! stdout. Nothing else is ever written to stdout.

use std::io::{Read, Write};
use std::process::ExitCode;

use ferro_cni::commands::{self, CniEnv, Command};
use ferro_cni::config::{NetConf, CURRENT_VERSION};
use ferro_cni::CniError;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, index, name] = args.as_slice() {
        if flag == ferro_cni::dataplane::REAP_ARG {
            return reap(index, name);
        }
    }
    let mut version = CURRENT_VERSION.to_string();
    let outcome = invoke(&mut version);
    let (out, code) = match outcome {
        Ok(Some(v)) => (Some(v), ExitCode::SUCCESS),
        Ok(None) => (None, ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("ferro-cni: {}", e.details());
            (Some(e.to_json(&version)), ExitCode::FAILURE)
        }
    };
    if let Some(v) = out {
        let mut stdout = std::io::stdout().lock();
        if writeln!(stdout, "{v}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return ExitCode::FAILURE;
        }
    }
    code
}

/// `version` is set to the config's cniVersion as soon as it is known, so errors are
/// reported in the caller's version.
fn invoke(version: &mut String) -> Result<Option<serde_json::Value>, CniError> {
    let env = CniEnv::from_vars(|k| std::env::var(k).ok())?;
    if env.command == Command::Version {
        return Ok(Some(commands::version_info()));
    }
    let mut stdin = Vec::new();
    std::io::stdin()
        .read_to_end(&mut stdin)
        .map_err(|e| CniError::io("read network configuration from stdin", e))?;
    if let Some(v) = serde_json::from_slice::<serde_json::Value>(&stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
    {
        if ferro_cni::config::SUPPORTED_VERSIONS.contains(&v.as_str()) {
            *version = v;
        }
    }
    let conf = NetConf::parse(&stdin)?;
    commands::run_with(&env, &conf, || {
        ferro_cni::dataplane::Netlink::new(std::path::PathBuf::from("/proc/sys"))
    })
}

/// The detached child of a DEL: deletes the veth pair whose host end is `index`/`name`.
fn reap(index: &str, name: &str) -> ExitCode {
    let outcome = index
        .parse::<u32>()
        .map_err(|e| CniError::InvalidConfig(format!("link index {index:?}: {e}")))
        .and_then(|i| {
            ferro_cni::dataplane::Netlink::new(std::path::PathBuf::from("/proc/sys"))?
                .reap_link(i, name)
        });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferro-cni: {}", e.details());
            ExitCode::FAILURE
        }
    }
}
