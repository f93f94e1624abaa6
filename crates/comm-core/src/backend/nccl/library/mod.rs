//! Finding libnccl. cudarc loads NCCL by the name `libnccl.so`, which only NCCL's development
//! files provide; pip's `nvidia-nccl-cu12`/`-cu13` wheels and the runtime packages ship only
//! `libnccl.so.2`. When only that is found, we put a `libnccl.so` link to it in a private folder
//! and re-execute this program with that folder on LD_LIBRARY_PATH (the loader reads it only at
//! start), so the user need not do it by hand; whether to is [`super::relink`]'s decision.
//!
//! [`files`] finds and links; [`version`] reads the version string a library file carries. This
//! room asks nothing of the machine beyond its files and the loader: the probe and the relink
//! use it, never the other way round.

mod files;
mod version;

pub use files::{
    candidates, ensure_private_dir, find, given, link_folder, load_error, loadable, loaded_from,
    reexec_with, relinked, restart_with_link, INSTALL_HINT,
};
pub use version::{version_string, version_string_in};
