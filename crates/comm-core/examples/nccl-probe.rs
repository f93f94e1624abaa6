//! What this machine offers NCCL, step by step: the answer to "why did I get `backend: cpu`?".
//!
//!     cargo run -p comm-core --example nccl-probe
//!
//! The steps are the ones `--backend auto` takes: the CUDA driver, the GPUs it sees, libnccl
//! (pip's `libnccl.so.2` is linked as `libnccl.so` and the probe restarts itself at its start,
//! through `relink::link_at_start`, as every program does), and a unique Id, which needs NCCL
//! but no GPU: the address inside it is where rank 0 would wait for the others. For libnccl it
//! names the file loaded and the version string that file carries, which also names a fork
//! (NCCLX, say) that NCCL_LIBRARY points at.

use clap::Parser;
use comm_core::backend::nccl::{self, library, relink, Machine, ThisMachine};
use comm_core::backend::{select, BackendChoice};

#[derive(Parser)]
#[command(
    name = "nccl-probe",
    about = "Show, step by step, whether NCCL can run on this machine and why not",
    long_about = "Show, step by step, whether NCCL can run on this machine, and why not: the CUDA \
                  driver, the GPUs it sees, libnccl (pip's libnccl.so.2 is linked as libnccl.so \
                  if that is all there is) and an NCCL unique Id. The last line is what \
                  --backend auto would choose. It takes no options."
)]
struct Args {}

fn main() -> std::process::ExitCode {
    // --help answers before anything is probed (or the program restarts itself).
    Args::parse();
    // The variables the library's own search reads, read where comm-core reads them.
    let machine = ThisMachine(comm_core::topology::library_var);
    let row = |step: &str, finding: String| println!("{step:<14}{finding}");

    // libnccl first, before anything is printed: if only libnccl.so.2 is around, link it as
    // libnccl.so and restart with the link on LD_LIBRARY_PATH (the loader reads it at start).
    // The start every program makes (backend::prepare), but even without a CUDA driver: loading
    // libnccl and making a unique Id need none, and that is what the probe shows.
    if let Err(error) = relink::link_at_start(relink::When::Always) {
        eprintln!("nccl-probe: cannot link libnccl.so.2 and restart: {error}");
        return std::process::ExitCode::from(2);
    }

    let driver = machine.has_driver();
    row(
        "CUDA driver",
        if driver {
            "found"
        } else {
            "not found (neither libcuda.so nor libcuda.so.1 loads)"
        }
        .into(),
    );
    row(
        "GPUs",
        match (driver, machine.gpu_count()) {
            (false, _) => "- (needs the driver)".into(),
            (true, Ok(n)) => n.to_string(),
            (true, Err(reason)) => reason,
        },
    );
    let loaded = machine.nccl_loadable();
    row("libnccl", libnccl(&machine, loaded));
    if let Some(file) = loaded.then(library::loaded_from).flatten() {
        // The string NCCL writes into its library: the version, a fork's suffix, the CUDA.
        row(
            "version",
            library::version_string(&file)
                .unwrap_or_else(|| format!("no \"NCCL version\" string in {}", file.display())),
        );
    }
    if loaded {
        row(
            "unique Id",
            match nccl::new_unique_id() {
                Ok(id) => match nccl::bootstrap_address(&id) {
                    Some(at) => format!(
                        "{} bytes; rank 0 would wait for the others at {at} (NCCL_SOCKET_IFNAME picks the interface)",
                        id.len()
                    ),
                    None => format!("{} bytes (no socket address inside)", id.len()),
                },
                Err(e) => e.to_string(),
            },
        );
    }
    match select(BackendChoice::Auto) {
        Ok(selection) => row("--backend", format!("auto gives {selection}")),
        Err(e) => row("--backend", format!("auto fails: {e}")),
    }
    std::process::ExitCode::SUCCESS
}

/// The libnccl row: the version NCCL reports and the file it was loaded from, or why none loads.
fn libnccl(machine: &impl Machine, loaded: bool) -> String {
    match (loaded, machine.nccl_version()) {
        (true, Ok(version)) => format!(
            "NCCL {version} from {}{}",
            library::loaded_from().map_or("?".into(), |p| p.display().to_string()),
            if machine.relinked() {
                " (libnccl.so.2, linked as libnccl.so)"
            } else {
                ""
            }
        ),
        (true, Err(reason)) => reason,
        (false, _) if machine.relinked() => format!(
            "libnccl.so.2 was found and linked as libnccl.so but does not load: {}",
            machine.nccl_load_error()
        ),
        (false, _) => format!("not found; {}", library::INSTALL_HINT),
    }
}
