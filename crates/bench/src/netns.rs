//! Real network partitions: a replica in its own network namespace, joined to this one by a veth pair
//! (`ip` from iproute2, as root). Taking the host end down cuts the replica off at the link level: its TCP
//! connections to the API server and the cloud see nothing, exactly as on a partitioned network.

use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// What this harness's namespaces are called: `ccm-chaos-<pid>-<slot>`.
const PREFIX: &str = "ccm-chaos-";

/// One namespace and its link: the host end `10.231.<octet>.1`, the replica's `10.231.<octet>.2`.
pub(crate) struct Netns {
    name: String,
    host_link: String,
    /// The address the replica reaches this namespace (the servers) at.
    pub(crate) host_ip: String,
}

fn ip(args: &[&str]) -> Result<()> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("run ip (iproute2)")?;
    if !output.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

impl Netns {
    /// Whether namespaces can be made here (root, iproute2); tried once with a throw-away namespace.
    pub(crate) fn available() -> bool {
        let name = format!("ccm-probe-{}", std::process::id());
        ip(&["netns", "add", &name]).is_ok() && ip(&["netns", "del", &name]).is_ok()
    }

    /// `count` namespaces for this process, on subnets no link here uses. Namespaces of earlier runs
    /// whose process is gone (killed before its clean-up ran) are deleted first: their host ends would
    /// otherwise hold the routes to the same subnets, and this run's replicas could not reach anything.
    pub(crate) fn create_all(count: usize) -> Result<Vec<Netns>> {
        sweep_stale()?;
        let used = octets_in_use()?;
        let free: Vec<u8> = (0..=250).filter(|octet| !used.contains(octet)).collect();
        if free.len() < count {
            bail!(
                "network namespaces: only {} of the 10.231.0.0/16 subnets are free here, {count} wanted \
                 (see `ip -brief addr`)",
                free.len()
            );
        }
        free.into_iter()
            .take(count)
            .enumerate()
            .map(|(slot, octet)| Netns::create(slot, octet))
            .collect()
    }

    /// Namespace number `slot` of this process, on the subnet `10.231.<octet>.0/30`.
    fn create(slot: usize, octet: u8) -> Result<Netns> {
        let pid = std::process::id();
        let name = format!("{PREFIX}{pid}-{slot}");
        // Interface names have at most 15 bytes.
        let host_link = format!("cch{}s{slot}", pid % 10_000);
        let inner_link = format!("ccn{}s{slot}", pid % 10_000);
        let host_ip = format!("10.231.{octet}.1");
        ip(&["netns", "add", &name])?;
        let netns = Netns {
            name,
            host_link,
            host_ip,
        };
        ip(&[
            "link",
            "add",
            &netns.host_link,
            "type",
            "veth",
            "peer",
            "name",
            &inner_link,
        ])?;
        ip(&["link", "set", &inner_link, "netns", &netns.name])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/30", netns.host_ip),
            "dev",
            &netns.host_link,
        ])?;
        ip(&["link", "set", &netns.host_link, "up"])?;
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &netns.name, "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        inside(&["addr", "add", &format!("10.231.{octet}.2/30"), "dev", &inner_link])?;
        inside(&["link", "set", &inner_link, "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        // While the link is down, Linux holds what a socket sends in the neighbour's queue until address
        // resolution fails (3 probes, 1 s apart), and sends it when the link comes back, even after the
        // socket was reset and its process exited: a write can arrive 3 s after the fence closed. The
        // runs compress time (2 s leases for upstream's 15 s: 1 s between a lock's validity and the
        // earliest takeover, not 5 s), so the network's holding time is compressed too: 3 × 100 ms.
        let retrans = format!("net.ipv4.neigh.{inner_link}.retrans_time_ms=100");
        let solicit = format!("net.ipv4.neigh.{inner_link}.mcast_solicit=3");
        ip(&[
            "netns",
            "exec",
            &netns.name,
            "sysctl",
            "-q",
            "-w",
            &retrans,
            &solicit,
        ])?;
        Ok(netns)
    }

    /// The command prefix that runs a program inside.
    pub(crate) fn wrapper(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.name]
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    }

    /// Cuts the link (`true`) or restores it.
    pub(crate) fn cut(&self, cut: bool) -> Result<()> {
        ip(&["link", "set", &self.host_link, if cut { "down" } else { "up" }])
    }
}

/// Deletes the namespaces of runs whose process is gone (by the pid in the name: runs sharing
/// `/run/netns` must share a PID namespace too). Deleting one deletes its veth pair once no process is
/// left inside; a leftover replica keeps it, and its subnet is then avoided.
fn sweep_stale() -> Result<()> {
    let output = Command::new("ip")
        .args(["netns", "list"])
        .stdin(Stdio::null())
        .output()
        .context("run ip netns list")?;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        // `NAME` or `NAME (id: N)`.
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(owner) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if owner != std::process::id() && !std::path::Path::new(&format!("/proc/{owner}")).exists() {
            // Another run may be sweeping it too; the subnets in use are avoided either way.
            if let Err(error) = ip(&["netns", "del", name]) {
                eprintln!("chaos: could not delete the stale namespace {name}: {error:#}");
            }
        }
    }
    Ok(())
}

/// The third octets of the `10.231.0.0/16` addresses on this namespace's links.
fn octets_in_use() -> Result<Vec<u8>> {
    let output = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .stdin(Stdio::null())
        .output()
        .context("run ip addr show")?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .filter_map(|word| word.strip_prefix("10.231."))
        .filter_map(|rest| rest.split('.').next()?.parse().ok())
        .collect())
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the pair, and with it the host end.
        let _ = ip(&["netns", "del", &self.name]);
        let _ = ip(&["link", "del", &self.host_link]);
    }
}

/// How a replica gets the hostname the harness chose for it, and with it an identity known by
/// construction (`<hostname>_<uuid>`, upstream's scheme and ours): its own UTS namespace (`unshare` from
/// util-linux), as root or inside an unprivileged user namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Uts {
    Root,
    UserNamespace,
}

impl Uts {
    /// The way this machine allows, tried once.
    pub(crate) fn probe() -> Result<Uts> {
        for uts in [Uts::Root, Uts::UserNamespace] {
            let mut wrapper = uts.wrapper("ccm-probe");
            let program = wrapper.remove(0);
            let status = Command::new(program)
                .args(wrapper)
                .args([
                    "sh",
                    "-c",
                    "test \"$(cat /proc/sys/kernel/hostname)\" = ccm-probe",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if status.is_ok_and(|s| s.success()) {
                return Ok(uts);
            }
        }
        bail!(
            "cannot give a replica its own hostname: `unshare --uts` (util-linux) needs root or unprivileged \
             user namespaces"
        )
    }

    /// The command prefix that runs a program with `hostname`.
    pub(crate) fn wrapper(self, hostname: &str) -> Vec<String> {
        let mut wrapper = vec!["unshare".to_owned()];
        if self == Uts::UserNamespace {
            wrapper.push("--map-root-user".to_owned());
        }
        wrapper.extend(
            [
                "--uts",
                "--",
                "sh",
                "-c",
                r#"hostname "$0" && exec "$@""#,
                hostname,
            ]
            .iter()
            .map(|s| (*s).to_owned()),
        );
        wrapper
    }
}
