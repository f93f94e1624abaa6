//! Which GPU a rank uses, and the check that no two ranks of a host use the same one.
//!
//! Slurm binds GPUs in two common ways. With `--gres=gpu:4` every task of a node sees all four
//! GPUs, and the local rank picks one; with `--gpus-per-task=1` (or `--gpu-bind=single:1`) each
//! task sees only its own, as `cuda:0`. `local_rank % gpus` is right under both, so the choice
//! never refuses by counting ranks and GPUs: what NCCL cannot do is two ranks on one GPU, and
//! that is checked directly. Before NCCL's init the ranks exchange their GPU's PCI bus id (the
//! same whatever CUDA_VISIBLE_DEVICES renumbered) and host name through the store; two ranks of
//! one host with the same bus id get one error that names them, instead of NCCL's
//! `ncclInvalidUsage`.

use std::fmt;

use crate::error::{CommError, Result};
use crate::store::Scoped;

/// The GPU for a rank: `local_rank % gpus`, `gpus` being the GPUs this process sees. Every rank
/// sees all of the node's GPUs (`--gres=gpu:N`): the local rank picks its own. Every rank sees
/// one (`--gpus-per-task=1`, CUDA_VISIBLE_DEVICES set per rank): `cuda:0`, its own. Whether two
/// ranks end up on one GPU is [`check_one_gpu_per_rank`]'s question, not a count's.
pub fn device_for(local_rank: usize, gpus: usize) -> Result<usize> {
    if gpus == 0 {
        return Err(CommError::Backend("no GPU visible to this rank".into()));
    }
    Ok(local_rank % gpus)
}

/// Where one rank's GPU is: its host and the GPU's PCI bus id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSeat {
    /// The rank.
    pub rank: usize,
    /// Its host name.
    pub host: String,
    /// Its GPU's PCI bus id, `domain:bus:device.function` (`0000:1b:00.0`).
    pub bus_id: String,
}

/// Two ranks of one host on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedGpu {
    /// The lower rank.
    pub first: usize,
    /// The higher rank.
    pub second: usize,
    /// Their host.
    pub host: String,
    /// Their GPU's PCI bus id.
    pub bus_id: String,
}

impl fmt::Display for SharedGpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ranks {} and {} share one GPU on host {} (PCI bus id {}): NCCL needs one GPU per \
             rank. Start at most as many ranks per node as it has GPUs (-n, or \
             --ntasks-per-node), or give each rank its own GPU (srun --gpus-per-task=1, or a \
             different CUDA_VISIBLE_DEVICES per rank)",
            self.first, self.second, self.host, self.bus_id
        )
    }
}

/// The first pair of ranks (by the higher rank, then the lower) that share a host and a bus id.
/// Bus ids are compared without regard to case (CUDA writes hex digits in capitals, others not).
pub fn shared_gpu(seats: &[GpuSeat]) -> Option<SharedGpu> {
    let mut seen: std::collections::HashMap<(&str, String), usize> = Default::default();
    let mut seats: Vec<&GpuSeat> = seats.iter().collect();
    seats.sort_by_key(|s| s.rank);
    for seat in seats {
        let key = (seat.host.as_str(), seat.bus_id.to_ascii_lowercase());
        if let Some(&first) = seen.get(&key) {
            return Some(SharedGpu {
                first,
                second: seat.rank,
                host: seat.host.clone(),
                bus_id: seat.bus_id.to_ascii_lowercase(),
            });
        }
        seen.insert(key, seat.rank);
    }
    None
}

/// The PCI bus id of GPU `ordinal` (as this process numbers them), from the CUDA driver.
pub fn bus_id(ordinal: usize) -> Result<String> {
    use cudarc::driver::{result, sys};
    let read = || -> std::result::Result<String, cudarc::driver::DriverError> {
        result::init()?;
        let device = result::device::get(ordinal as i32)?;
        let mut text = [0 as std::ffi::c_char; 32];
        // SAFETY: the buffer is as long as we say; CUDA writes a NUL-terminated string into it.
        unsafe { sys::cuDeviceGetPCIBusId(text.as_mut_ptr(), text.len() as i32, device) }
            .result()?;
        // SAFETY: NUL-terminated by CUDA, and zeroed beforehand.
        let id = unsafe { std::ffi::CStr::from_ptr(text.as_ptr()) };
        Ok(id.to_string_lossy().to_ascii_lowercase())
    };
    super::errors::quietly(read)
        .map_err(|p| CommError::Backend(format!("CUDA did not load: {p}")))?
        .map_err(super::errors::cuda(&format!(
            "reading cuda:{ordinal}'s PCI bus id"
        )))
}

/// The store's text for a seat, `host\tbus id`, and back.
fn seat_value(host: &str, bus_id: &str) -> String {
    format!("{host}\t{bus_id}")
}

fn seat_from(rank: usize, value: &[u8]) -> GpuSeat {
    let value = String::from_utf8_lossy(value);
    let (host, bus_id) = value.split_once('\t').unwrap_or((&value, "?"));
    GpuSeat {
        rank,
        host: host.into(),
        bus_id: bus_id.into(),
    }
}

