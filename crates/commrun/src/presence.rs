//! commrun's part in torchrun's agent heartbeat: on every node but node 0 (whose rank 0 serves
//! the store), a thread attends the job's store from the start until this node's workers have
//! all joined (comm-core's `store::presence`). A node cut off in that window is no longer
//! invisible: the store ends the job for the other nodes, naming this one, and this node hears
//! that the store went silent and stops its workers, which have no connection of their own yet
//! to hear it by. Both within the heartbeat's bound (torchrun's 5 s × 3), not `--timeout`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use comm_core::heartbeat::Heartbeat;
use comm_core::spawn::SpawnPlan;
use comm_core::store::presence::{attend, Attended, NodeClaim};
use crossbeam_channel::Receiver;

/// How long the workers get to say it themselves, once the store went silent: those that had
/// joined are probed alike and end with their own, more exact error (what each was doing).
const OWN_WORDS: Duration = Duration::from_secs(2);

/// This node's presence at the store, while it lasts.
pub struct Presence {
    stop: Arc<AtomicBool>,
    /// Why to stop the workers, should the store go silent (spawn's `Extras::stop`).
    pub reasons: Receiver<String>,
}

impl Drop for Presence {
    fn drop(&mut self) {
        // The thread sees it within a quarter of a second; nobody needs to wait for that.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Starts attending the store for this node, on every node but node 0 of a job of several.
pub fn start(plan: &SpawnPlan) -> Option<Presence> {
    if plan.nnodes < 2 || plan.node_rank == 0 {
        return None;
    }
    let (send, reasons) = crossbeam_channel::bounded(1);
    let stop = Arc::new(AtomicBool::new(false));
    let endpoint = format!("{}:{}", plan.master_addr, plan.master_port);
    let first = plan.node_rank * plan.nproc_per_node;
    let (node, ranks) = (plan.node_rank, first..first + plan.nproc_per_node);
    let world_size = plan.nnodes * plan.nproc_per_node;
    let run_id = plan.run_id.clone();
    let stopped = stop.clone();
    let attending = move || {
        let claim = NodeClaim {
            node,
            ranks,
            world_size,
            run_id: run_id.as_deref(),
        };
        let why = match attend(&endpoint, &claim, Heartbeat::default(), &stopped) {
            Attended::StoreSilent(silence) => format!(
                "the rendezvous store at {endpoint} (node 0) went silent while this node's \
                 workers were starting: nothing heard from it for {silence:?}, not even an \
                 answer to the heartbeat (node 0 is down, or this node is cut off from it)"
            ),
            Attended::StoreClosed => format!(
                "the rendezvous store at {endpoint} (node 0) closed before this node's workers \
                 had all joined: rank 0 ended the job (node 0's output says why)"
            ),
            Attended::RanksJoined | Attended::Stopped | Attended::NotOurs => return,
        };
        std::thread::sleep(OWN_WORDS);
        let _ = send.send(why);
    };
    std::thread::Builder::new()
        .name("store-presence".into())
        .spawn(attending)
        .ok()?;
    Some(Presence { stop, reasons })
}
