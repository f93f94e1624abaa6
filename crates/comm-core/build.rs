//! The CPU backend stands on Linux's system calls (futex, process_vm_readv, prctl, /dev/shm).
//! Built for another OS, comm-core would fail with a page of unresolved names: stop first, here,
//! with one message that says what to do.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os != "linux" {
        eprintln!(
            "error: nccl-workshop builds on Linux only (x86-64 or arm64), not on {os}: its CPU \
             backend uses Linux's futex, process_vm_readv and /dev/shm.\n\
             On macOS or Windows, build and run it in a Linux VM, in WSL2, or in a container \
             with a large enough /dev/shm (docker run --shm-size=256m ...): see \
             docs/src/getting-started.md"
        );
        std::process::exit(1);
    }
}
