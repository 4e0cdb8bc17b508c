//! A hot standby: etc_batch's routines that write refuse to run there at once (25006),
//! naming the primary, instead of failing half-way at their first write; its views and
//! doctor() read what the standby has replayed and say it is a standby.

use crate::error::{BatchError, Result};
use pgrx::pg_sys;

/// Fails with 25006 when this server is in recovery: `routine` writes, and only the
/// primary can.
pub fn refuse_writes(routine: &str) -> Result<()> {
    // SAFETY: reads shared memory, callable in any backend at any time.
    if unsafe { pg_sys::RecoveryInProgress() } {
        return Err(BatchError::OnStandby {
            routine: routine.to_string(),
            primary: primary(),
        });
    }
    Ok(())
}

/// The primary's host and port, from this standby's primary_conninfo; never its user
/// or password.
fn primary() -> Option<String> {
    // SAFETY: a GUC read by name; the string is copied before anything else runs.
    let conninfo = unsafe {
        let value = pg_sys::GetConfigOption(c"primary_conninfo".as_ptr(), true, false);
        if value.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr(value)
            .to_string_lossy()
            .into_owned()
    };
    host_and_port(&conninfo)
}

/// "host H port P" from a libpq connection string, key = value pairs (values quoted or
/// not) or a postgresql:// URI; None when it names no host.
fn host_and_port(conninfo: &str) -> Option<String> {
    let (host, port) = if let Some(rest) = conninfo
        .strip_prefix("postgresql://")
        .or_else(|| conninfo.strip_prefix("postgres://"))
    {
        let authority = rest.split(['/', '?']).next().unwrap_or("");
        let hostport = authority.rsplit('@').next().unwrap_or("");
        match hostport.rsplit_once(':') {
            Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => {
                (Some(host.to_string()), Some(port.to_string()))
            }
            _ => (Some(hostport.to_string()), None),
        }
    } else {
        let pairs = key_values(conninfo);
        let find = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        (find("host").or_else(|| find("hostaddr")), find("port"))
    };
    let host = host.filter(|h| !h.is_empty())?;
    Some(match port.filter(|p| !p.is_empty()) {
        Some(port) => format!("host {host} port {port}"),
        None => format!("host {host}"),
    })
}

/// The key = value pairs of a connection string, as libpq reads them: whitespace around
/// '=' allowed, values in single quotes with backslash escapes.
fn key_values(conninfo: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut chars = conninfo.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let key: String =
            std::iter::from_fn(|| chars.next_if(|c| *c != '=' && !c.is_whitespace())).collect();
        if key.is_empty() {
            return pairs;
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return pairs;
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '\'' => break,
                    c => value.push(c),
                }
            }
        } else {
            value.extend(std::iter::from_fn(|| chars.next_if(|c| !c.is_whitespace())));
        }
        pairs.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_primary_is_named_by_host_and_port_only() {
        assert_eq!(
            host_and_port("user=postgres passfile='/var/lib/postgresql/.pgpass' channel_binding=prefer host=127.0.0.1 port=55480 sslmode=prefer").as_deref(),
            Some("host 127.0.0.1 port 55480")
        );
        assert_eq!(
            host_and_port("host = 'db one' password='se cr\\'et' port=5433").as_deref(),
            Some("host db one port 5433")
        );
        assert_eq!(
            host_and_port("hostaddr=10.1.2.3").as_deref(),
            Some("host 10.1.2.3")
        );
        assert_eq!(
            host_and_port("postgresql://rep:pw@primary.example:6432/postgres?sslmode=require")
                .as_deref(),
            Some("host primary.example port 6432")
        );
        assert_eq!(host_and_port("").as_deref(), None);
        assert_eq!(host_and_port("user=rep").as_deref(), None);
    }
}
