//! This machine: its host name, and the addresses of its network interfaces (where a rank told
//! `GLOO_SOCKET_IFNAME` listens for its peers).

use crate::error::{CommError, Result};
use crate::topology::SOCKET_IFNAME_VAR;

/// The address of network interface `name` (its first IPv4 address, else its first IPv6 one):
/// where a rank told `GLOO_SOCKET_IFNAME=name` listens for its peers. An unknown name, or one
/// without an address, is an error listing the interfaces that have one.
pub fn interface_address(name: &str) -> Result<std::net::IpAddr> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut found: Vec<(String, IpAddr)> = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(CommError::io(
            "listing network interfaces",
            std::io::Error::last_os_error(),
        ));
    }
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: entry is a node of the list getifaddrs made, valid until freeifaddrs; its name
        // is a NUL-terminated string and its address, when not null, a sockaddr of its family.
        unsafe {
            let e = &*entry;
            let ifname = std::ffi::CStr::from_ptr(e.ifa_name)
                .to_string_lossy()
                .into_owned();
            let addr = e.ifa_addr;
            if !addr.is_null() {
                match (*addr).sa_family as libc::c_int {
                    libc::AF_INET => {
                        let v4 = &*(addr as *const libc::sockaddr_in);
                        let ip = Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
                        found.push((ifname, IpAddr::V4(ip)));
                    }
                    libc::AF_INET6 => {
                        let v6 = &*(addr as *const libc::sockaddr_in6);
                        found.push((ifname, IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr))));
                    }
                    _ => {}
                }
            }
            entry = e.ifa_next;
        }
    }
    // SAFETY: list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    let ours = |v4: bool| {
        found
            .iter()
            .find(|(n, ip)| n == name && ip.is_ipv4() == v4)
            .map(|(_, ip)| *ip)
    };
    ours(true).or_else(|| ours(false)).ok_or_else(|| {
        let mut names: Vec<&str> = Vec::new();
        for (n, _) in &found {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
        CommError::env(
            SOCKET_IFNAME_VAR,
            format!(
                "{SOCKET_IFNAME_VAR}={name}: this host has no interface of that name with an \
                 address (it has: {}); name one of them, or unset it to listen where the store \
                 is reached from",
                names.join(", ")
            ),
        )
    })
}

/// This machine's host name ("?" if the system will not say).
pub fn hostname() -> String {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most name.len() bytes into the buffer.
    if unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } != 0 {
        return "?".into();
    }
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gloo_socket_ifname_names_an_interface_with_an_address() {
        assert_eq!(
            interface_address("lo").unwrap(),
            std::net::IpAddr::from([127, 0, 0, 1])
        );
        let e = interface_address("nosuch0").unwrap_err().to_string();
        assert!(
            e.contains("GLOO_SOCKET_IFNAME=nosuch0") && e.contains("lo"),
            "{e}"
        );
    }
}