/// Every rank calls this with its GPU before NCCL's init, under the communicator's `name`: each
/// publishes its host and its GPU's bus id at `{name}/gpu/{rank}`, rank 0 reads them all and
/// publishes the verdict at `{name}/gpu/verdict` (empty, or the [`SharedGpu`] error), and every
/// rank returns it, so all fail alike. `world_size` store reads in all, not one per pair.
pub fn check_one_gpu_per_rank(
    scope: &Scoped,
    rank: usize,
    world_size: usize,
    ordinal: usize,
) -> Result<()> {
    if world_size < 2 {
        return Ok(());
    }
    exchange(
        scope,
        rank,
        world_size,
        &crate::host::hostname(),
        &bus_id(ordinal)?,
    )
}

/// [`check_one_gpu_per_rank`]'s exchange, given this rank's host and bus id.
fn exchange(
    scope: &Scoped,
    rank: usize,
    world_size: usize,
    host: &str,
    bus_id: &str,
) -> Result<()> {
    let gpus = scope.scoped("gpu");
    gpus.set_at("seat", rank, seat_value(host, bus_id).as_bytes())?;
    if rank == 0 {
        let values = gpus.get_at("seat", 0..world_size)?;
        let seats: Vec<_> = (0..).zip(values).map(|(r, v)| seat_from(r, &v)).collect();
        let verdict = shared_gpu(&seats).map_or(String::new(), |s| s.to_string());
        gpus.set("verdict", verdict.as_bytes())?;
    }
    let verdict = gpus.get("verdict")?;
    match verdict.is_empty() {
        true => Ok(()),
        false => Err(CommError::Backend(
            String::from_utf8_lossy(&verdict).into_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rank_per_gpu_under_every_binding() {
        // --gres=gpu:4, 4 tasks: each sees all four and takes its local rank's.
        assert_eq!(device_for(0, 4).unwrap(), 0);
        assert_eq!(device_for(3, 4).unwrap(), 3);
        // Fewer ranks than GPUs.
        assert_eq!(device_for(1, 4).unwrap(), 1);
        // --gpus-per-task=1 / --gpu-bind=single:1, 4 tasks: each sees one, its own, as cuda:0
        // (the old count check refused this: "4 ranks on this node but only 1 GPU").
        for local_rank in 0..4 {
            assert_eq!(device_for(local_rank, 1).unwrap(), 0);
        }
        // More ranks than GPUs is no longer refused here: the bus-id check names the pair.
        assert_eq!(device_for(2, 2).unwrap(), 0);
        let err = device_for(0, 0).unwrap_err().to_string();
        assert!(err.contains("no GPU visible"), "{err}");
    }

    fn seat(rank: usize, host: &str, bus_id: &str) -> GpuSeat {
        GpuSeat {
            rank,
            host: host.into(),
            bus_id: bus_id.into(),
        }
    }

    #[test]
    fn two_ranks_of_a_host_on_one_gpu_are_named() {
        // Two nodes, two GPUs each, one rank per GPU: the same bus ids on different hosts.
        let fine = [
            seat(0, "lrdn0001", "0000:1D:00.0"),
            seat(1, "lrdn0001", "0000:56:00.0"),
            seat(2, "lrdn0002", "0000:1D:00.0"),
            seat(3, "lrdn0002", "0000:56:00.0"),
        ];
        assert_eq!(shared_gpu(&fine), None);
        assert_eq!(shared_gpu(&[]), None);
        assert_eq!(shared_gpu(&fine[..1]), None);
        // Three ranks on a node of two GPUs (--gres=gpu:2): rank 2 took cuda:0 again.
        let crowded = [
            seat(2, "lrdn0001", "0000:1d:00.0"),
            seat(0, "lrdn0001", "0000:1D:00.0"),
            seat(1, "lrdn0001", "0000:56:00.0"),
        ];
        let shared = shared_gpu(&crowded).unwrap();
        assert_eq!(
            shared,
            SharedGpu {
                first: 0,
                second: 2,
                host: "lrdn0001".into(),
                bus_id: "0000:1d:00.0".into()
            }
        );
        let text = shared.to_string();
        for part in [
            "ranks 0 and 2 share one GPU on host lrdn0001 (PCI bus id 0000:1d:00.0)",
            "one GPU per rank",
            "--gpus-per-task=1",
            "CUDA_VISIBLE_DEVICES",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
    }

    #[test]
    fn seats_round_trip_through_the_store_text() {
        let value = seat_value("lrdn0001", "0000:1d:00.0");
        assert_eq!(
            seat_from(5, value.as_bytes()),
            seat(5, "lrdn0001", "0000:1d:00.0")
        );
    }

    #[test]
    fn the_exchange_names_the_shared_gpu_on_every_rank() {
        // The store exchange without a GPU: seats written as bus_id would write them.
        use crate::store::{Store, StoreServer};
        use std::time::Duration;
        let server = StoreServer::bind(0, 2).unwrap();
        let port = server.port();
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                std::thread::spawn(move || {
                    let store = Store::connect("127.0.0.1", port, rank, 2, Duration::from_secs(20))
                        .unwrap();
                    exchange(&store.scoped("comm7"), rank, 2, "box", "0000:01:00.0")
                })
            })
            .collect();
        for rank in ranks {
            let err = rank.join().unwrap().unwrap_err().to_string();
            assert!(
                err.contains("ranks 0 and 1 share one GPU on host box (PCI bus id 0000:01:00.0)"),
                "{err}"
            );
        }
    }
}
