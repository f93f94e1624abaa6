//! The unique Id: the 128 bytes that name a new communicator and carry rank 0's bootstrap
//! address, as the rendezvous store moves them between ranks.

use cudarc::nccl::{result, sys};

use super::errors::{nccl, quietly};
use crate::error::{CommError, Result};

/// The unique Id as the bytes the store carries, and back.
pub fn id_to_bytes(id: &sys::ncclUniqueId) -> Vec<u8> {
    id.internal.iter().map(|&c| c as u8).collect()
}

/// The Id back from the store's bytes; anything but 128 bytes is a [`CommError::Peer`].
pub fn id_from_bytes(bytes: &[u8]) -> Result<sys::ncclUniqueId> {
    let internal: [u8; 128] = bytes.try_into().map_err(|_| {
        CommError::Peer(format!(
            "the NCCL unique Id in the store has {} bytes, not 128",
            bytes.len()
        ))
    })?;
    Ok(sys::ncclUniqueId {
        internal: internal.map(|b| b as std::ffi::c_char),
    })
}

/// A fresh unique Id from NCCL, as bytes. Needs libnccl but no GPU: rank 0 opens its bootstrap
/// socket here, and the Id carries that socket's address to the other ranks.
pub fn new_unique_id() -> Result<Vec<u8>> {
    let id = quietly(result::get_uniqueid)
        .map_err(|p| CommError::Backend(format!("libnccl did not load: {p}")))?
        .map_err(nccl("ncclGetUniqueId"))?;
    Ok(id_to_bytes(&id))
}

/// The address inside a unique Id: where rank 0's bootstrap root listens (NCCL's
/// `ncclBootstrapHandle`: an 8-byte magic, then a sockaddr). Every rank must reach it, which is
/// why NCCL_SOCKET_IFNAME matters on a cluster. `None` if the Id holds no IPv4/IPv6 address.
pub fn bootstrap_address(id: &[u8]) -> Option<std::net::SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
    let addr = id.get(8..36)?;
    let family = u16::from_ne_bytes([addr[0], addr[1]]);
    let port = u16::from_be_bytes([addr[2], addr[3]]);
    match family as i32 {
        libc::AF_INET => {
            let ip: [u8; 4] = addr[4..8].try_into().ok()?;
            Some(SocketAddr::from((Ipv4Addr::from(ip), port)))
        }
        libc::AF_INET6 => {
            let ip: [u8; 16] = addr[8..24].try_into().ok()?;
            Some(SocketAddr::from((Ipv6Addr::from(ip), port)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_bytes_round_trip() {
        let bytes: Vec<u8> = (0..128u32).map(|i| (i * 37 % 256) as u8).collect();
        let id = id_from_bytes(&bytes).unwrap();
        assert_eq!(id_to_bytes(&id), bytes);
        let err = id_from_bytes(&bytes[..100]).unwrap_err().to_string();
        assert!(err.contains("has 100 bytes, not 128"), "{err}");
    }

    #[test]
    fn the_bootstrap_address_is_read_from_the_id() {
        // The first bytes of an Id that NCCL 2.32 made on a host with address 192.0.2.2.
        let mut id = vec![0u8; 128];
        let head = [
            0xd4, 0x57, 0x9d, 0x3c, 0x3d, 0x65, 0xfe, 0xb9, 0x02, 0x00, 0xae, 0xfd, 192, 0, 2, 2,
        ];
        id[..16].copy_from_slice(&head);
        assert_eq!(
            bootstrap_address(&id),
            Some("192.0.2.2:44797".parse().unwrap())
        );
        let mut v6 = vec![0u8; 128];
        v6[8..10].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[10..12].copy_from_slice(&4242u16.to_be_bytes());
        v6[16..32].copy_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
        assert_eq!(bootstrap_address(&v6), Some("[::1]:4242".parse().unwrap()));
        assert_eq!(bootstrap_address(&[0u8; 128]), None);
        assert_eq!(bootstrap_address(&[2u8; 10]), None);
    }
}
