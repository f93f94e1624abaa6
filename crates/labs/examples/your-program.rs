//! A program of your own, outside the labs: the few lines every one needs, and one step of a
//! ring made of two parts of one buffer.
//!
//!     cargo run -p labs --example your-program -- -n 3
//!
//! Each rank holds two cells: its own rank number, and room for the previous rank's. Cell 0
//! goes to the next rank while cell 1 receives from the previous one: two parts of one buffer,
//! sent and received where they lie.

use clap::Parser;
use comm_core::LaunchArgs;

#[derive(Parser)]
#[command(about = "Pass each rank's number one step around a ring, with send_recv on parts")]
struct Args {
    /// The flags every program shares: -n, --backend, --timeout, --steps, --trace, ...
    #[command(flatten)]
    launch: LaunchArgs,
}

// ANCHOR: main
fn main() -> std::process::ExitCode {
    let args = Args::parse();
    // Start the ranks (or be one of them). `&[]`: the program calls none of the library's
    // collectives, so `--algo`, which picks theirs, is refused at once.
    comm_core::run(&args.launch, &[], |comm| {
        let (rank, n) = (comm.rank(), comm.world_size());
        let mut buf = comm.buffer(&[rank as i32, -1])?;
        comm.print_grid("Before:", &buf)?;
        // Cell 0 to the next rank, cell 1 from the previous one, at once.
        let (mine, theirs) = buf.parts(0..1, 1..2)?;
        comm.send_recv(mine, (rank + 1) % n, theirs, (rank + n - 1) % n)?;
        comm.print_grid("After one step around the ring:", &buf)?;
        Ok(())
    })
}
// ANCHOR_END: main
