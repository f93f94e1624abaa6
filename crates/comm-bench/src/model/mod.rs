//! The models of comm-bench's analysis: why a measured curve bends, and what NCCL would choose.
//!
//! Hockney's latency–bandwidth (α–β) model fitted to a sweep through each algorithm's step
//! structure (`comm-bench model`, and the dashed curves of `comm-bench report`):
//!
//! - [`paths`]: each algorithm's critical path (steps, bytes moved, bytes reduced) and the
//!   buffers a cache must hold, from comm-core's collective table; which collectives have none
//! - [`fit`]: the model's terms (α, β, γ, a knee, a protocol switch) and the robust fit
//! - [`solver`]: non-negative weighted least squares, the fit's inner step
//! - [`series`]: result rows grouped into series and turned into points
//! - [`machine`]: this machine's caches and copy speed, to compare a fit with
//! - [`words`]: a fit as text, its sentences drawn from the fitted regimes
//! - [`command`]: `comm-bench model` itself
//!
//! Beside it, [`nccl`]: NCCL's own cost model (tuning.cc), which `comm-bench predict` prints
//! for a described cluster.

pub mod command;
pub mod fit;
pub mod machine;
pub mod nccl;
pub mod paths;
pub mod series;
pub mod solver;
pub mod words;
